"""Probe (this commit only, reverted next): per-CTA globaltimer stamps of stage 1, one eager call of each bench shape named; MLA_ORDER_VARIANT picks the order step (0: 512 requests, 2: 128; odd: warps across the draft counts)."""
import sys, statistics, torch
sys.path.insert(0, "scripts")
import bench
from mla_verify import hopper, kernel_sm90
T = torch.zeros(132 * 8 * 8, dtype=torch.int64, device="cuda")
kernel_sm90.PROBE_TIMES[0] = T
hopper.gluon_kernel((576, 512), True).PROBE_TIMES[0] = T
for name in sys.argv[1:]:
    spec = bench.parse_shape(name)
    lens = bench.prefix_lengths(spec)
    batch = bench.build_batch(spec, lens, rotations=1, slots=sum(lens) + 64 * spec.batch_size * spec.draft_len + 4096, device=torch.device("cuda"), seed=0)
    vb = batch.sets[0]
    out = vb.new_output()
    for _ in range(3):
        assert vb.run(out)
    torch.cuda.synchronize()
    T.zero_()
    assert vb.run(out)
    torch.cuda.synchronize()
    t = T.view(-1, 8).cpu().tolist()
    t = [r for r in t if r[0] > 0]
    t0 = min(r[0] for r in t)
    rows = [((r[3] >> 16), r[3] & 0xFFFF, (r[0] - t0) / 1e3, (r[1] - t0) / 1e3, (r[2] - t0) / 1e3 if r[2] else None) for r in t]
    work = [x for x in rows if x[4] is not None]
    print(f"== {name} counts {bench.draft_counts(spec)[:16]} ctas launched {len(rows)} working {len(work)}")
    print(f"   start spread max {max(x[2] for x in rows):.2f} us; plan end med {statistics.median(x[3] for x in rows):.2f} max {max(x[3] for x in rows):.2f}")
    by = {}
    for x in work:
        by.setdefault(x[0], []).append(x)
    for hb in sorted(by):
        ends = [x[4] for x in by[hb]]
        print(f"   head block {hb}: {len(ends)} CTAs, end med {statistics.median(ends):.2f} max {max(ends):.2f} min {min(ends):.2f}")
    import statistics as st
    full = [r for r in t if r[4] > 0]
    if full:
        for k, lab in [(4, "prelude loop"), (5, "order"), (6, "barrier"), (1, "head_block_plan")]:
            prev = {4: 0, 5: 4, 6: 5, 1: 6}[k]
            print(f"   {lab}: med {st.median((r[k] - r[prev]) / 1e3 for r in full):.2f} us")
    lp = [(r[7] - r[1]) / 1e3 for r in t if r[7] > 0]
    print(f"   b0/b1 loop: med {st.median(lp):.2f} max {max(lp):.2f}")
    work.sort(key=lambda x: -x[4])
    print("   slowest (hb, cta, start, plan_end, end):", [(a, b, round(c, 1), round(d, 1), round(e, 1)) for a, b, c, d, e in work[:6]])
