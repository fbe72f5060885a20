"""Packages side by side, graph timings interleaved in one run, each call
checked against the float32 reference (output poisoned) first.

Usage (repository root, with scratch/oldpkg and scratch/varpkg holding the
packages; see README.md):
    python ab.py old=mla_verify_old,v=mla_verify_v SHAPE [SHAPE ...]
The first package is the baseline; the columns old/<v> are its best time
over each variant's (> 1: the variant is faster)."""
import faulthandler
import importlib
import statistics
import sys

import torch

sys.path.insert(0, "scratch/oldpkg")
sys.path.insert(0, "scratch/varpkg")
sys.path.insert(0, "scripts")
from bench import parse_shape, prefix_lengths  # noqa: E402
from mla_verify.testing import check_close, make_batch, make_pool  # noqa: E402
from mla_verify.timing import graph_time_us  # noqa: E402

FP8 = torch.float8_e4m3fn
PKGS = {
    name: importlib.import_module(module)
    for name, module in (pair.split("=") for pair in sys.argv[1].split(","))
}


def run(pkg, b, o):
    return pkg.verify_mla_fwd(b.q, b.k_extend, b.v_extend, o, b.k_buffer, b.v_buffer,
        b.qo_indptr, b.kv_indptr, b.kv_indices, None, True, None, b.draft_len,
        k_scale=b.k_scale, v_scale=b.v_scale, sm_scale=b.sm_scale)


pools = {"bf16": make_pool(6 << 20, torch.bfloat16, "cuda"), "fp8": make_pool(6 << 20, FP8, "cuda")}
names = list(PKGS)
base = names[0]
print(f"{'shape':28s} " + " ".join(f"{m:>8s}" for m in names) + "  " + " ".join(f"{base}/{m:>4s}" for m in names[1:]), flush=True)
ratios = {m: [] for m in names[1:]}
for name in sys.argv[2:]:
    faulthandler.dump_traceback_later(150, exit=True)
    spec = parse_shape(name)
    lens = prefix_lengths(spec)
    fp8 = name.endswith("-fp8")
    kw = {"kv_dtype": FP8} if fp8 else {}
    n_rot = max(1, min(4, (6 << 20) // sum(lens) // 2))
    bs = [make_batch(spec.num_heads, spec.draft_len, lens, device="cuda", pool=pools["fp8" if fp8 else "bf16"], seed=i, **kw) for i in range(n_rot)]
    outs = [b.new_output() for b in bs]
    refs = [b.reference() for b in bs]
    t = {m: [] for m in PKGS}
    for rnd in range(5):
        for m in (names if rnd % 2 == 0 else names[::-1]):
            for b, o, r in zip(bs, outs, refs):
                o.fill_(float("nan")); run(PKGS[m], b, o); torch.cuda.synchronize()
                check_close(o, r, what=f"{name} {m}")
            t[m].append(graph_time_us([lambda b=b, o=o, m=m: run(PKGS[m], b, o) for b, o in zip(bs, outs)]))
    best = {m: min(v) for m, v in t.items()}
    for m in names[1:]:
        ratios[m].append(best[base] / best[m])
    print(f"{name:28s} " + " ".join(f"{best[m]:8.1f}" for m in names) + "  " + " ".join(f"{best[base] / best[m]:8.3f}" for m in names[1:]), flush=True)
    faulthandler.cancel_dump_traceback_later()
print(f"geomean {base}/variant: " + ", ".join(f"{m} {statistics.geometric_mean(r):.3f}" for m, r in ratios.items()), flush=True)
