"""Stage 1 A/B: the v4 Hopper kernel (two cooperating warpgroups) vs the new
one (score warpgroup + value warpgroup), same inputs, same configs; then the
new kernel end to end against the reference."""
import importlib.util, sys, torch
from mla_verify import lookup
import mla_verify.kernel as K
from mla_verify.kernel import LOG2E, PLAN_BLOCK
from mla_verify.testing import make_batch, make_pool, check_close
from mla_verify.timing import graph_time_us
from mla_verify.workspace import get_workspace
from mla_verify.config import hopper_config

spec = importlib.util.spec_from_file_location("v4", "scratch/kernel_sm90_v4.py")
v4 = importlib.util.module_from_spec(spec); spec.loader.exec_module(v4)
mods = {"v4": v4, "v5": K.kernel_sm90}
names = ["v4", "v5", "v4", "v5"]

# correctness first
for h, l, lens in [(128, 4, [3000, 17, 0, 9000]), (16, 4, [5000, 64, 1]), (8, 2, [70000, 3]), (64, 8, [129, 4096])]:
    b = make_batch(h, l, lens, device="cuda")
    for s in (1, 3):
        for vfk in (False,):
            o = b.new_output(); o.fill_(float("nan"))
            b.run(o, hopper_config(h, l, len(lens)).with_splits(s))
            try:
                print("check", h, l, lens, "splits", s, "rel err", check_close(o, b.reference()), flush=True)
            except AssertionError as e:
                print("FAIL", h, l, lens, "splits", s, str(e)[:300], flush=True)

pool = make_pool(5 << 20, torch.bfloat16, "cuda")
shapes = [("H128L4B32C16384", 128, 4, [16384] * 32), ("H64L4B32C16384", 64, 4, [16384] * 32),
          ("H128L2B32C16384", 128, 2, [16384] * 32), ("H16L4B64C16384", 16, 4, [16384] * 64),
          ("H16L4B32C16384", 16, 4, [16384] * 32),
          ("H128L4B64C2048", 128, 4, [2048] * 64), ("H128L4B1C65536", 128, 4, [65536]),
          ("H8L2B64C65536", 8, 2, [65536] * 64)]
ws = get_workspace(torch.device("cuda"))
ws.reserve(1 << 17)
print(f"{'shape':16s} {'cfg':28s} " + " ".join(f"{n:>9s}" for n in names), "  v4/v5  TFLOP/s(v5)")
for sname, h, l, lens in shapes:
    n_rot = max(1, min(4, (5 << 20) // sum(lens) // 2))
    bs = [make_batch(h, l, lens, device="cuda", pool=pool, seed=i) for i in range(n_rot)]
    outs = [b.new_output() for b in bs]
    cfg = lookup.block_config(h, l, len(lens), "bf16")
    if cfg.kernel != "gluon_sm90":
        cfg = hopper_config(h, l, len(lens))
    row = []
    for n in names:
        mod = mods[n]
        def s1(b, o, mod=mod):
            mod.launch_prefix(b.q, b.k_buffer, b.k_extend, b.v_extend, o, b.qo_indptr, b.kv_indptr,
                b.kv_indices, ws.part_o, ws.part_lse, batch_size=len(lens), draft_len=l, block_h=cfg.BLOCK_H,
                num_kv_splits=cfg.NUM_KV_SPLITS, score_scale=b.sm_scale * LOG2E, draft_scale=b.sm_scale * LOG2E,
                with_drafts=True, v_extend_from_k=False, plan_block=PLAN_BLOCK)
        row.append(graph_time_us([lambda b=b, o=o: s1(b, o) for b, o in zip(bs, outs)]))
    flops = 2 * h * l * sum(lens) * 1088
    t4, t5 = min(row[0], row[2]), min(row[1], row[3])
    print(f"{sname:16s} {f'bh{cfg.BLOCK_H} s{cfg.NUM_KV_SPLITS}':28s} " + " ".join(f"{t:9.1f}" for t in row),
          f"  {t4 / t5:5.3f}  {flops / t5 / 1e6:6.0f}", flush=True)
