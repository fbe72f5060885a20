"""Probe (not for main): clock64 stamps of score/value's steady-state tiles (8-15 of each CTA's first segment), per step, in SM cycles."""

import statistics as st
import sys

import torch

sys.path.insert(0, "scripts")
import bench  # noqa: E402

from mla_verify import hopper, kernel_sm90  # noqa: E402

T = torch.zeros(4096 * 128, dtype=torch.int64, device="cuda")
kernel_sm90.PROBE_TIMES[0] = T
hopper.gluon_kernel((576, 512), False).PROBE_TIMES[0] = T
STEPS = {
    "score: ready wait": (0, 1, 0),
    "score: QK^T": (1, 2, 0),
    "score: softmax": (2, 3, 0),
    "score: P handed over": (3, 4, 0),
    "score: rescale + P V": (4, 5, 0),
    "score: to next tile": (5, 0, 1),
    "score: tile period": (0, 0, 1),
    "value: P wait": (6, 7, 0),
    "value: rescale + P V": (7, 8, 0),
    "value: to next tile": (8, 6, 1),
    "producer: empty wait": (9, 10, 0),
    "producer: gathers issued": (10, 11, 0),
    "producer: to next tile": (11, 9, 1),
}
for name in sys.argv[1:]:
    spec = bench.parse_shape(name)
    lens = bench.prefix_lengths(spec)
    batch = bench.build_batch(
        spec,
        lens,
        rotations=1,
        slots=sum(lens) + 64 * spec.batch_size * spec.draft_len + 4096,
        device=torch.device("cuda"),
        seed=0,
    )
    vb = batch.sets[0]
    out = vb.new_output()
    for _ in range(4):
        T.zero_()
        assert vb.run(out)
        torch.cuda.synchronize()
    rows = [r for r in T.view(-1, 128).cpu().tolist() if all(r[k] > 0 for k in range(96))]
    print(
        f"== {name}: {len(rows)} CTAs with tiles 8-15 stamped; SM cycles, median (p20, p80) over CTAs and tiles"
    )
    for label, (i, j, nxt) in STEPS.items():
        d = [r[(t + nxt) * 12 + j] - r[t * 12 + i] for r in rows for t in range(7 if nxt else 8)]
        d.sort()
        print(
            f"   {label:26s} {st.median(d):7.0f} ({d[len(d) // 5]:.0f}, {d[4 * len(d) // 5]:.0f})"
        )
