"""Where the fp8 Hopper kernel's extra time per tile goes: variants that
remove one piece of the widening (wrong results; timing only)."""
import importlib.util, torch
import mla_verify.kernel as K
from mla_verify.testing import make_batch, make_pool
from mla_verify.timing import graph_time_us
from mla_verify.config import hopper_config

mods = {"full": K.kernel_sm90}
for f in ("abl_noconv", "abl_norope", "abl_nowiden", "abl_nothing"):
    spec = importlib.util.spec_from_file_location(f, f"scratch/{f}.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); mods[f] = m
full = K.kernel_sm90
FP8 = torch.float8_e4m3fn
pools = {FP8: make_pool(6 << 20, FP8, "cuda"), torch.bfloat16: make_pool(6 << 20, torch.bfloat16, "cuda")}
shapes = [("H128L4B32C16384", 128, 4, [16384] * 32, 1), ("H8L2B64C65536", 8, 2, [65536] * 64, 3),
          ("H16L4B64C16384", 16, 4, [16384] * 64, 3)]
names = list(mods) + ["bf16"]
print(f"{'shape':16s}" + "".join(f"{n:>12s}" for n in names), flush=True)
for sname, h, l, lens, s in shapes:
    n_rot = max(1, min(4, (6 << 20) // sum(lens) // 2))
    cfg = hopper_config(h, l, len(lens)).with_splits(s)
    row = {}
    for rnd in range(2):
        for n in names:
            dt = torch.bfloat16 if n == "bf16" else FP8
            bs = [make_batch(h, l, lens, device="cuda", pool=pools[dt], seed=i) for i in range(n_rot)]
            outs = [b.new_output() for b in bs]
            K.kernel_sm90 = mods.get(n, full)
            t = graph_time_us([lambda b=b, o=o: b.run(o, cfg) for b, o in zip(bs, outs)])
            row[n] = min(row.get(n, 1e30), t)
            K.kernel_sm90 = full
    print(f"{sname:16s}" + "".join(f"{row[n]:12.1f}" for n in names), flush=True)
