"""Variant modules of kernel_sm90 side by side on the same inputs, each with
the shipped config's tile and the score/value schedule for bf16 (columns for
fp8). argv: variant names (scratch/<name>.py; 'cur' is the shipped module).
Correctness first, against the float32 reference."""
import dataclasses, importlib.util, sys, torch
import mla_verify.kernel as K
from mla_verify.testing import make_batch, make_pool, check_close
from mla_verify.timing import graph_time_us
from mla_verify import lookup
from mla_verify.config import hopper_config

def load(name):
    if name == "cur":
        return K.kernel_sm90
    spec = importlib.util.spec_from_file_location(name, f"scratch/{name}.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

cur = K.kernel_sm90
names = sys.argv[1:]
mods = {n: load(n) for n in names}
ok = {n: True for n in names}
FP8 = torch.float8_e4m3fn
cases = [(128, 4, [3000, 17, 0, 9000], {}), (16, 4, [5000, 64, 1], {}), (8, 2, [70000, 3], {}),
         (64, 8, [129, 4096], {}), (16, 3, [700, 2000], {"v_extend_from_k": True}),
         (32, 1, [100, 5], {"v_scale": 1.25}), (12, 5, [64, 0, 1, 200], {"k_scale": 0.5}),
         (128, 4, [3000, 17, 0, 9000], {"kv_dtype": FP8, "k_scale": 0.75, "v_scale": 1.25}),
         (16, 2, [5000, 64, 1], {"kv_dtype": FP8})]
for h, l, lens, kw in cases:
    b = make_batch(h, l, lens, device="cuda", **kw)
    ref = b.reference()
    for n in names:
        K.kernel_sm90 = mods[n]
        for kern in ("gluon_sm90", "gluon_sm90_sv"):
            for s in (1, 3):
                o = b.new_output()
                b.run(o, hopper_config(h, l, len(lens), kern).with_splits(s))
                try:
                    check_close(o, ref)
                except AssertionError as e:
                    ok[n] = False
                    print("FAIL", n, kern, h, l, lens, kw, "splits", s, str(e)[:200], flush=True)
        K.kernel_sm90 = cur
print("correct:", ok, flush=True)

pools = {"bf16": make_pool(6 << 20, torch.bfloat16, "cuda"), "fp8_e4m3": make_pool(6 << 20, FP8, "cuda")}
shapes = [("H128L4B32C16384", 128, 4, [16384] * 32), ("H64L4B32C16384", 64, 4, [16384] * 32),
          ("H128L2B32C16384", 128, 2, [16384] * 32), ("H16L4B64C16384", 16, 4, [16384] * 64),
          ("H16L4B32C16384", 16, 4, [16384] * 32), ("H8L2B64C65536", 8, 2, [65536] * 64),
          ("H128L4B64C2048", 128, 4, [2048] * 64), ("H128L4B1C65536", 128, 4, [65536]),
          ("H128L1B32C16384", 128, 1, [16384] * 32), ("H64L2B8C65536", 64, 2, [65536] * 8),
          ("H128L4B32C16384-fp8", 128, 4, [16384] * 32), ("H16L4B64C16384-fp8", 16, 4, [16384] * 64)]
good = [n for n in names if ok[n]]
print(f"{'shape':20s} {'cfg':14s}" + "".join(f"{n:>10s}" for n in good)
      + "".join(f" {n}/{good[0]}" for n in good[1:]), flush=True)
for sname, h, l, lens in shapes:
    dt = "fp8_e4m3" if sname.endswith("-fp8") else "bf16"
    pool = pools[dt]
    n_rot = max(1, min(4, (6 << 20) // sum(lens) // 2))
    cfg = lookup.block_config(h, l, len(lens), dt)
    bs = [make_batch(h, l, lens, device="cuda", pool=pool, seed=i, **({"kv_dtype": FP8} if dt != "bf16" else {}))
          for i in range(n_rot)]
    outs = [b.new_output() for b in bs]
    row = {}
    for rnd in range(3):
        for n in (good[rnd % len(good):] + good[: rnd % len(good)]):
            K.kernel_sm90 = mods[n]
            t = graph_time_us([lambda b=b, o=o: b.run(o, cfg) for b, o in zip(bs, outs)])
            row[n] = min(row.get(n, 1e30), t)
            K.kernel_sm90 = cur
    flops = 2 * h * l * sum(lens) * (576 + 512)
    print(f"{sname:20s} {f'bh{cfg.BLOCK_H} s{cfg.NUM_KV_SPLITS} {cfg.kernel[-2:]}':14s}"
          + "".join(f"{row[n]:10.1f}" for n in good)
          + "".join(f" {row[good[0]] / row[n]:8.3f}" for n in good[1:])
          + f"  best {flops / min(row.values()) / 1e6:.0f} TFLOP/s", flush=True)
