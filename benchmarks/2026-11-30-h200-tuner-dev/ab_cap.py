"""Share floors side by side: the tree at floors 4 and 2, and the cap
variant (at most about 4 sqrt(P) shares a request of P positions) at floor 2.
Each call checked against the float32 reference (output poisoned) first;
CUDA-graph replays, 5 interleaved rounds, best of each; ratios t4/x."""
import importlib
import statistics
import sys

import torch

sys.path.insert(0, "scratch/varpkg")
sys.path.insert(0, "scripts")
from bench import parse_shape, prefix_lengths  # noqa: E402
from mla_verify.testing import check_close, make_batch, make_pool  # noqa: E402
from mla_verify.timing import graph_time_us  # noqa: E402

tree = importlib.import_module("mla_verify")
cap = importlib.import_module("mla_verify_cap")


def run(pkg, b, o, floor):
    cfg = pkg.default_config(b.num_heads, b.draft_len, b.batch_size, "sm90", "bf16").with_min_share(floor)
    return pkg.verify_mla_fwd(b.q, b.k_extend, b.v_extend, o, b.k_buffer, b.v_buffer,
        b.qo_indptr, b.kv_indptr, b.kv_indices, None, True, None, b.draft_len,
        sm_scale=b.sm_scale, config=cfg)


CONTENDERS = {"t4": (tree, 4), "t2": (tree, 2), "c2": (cap, 2), "c4": (cap, 4)}
pool = make_pool(6 << 20, torch.bfloat16, "cuda")
print(f"{'shape':22s} " + " ".join(f"{m:>7s}" for m in CONTENDERS) + "   t4/t2   t4/c2   t4/c4", flush=True)
ratios = {m: [] for m in ("t2", "c2", "c4")}
for name in sys.argv[1:]:
    spec = parse_shape(name)
    lens = prefix_lengths(spec)
    n_rot = max(1, min(8, (6 << 20) // sum(lens) // 2))
    bs = [make_batch(spec.num_heads, spec.draft_len, lens, device="cuda", pool=pool, seed=i) for i in range(n_rot)]
    outs = [b.new_output() for b in bs]
    refs = [b.reference() for b in bs]
    t = {m: [] for m in CONTENDERS}
    names = list(CONTENDERS)
    for rnd in range(5):
        for m in (names if rnd % 2 == 0 else names[::-1]):
            pkg, floor = CONTENDERS[m]
            for b, o, r in zip(bs, outs, refs):
                o.fill_(float("nan")); run(pkg, b, o, floor); torch.cuda.synchronize()
                check_close(o, r, what=f"{name} {m}")
            t[m].append(graph_time_us([lambda b=b, o=o, pkg=pkg, floor=floor: run(pkg, b, o, floor) for b, o in zip(bs, outs)]))
    best = {m: min(v) for m, v in t.items()}
    for m in ratios:
        ratios[m].append(best["t4"] / best[m])
    print(f"{name:22s} " + " ".join(f"{best[m]:7.1f}" for m in CONTENDERS) + "  " + " ".join(f"{best['t4'] / best[m]:7.3f}" for m in ratios), flush=True)
print("geomean t4/x: " + ", ".join(f"{m} {statistics.geometric_mean(r):.3f}" for m, r in ratios.items()), flush=True)
