"""PROBE (reverted with its kernel change): clock64 stamps of score/value's
steady-state tiles (prefix tiles 8-15 of each CTA's first segment), per
step, in SM cycles, for token-indexed (``tuned``) and paged (``-page<N>``)
shapes. Run on an H200: python scripts/stamp_probe.py H64L4B32C16384-page64"""

import statistics as st
import sys

import bench
import profile_call
import torch

from mla_verify import hopper

T = torch.zeros(4096 * 128, dtype=torch.int64, device="cuda")
for paged in (False, True):
    hopper.gluon_kernel((576, 512), False, paged).PROBE_TIMES[0] = T
# (first stamp, last stamp, whether the last is the next tile's)
STEPS = {
    "score: wait for the tile": (0, 1, 0),
    "score: Q K^T": (1, 2, 0),
    "score: softmax + hand-over": (2, 3, 0),
    "score: rescale + its P V": (3, 4, 0),
    "score: on to the next tile": (4, 0, 1),
    "score: tile period": (0, 0, 1),
    "value: wait for P": (5, 6, 0),
    "value: rescale + its P V": (6, 7, 0),
    "value: on to the next tile": (7, 5, 1),
    "producer: wait for a free stage": (8, 9, 0),
    "producer: issue the tile": (9, 10, 0),
    "producer: on to the next tile": (10, 8, 1),
    "stage held: scores' start to value P V end": (1, 7, 0),
    "refill: producer's wait end to scores' wait end (2 tiles on)": (9, 1, 0),
}
for name in sys.argv[1:]:
    spec = bench.parse_shape(name)
    who = "paged" if spec.page_size else "tuned"
    args = profile_call.parse_args([name, "--contender", who])
    lens = bench.prefix_lengths(spec)
    _, slots = bench.plan_pool(lens, spec.draft_len, l2_bytes=0, pool_min_bytes=0, max_rotations=1)
    batch = bench.build_batch(
        spec, lens, rotations=1, slots=slots, device=torch.device("cuda"), seed=0
    )
    if who == "tuned":
        out = batch.sets[0].new_output()
        call = lambda b=batch, o=out: b.sets[0].run(o)  # noqa: E731
    else:
        call = profile_call._launch(who, batch, torch.device("cuda"), 0)
    for _ in range(4):
        T.zero_()
        call()
        torch.cuda.synchronize()
    rows = [
        r for r in T.view(-1, 128).cpu().tolist() if all(r[k] > 0 for k in range(96) if k % 12 < 11)
    ]
    print(
        f"== {name} ({who}): {len(rows)} CTAs with tiles 8-15 stamped; SM cycles, median (p20, p80)"
    )
    for label, (i, j, nxt) in STEPS.items():
        if label.startswith("refill"):
            # stage s refilled for tile t + 2 (producer at tile t + 2) vs its scores' wait end
            d = [r[(t + 2) * 12 + 1] - r[(t + 2) * 12 + 9] for r in rows for t in range(6)]
        else:
            d = [
                r[(t + nxt) * 12 + j] - r[t * 12 + i] for r in rows for t in range(7 if nxt else 8)
            ]
        d.sort()
        print(
            f"   {label:58s} {st.median(d):7.0f} ({d[len(d) // 5]:.0f}, {d[4 * len(d) // 5]:.0f})"
        )
