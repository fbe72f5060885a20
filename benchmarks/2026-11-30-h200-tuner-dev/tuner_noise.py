"""How the tuner's timings move when nothing changes: per bucket, the
default config and the same config with other share floors (which, at
batch >= 64, leave the plan unchanged) timed in the order
D F G G F D D F G G F D on the tuner's own problems; per context, each
sample (us) and each config's spread."""
import math
import sys

import torch

from mla_verify import tune
from mla_verify.config import default_config
from mla_verify.testing import check_close, make_pool

BUCKETS = [tuple(int(x) for x in b.split(",")) for b in sys.argv[1:]] or [
    (8, 1, 256), (8, 2, 128), (64, 4, 64), (16, 1, 8), (8, 2, 8), (128, 1, 8)]
pool = make_pool(max(256 * 4096, tune.L2_DEFEAT_BYTES // 576) * 2, torch.bfloat16, "cuda")
for heads, draft_len, bs in BUCKETS:
    ctx = tune.contexts_for(bs, tune.DEFAULT_CONTEXTS)
    problems = tune.Problems(pool, heads, draft_len, bs, ctx, "cuda")
    d = default_config(heads, draft_len, bs, "sm90", "bf16")
    cfgs = {"D": d, "F": d.with_min_share(8), "G": d.with_min_share(2)}
    for batches, ref in zip(problems.sets, problems.references):
        for c in cfgs.values():
            out = batches[0].new_output()
            batches[0].run(out, c)
            check_close(out, ref, what=str(c))
    samples = {k: [[] for _ in ctx] for k in cfgs}
    for k in "DFGGFDDFGGFD":
        for i, batches in enumerate(problems.sets):
            samples[k][i].append(tune.graph_timer(cfgs[k], batches))
    print(f"H{heads} L{draft_len} B{bs} contexts {ctx} copies {[len(s) for s in problems.sets]}")
    for k, per in samples.items():
        for c, s in zip(ctx, per):
            print(f"  {k} ctx {c:6d}: " + " ".join(f"{x:7.1f}" for x in s)
                  + f"   min {min(s):7.1f} max/min {max(s) / min(s):.3f}")
    geo = {k: math.exp(sum(math.log(min(s)) for s in per) / len(per)) for k, per in samples.items()}
    print("  best-of geomeans: " + ", ".join(f"{k} {v:.1f}" for k, v in geo.items()), flush=True)
    del problems
    torch.cuda.empty_cache()
