"""Stage 1 (Hopper kernel) time per ablation variant; outputs are not checked (the variants are wrong on purpose)."""
import importlib.util, torch
from mla_verify import lookup
from mla_verify.kernel import LOG2E, PLAN_BLOCK
from mla_verify.testing import make_batch, make_pool
from mla_verify.timing import graph_time_us
from mla_verify.workspace import get_workspace

names = ["base", "async_scores", "no_compute", "no_prefix_loads", "base"]
mods = {}
for n in set(names):
    spec = importlib.util.spec_from_file_location(f"v_{n}", f"scratch/ablate/v_{n}.py")
    mods[n] = importlib.util.module_from_spec(spec); spec.loader.exec_module(mods[n])
pool = make_pool(5 << 20, torch.bfloat16, "cuda")
shapes = [("H128L4B32C16384", 128, 4, [16384] * 32), ("H16L4B64C16384", 16, 4, [16384] * 64), ("H128L4B64C2048", 128, 4, [2048] * 64)]
ws = get_workspace(torch.device("cuda"))
ws.reserve(1 << 17)
print(f"{'shape':16s} " + " ".join(f"{n:>15s}" for n in names))
for sname, h, l, lens in shapes:
    n_rot = max(1, min(4, (5 << 20) // sum(lens) // 2))
    bs = [make_batch(h, l, lens, device="cuda", pool=pool, seed=i) for i in range(n_rot)]
    outs = [b.new_output() for b in bs]
    cfg = lookup.block_config(h, l, len(lens), "bf16")
    row = []
    for n in names:
        mod = mods[n]
        def s1(b, o, mod=mod):
            mod.launch_prefix(b.q, b.k_buffer, b.k_extend, b.v_extend, o, b.qo_indptr, b.kv_indptr,
                b.kv_indices, ws.part_o, ws.part_lse, batch_size=len(lens), draft_len=l, block_h=cfg.BLOCK_H,
                num_kv_splits=cfg.NUM_KV_SPLITS, score_scale=b.sm_scale * LOG2E, draft_scale=b.sm_scale * LOG2E,
                with_drafts=True, v_extend_from_k=False, plan_block=PLAN_BLOCK)
        row.append(graph_time_us([lambda b=b, o=o: s1(b, o) for b, o in zip(bs, outs)]))
    print(f"{sname:16s} " + " ".join(f"{t:15.1f}" for t in row), flush=True)

# The one variant that computes the same function: is it still right?
import mla_verify.kernel as K
from mla_verify.config import hopper_config
from mla_verify.testing import check_close
K.kernel_sm90 = mods["async_scores"]
b = make_batch(64, 4, [3000, 17, 0, 9000], device="cuda")
for s in (1, 3):
    o = b.new_output()
    b.run(o, hopper_config(64, 4, 4).with_splits(s))
    print("async_scores splits", s, "relative error", check_close(o, b.reference()))
