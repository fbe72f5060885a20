"""fp8 KV on the Hopper kernel: correctness, then timing side by side
(same inputs): fp8 Hopper (integer widening) / fp8 Hopper (cvt widening) /
fp8 Triton kernel (the shipped table's fp8 config) / bf16 Hopper (this
tree) / bf16 Hopper at HEAD (package copy)."""
import importlib.util, sys, torch
sys.path.insert(0, "scratch/headpkg")
import mla_verify_head.api as head_api
from mla_verify import lookup
import mla_verify.kernel as K
from mla_verify.testing import make_batch, make_pool, check_close
from mla_verify.timing import graph_time_us
from mla_verify.workspace import get_workspace
from mla_verify.config import hopper_config

spec = importlib.util.spec_from_file_location("asm1", "scratch/kernel_sm90_asm1.py")
cvt = importlib.util.module_from_spec(spec); spec.loader.exec_module(cvt)
asm = K.kernel_sm90
FP8 = torch.float8_e4m3fn

for h, l, lens in [(128, 4, [3000, 17, 0, 9000]), (16, 4, [5000, 64, 1]), (8, 2, [70000, 3])]:
    b = make_batch(h, l, lens, device="cuda", kv_dtype=FP8, k_scale=0.75, v_scale=1.25)
    ref = b.reference()
    for name, mod in (("asm", asm), ("asm1", cvt)):
        K.kernel_sm90 = mod
        for s in (1, 3):
            o = b.new_output()
            b.run(o, hopper_config(h, l, len(lens)).with_splits(s))
            try:
                print("check", name, h, l, lens, "splits", s, "rel err %.2e" % check_close(o, ref), flush=True)
            except AssertionError as e:
                print("FAIL", name, h, l, lens, "splits", s, str(e)[:300], flush=True)
K.kernel_sm90 = asm

def head_run(b, o, cfg):
    head_api.verify_mla_fwd(b.q, b.k_extend, b.v_extend, o, b.k_buffer, b.v_buffer, b.qo_indptr,
        b.kv_indptr, b.kv_indices, None, True, None, b.draft_len, k_scale=b.k_scale,
        v_scale=b.v_scale, sm_scale=b.sm_scale, config=cfg)

pools = {FP8: make_pool(6 << 20, FP8, "cuda"), torch.bfloat16: make_pool(6 << 20, torch.bfloat16, "cuda")}
shapes = [("H8L2B64C65536", 8, 2, [65536] * 64), ("H16L4B64C16384", 16, 4, [16384] * 64),
          ("H16L4B1C16384", 16, 4, [16384]), ("H64L4B32C16384", 64, 4, [16384] * 32),
          ("H128L4B32C16384", 128, 4, [16384] * 32), ("H128L4B64C2048", 128, 4, [2048] * 64),
          ("H128L2B8C16384", 128, 2, [16384] * 8), ("H16L2B32C4096", 16, 2, [4096] * 32)]
names = ["fp8_asm", "fp8_asm1", "fp8_triton", "bf16_new"]
print(f"{'shape':16s} {'hopper cfg':10s} {'fp8 tbl cfg':24s}" + "".join(f"{n:>11s}" for n in names),
      " asm/tri asm/bf16 asm1/asm", flush=True)
for sname, h, l, lens in shapes:
    n_rot = max(1, min(4, (6 << 20) // sum(lens) // 2))
    cfg = hopper_config(h, l, len(lens))
    tuned_bf16 = lookup.block_config(h, l, len(lens), "bf16")
    if tuned_bf16.kernel == "gluon_sm90":
        cfg = tuned_bf16  # the shipped bf16 split choice
    tri = lookup.block_config(h, l, len(lens), "fp8_e4m3")
    row = {}
    for rnd in range(2):
        for n in names:
            dt = torch.bfloat16 if n.startswith("bf16") else FP8
            bs = [make_batch(h, l, lens, device="cuda", pool=pools[dt], seed=i,
                             k_scale=0.75 if dt == FP8 else 1.0, v_scale=1.25 if dt == FP8 else 1.0)
                  for i in range(n_rot)]
            outs = [b.new_output() for b in bs]
            K.kernel_sm90 = cvt if n == "fp8_asm1" else asm
            c = tri if n == "fp8_triton" else cfg
            if n == "bf16_head":
                calls = [lambda b=b, o=o: head_run(b, o, c) for b, o in zip(bs, outs)]
            else:
                calls = [lambda b=b, o=o: b.run(o, c) for b, o in zip(bs, outs)]
            t = graph_time_us(calls)
            row[n] = min(row.get(n, 1e30), t)
            K.kernel_sm90 = asm
    print(f"{sname:16s} {f'bh{cfg.BLOCK_H} s{cfg.NUM_KV_SPLITS}':10s} {f'{tri.kernel[:6]} bh{tri.BLOCK_H} n{tri.BLOCK_N} s{tri.NUM_KV_SPLITS} w{tri.num_warps}':24s}"
          + "".join(f"{row[n]:11.1f}" for n in names)
          + f"  {row['fp8_triton'] / row['fp8_asm']:6.2f} {row['fp8_asm'] / row['bf16_new']:6.2f} {row['fp8_asm1'] / row['fp8_asm']:6.3f}", flush=True)
