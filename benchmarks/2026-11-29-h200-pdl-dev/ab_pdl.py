"""dd6e421 (its table) vs this tree's variants with the same table, graph
timings interleaved in one run, each checked against the reference first:
  old    dd6e421
  q      queries copied a segment ahead (score/value), no dependent launch
  pdl    + stage 2 a dependent launch, stage 1 not triggering early
  all    + stage 1 triggers its dependents at its start (the commit)"""
import sys, statistics, faulthandler, torch
sys.path.insert(0, "scratch/oldpkg"); sys.path.insert(0, "scripts")
import mla_verify, mla_verify_old
from mla_verify import kernel, kernel_sm90
from mla_verify.testing import make_batch, make_pool, check_close
from mla_verify.timing import graph_time_us
from bench import parse_shape, prefix_lengths
FP8 = torch.float8_e4m3fn
real_dependent = kernel.dependent_launch
real_prefix = kernel_sm90.launch_prefix

def no_trigger(*a, **kw):
    return real_prefix(*a, **{**kw, "launch_dependents": False})

MODES = {
    "old": (mla_verify_old, None, None),
    "q": (mla_verify, lambda d: False, real_prefix),
    "pdl": (mla_verify, real_dependent, no_trigger),
    "all": (mla_verify, real_dependent, real_prefix),
}

def run(mode, b, o):
    pkg, dep, pre = MODES[mode]
    if dep is not None:
        kernel.dependent_launch = dep
        kernel_sm90.launch_prefix = pre
    return pkg.verify_mla_fwd(b.q, b.k_extend, b.v_extend, o, b.k_buffer, b.v_buffer,
        b.qo_indptr, b.kv_indptr, b.kv_indices, None, True, None, b.draft_len,
        k_scale=b.k_scale, v_scale=b.v_scale, sm_scale=b.sm_scale)

SHAPES = sys.argv[1:]
pools = {"bf16": make_pool(6 << 20, torch.bfloat16, "cuda"), "fp8": make_pool(6 << 20, FP8, "cuda")}
names = list(MODES)
print(f"{'shape':28s} " + " ".join(f"{m:>8s}" for m in names) + "   old/q old/pdl old/all", flush=True)
ratios = {m: [] for m in names[1:]}
for name in SHAPES:
    faulthandler.dump_traceback_later(150, exit=True)
    spec = parse_shape(name)
    lens = prefix_lengths(spec)
    fp8 = name.endswith("-fp8")
    kw = {"kv_dtype": FP8} if fp8 else {}
    n_rot = max(1, min(4, (6 << 20) // sum(lens) // 2))
    bs = [make_batch(spec.num_heads, spec.draft_len, lens, device="cuda", pool=pools["fp8" if fp8 else "bf16"], seed=i, **kw) for i in range(n_rot)]
    outs = [b.new_output() for b in bs]
    ref = bs[0].reference()
    t = {m: [] for m in names}
    for rnd in range(5):
        order = names if rnd % 2 == 0 else names[::-1]
        for m in order:
            outs[0].fill_(float("nan")); run(m, bs[0], outs[0]); torch.cuda.synchronize()
            check_close(outs[0], ref, what=f"{name} {m}")
            t[m].append(graph_time_us([lambda b=b, o=o, m=m: run(m, b, o) for b, o in zip(bs, outs)]))
    best = {m: min(v) for m, v in t.items()}
    for m in names[1:]:
        ratios[m].append(best["old"] / best[m])
    print(f"{name:28s} " + " ".join(f"{best[m]:8.1f}" for m in names)
          + "   " + " ".join(f"{best['old'] / best[m]:6.3f}" for m in names[1:]), flush=True)
    faulthandler.cancel_dump_traceback_later()
print("geomean old/mode: " + ", ".join(f"{m} {statistics.geometric_mean(r):.3f}" for m, r in ratios.items())
      + f" over {len(SHAPES)} shapes", flush=True)
