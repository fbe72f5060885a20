"""One shape's stage 1, launched three times (ncu profiles the third): the
shipped Hopper kernel or a variant module given as argv[1]."""
import importlib.util, sys, torch
from mla_verify import lookup
from mla_verify.kernel import LOG2E, PLAN_BLOCK, kernel_sm90
from mla_verify.testing import make_batch
from mla_verify.workspace import get_workspace

mod = kernel_sm90
if len(sys.argv) > 1:
    spec = importlib.util.spec_from_file_location("variant", sys.argv[1])
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
h, l, lens = 128, 4, [16384] * 32
b = make_batch(h, l, lens, device="cuda")
o = b.new_output()
cfg = lookup.block_config(h, l, len(lens), "bf16")
ws = get_workspace(torch.device("cuda")); ws.reserve(1 << 17)
for _ in range(3):
    mod.launch_prefix(b.q, b.k_buffer, b.k_extend, b.v_extend, o, b.qo_indptr, b.kv_indptr,
        b.kv_indices, ws.part_o, ws.part_lse, batch_size=len(lens), draft_len=l, block_h=cfg.BLOCK_H,
        num_kv_splits=cfg.NUM_KV_SPLITS, score_scale=b.sm_scale * LOG2E, draft_scale=b.sm_scale * LOG2E,
        with_drafts=True, v_extend_from_k=False, plan_block=PLAN_BLOCK)
torch.cuda.synchronize()
print("ran", cfg)
