"""Where the time goes now: the Hopper stage 1 alone (drafts folded in) vs the whole call (shipped table)."""
import math, torch
from mla_verify import kernel, lookup
from mla_verify.kernel import LOG2E, PLAN_BLOCK
from mla_verify.testing import make_batch, make_pool
from mla_verify.timing import graph_time_us
from mla_verify.workspace import get_workspace

pool = make_pool(5 << 20, torch.bfloat16, "cuda")
torch.manual_seed(0)
logn = [max(1, int(x)) for x in torch.distributions.LogNormal(math.log(16384) - 0.5, 1.0).sample((32,)).tolist()]
shapes = [("H128L4B64C2048", 128, 4, [2048] * 64), ("H16L4B64Rlong", 16, 4, [65536] + [512] * 63),
          ("H16L4B32Rlogn", 16, 4, logn), ("H64L4B32C16384", 64, 4, [16384] * 32),
          ("H16L4B64C16384", 16, 4, [16384] * 64), ("H128L4B1C65536", 128, 4, [65536]),
          ("H8L2B64C65536", 8, 2, [65536] * 64)]
print(f"{'shape':18s} {'total':>8s} {'stage1':>8s} {'stage2':>8s}  config")
for name, h, l, lens in shapes:
    n_rot = max(1, min(4, (5 << 20) // sum(lens) // 2))
    bs = [make_batch(h, l, lens, device="cuda", pool=pool, seed=i) for i in range(n_rot)]
    outs = [b.new_output() for b in bs]
    cfg = lookup.block_config(h, l, len(lens), "bf16")
    total = graph_time_us([lambda b=b, o=o: b.run(o, cfg) for b, o in zip(bs, outs)])
    ws = get_workspace(torch.device("cuda"))
    def s1(b, o):
        kernel.kernel_sm90.launch_prefix(b.q, b.k_buffer, b.k_extend, b.v_extend, o, b.qo_indptr, b.kv_indptr,
            b.kv_indices, ws.part_o, ws.part_lse, batch_size=len(lens), draft_len=l, block_h=cfg.BLOCK_H,
            num_kv_splits=cfg.NUM_KV_SPLITS, score_scale=b.sm_scale * LOG2E, draft_scale=b.sm_scale * LOG2E,
            with_drafts=True, v_extend_from_k=False, plan_block=PLAN_BLOCK)
    stage1 = graph_time_us([lambda b=b, o=o: s1(b, o) for b, o in zip(bs, outs)]) if cfg.kernel == "gluon_sm90" else float("nan")
    print(f"{name:18s} {total:8.1f} {stage1:8.1f} {total - stage1:8.1f}  {cfg.to_dict()}", flush=True)
