"""Run 13 (2026-11-30): all with a8bec94's table: a8bec94 (old), a8bec94 + the score warpgroup's 16-byte stores (w3), 3e3ddef's kernel (newT = w3 + the drafts' weight in the plan).
Run 12 (2026-11-30): a8bec94 with its table (old) vs 3e3ddef with its table (new) and 3e3ddef's kernel with a8bec94's table (newT): the table's part and the kernel's part of a change.
Earlier: the tree (b2f5dc8, kernel of a8bec94) vs variants with the same table,
graph timings interleaved in one run, each checked against the reference
(output poisoned) first: l = the queries' three loads issued before their
three shared-memory stores; s = the score warpgroup's whole outputs through
the spent query buffer; sl = both. (Run 9: w = the score/value schedule's
output stores as 16 bytes a thread, after a layout conversion.)"""
import sys, statistics, faulthandler, torch
sys.path.insert(0, "scratch/oldpkg"); sys.path.insert(0, "scratch/varpkg"); sys.path.insert(0, "scripts")
import mla_verify, mla_verify_old, mla_verify_w3, mla_verify_newt
from mla_verify.testing import make_batch, make_pool, check_close
from mla_verify.timing import graph_time_us
from bench import parse_shape, prefix_lengths
FP8 = torch.float8_e4m3fn
PKGS = {"old": mla_verify_old, "w3": mla_verify_w3, "newT": mla_verify_newt}

def run(pkg, b, o):
    return pkg.verify_mla_fwd(b.q, b.k_extend, b.v_extend, o, b.k_buffer, b.v_buffer,
        b.qo_indptr, b.kv_indptr, b.kv_indices, None, True, None, b.draft_len,
        k_scale=b.k_scale, v_scale=b.v_scale, sm_scale=b.sm_scale)

pools = {"bf16": make_pool(6 << 20, torch.bfloat16, "cuda"), "fp8": make_pool(6 << 20, FP8, "cuda")}
names = list(PKGS)
print(f"{'shape':28s} " + " ".join(f"{m:>8s}" for m in names) + "  " + " ".join(f"old/{m:>4s}" for m in names[1:]), flush=True)
ratios = {m: [] for m in names[1:]}
for name in sys.argv[1:]:
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
        ratios[m].append(best["old"] / best[m])
    print(f"{name:28s} " + " ".join(f"{best[m]:8.1f}" for m in names) + "  " + " ".join(f"{best['old'] / best[m]:8.3f}" for m in names[1:]), flush=True)
    faulthandler.cancel_dump_traceback_later()
print("geomean old/variant: " + ", ".join(f"{m} {statistics.geometric_mean(r):.3f}" for m, r in ratios.items()), flush=True)
