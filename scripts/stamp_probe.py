"""Probe (not for main): per-CTA globaltimer stamps of stage 1, one eager call of each bench shape named; raw stamps to $OUT."""

import json, os, statistics as st, sys, torch

sys.path.insert(0, "scripts")
import bench
from mla_verify import hopper, kernel_sm90

W = 20
T = torch.zeros(132 * 8 * W, dtype=torch.int64, device="cuda")
kernel_sm90.PROBE_TIMES[0] = T
hopper.gluon_kernel((576, 512), True).PROBE_TIMES[0] = T
dump = {}
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
    runs = []
    for rep in range(6):
        T.zero_()
        assert vb.run(out)
        torch.cuda.synchronize()
        if rep >= 3:
            runs.append([r for r in T.view(-1, W).cpu().tolist() if r[0] > 0])
    dump[name] = {"counts": bench.draft_counts(spec), "runs": runs}
    t = runs[-1]
    t0 = min(r[0] for r in t)
    work = [r for r in t if r[2] > 0]
    ends = [(r[2] - t0) / 1e3 for r in work]
    body = [(r[2] - r[7]) / 1e3 for r in work]
    pos = [r[8] for r in work]
    seg = [r[9] for r in work]
    print(
        f"== {name}: {len(t)} CTAs, {len(work)} working; plan end med {st.median((r[1] - t0) / 1e3 for r in t):.1f}; end med {st.median(ends):.1f} max {max(ends):.1f}"
    )
    print(
        f"   positions med {st.median(pos)} max {max(pos)}; segments med {st.median(seg)} max {max(seg)}; body med {st.median(body):.1f} max {max(body):.1f}"
    )
    for k in sorted(set(seg)):
        b = [x for x, s in zip(body, seg) if s == k]
        p = [x for x, s in zip(pos, seg) if s == k]
        print(
            f"   {k} segments: {len(b)} CTAs, positions med {st.median(p)}, body med {st.median(b):.1f} max {max(b):.1f}, per position {st.median(x / max(y, 1) for x, y in zip(b, p)):.2f}"
        )
    steps = [
        (0, 1, "plan"),
        (1, 7, "b0/b1"),
        (7, 12, "to scores wg"),
        (12, 13, "segment"),
        (13, 18, "segment loads"),
        (18, 14, "issue q"),
        (14, 15, "await q"),
        (15, 16, "tile 0"),
        (16, 17, "tile 1"),
        (17, 2, "to end"),
    ]
    print(
        "   "
        + "  ".join(
            f"{lab} {st.median([(r[j] - r[i]) / 1e3 for r in work if r[i] and r[j]] or [-1]):.2f}"
            for i, j, lab in steps
        )
    )
json.dump(dump, open(os.path.join(os.environ.get("OUT", "."), "stamps.json"), "w"))
