"""Measurement only (this branch's seesaw kernel writes timer stamps): where a
seesaw call's stage 1 spends its time, CTA by CTA, given the step's metadata.

    python scripts/seesaw_stamps.py H8L1B32C2048 H16L1B8C16384

makes 30 eager ``verify_mla_paged`` calls of each shape on 64-token pages
(scattered, uniform lengths), with ``paged_metadata(..., num_heads=H)`` made
once, and prints, for the last call, each stamped point's median and latest
time over the CTAs, in microseconds from the first CTA's start; the CTAs'
ends by segments; and the median pair ends (the left's first 32 pairs,
counted over its segments).
"""

from __future__ import annotations

import re
import statistics
import sys

import torch

import mla_verify
from mla_verify import kernel_seesaw, paged

POINTS = (
    "start", "plan read", "left: segment", "left: tiles 0-1 issued", "left: q staged",
    "left: q ready", "left: pair 0 done (loop)", "left: 2nd segment's tiles issued",
    "left: loop done", "left: last pair done", "left: sums exchanged", "left: stored",
    "right: q staged", "right: stored", "left: all segments done", "right: all done",
)  # fmt: skip


def stamps(shape: str) -> None:
    heads, drafts, batch, ctx = map(int, re.fullmatch(r"H(\d+)L(\d+)B(\d+)C(\d+)", shape).groups())
    pages = -(-(ctx + drafts) // 64)
    kv = (torch.randn(batch * pages, 64, 1, 576, device="cuda") / 2).to(torch.bfloat16)
    table = torch.randperm(batch * pages, device="cuda", dtype=torch.int32).view(batch, pages)
    seqlens = torch.full((batch,), ctx + drafts, device="cuda", dtype=torch.int32)
    q = (torch.randn(batch, drafts, heads, 576, device="cuda") / 2).to(torch.bfloat16)
    out = torch.empty(batch, drafts, heads, 512, device="cuda", dtype=torch.bfloat16)
    assert paged.seesaw_serves(q, kv, table), f"{shape}: not the seesaw kernel's"
    metadata = paged.paged_metadata(kv, table, seqlens, drafts, num_heads=heads)
    kernel_seesaw.TIMES.clear()
    for _ in range(30):
        mla_verify.verify_mla_paged(q, kv, table, seqlens, out=out, metadata=metadata)
    torch.cuda.synchronize()
    [times] = kernel_seesaw.TIMES.values()
    rows = times.view(-1, kernel_seesaw.STAMP_SLOTS.value).cpu()
    rows = rows[rows[:, 14] > 0]  # CTAs that held a share
    t0 = int(rows[:, 0].min())
    us = (rows - t0).double() / 1000

    def column(k: int, sel=None) -> list[float]:
        col = us[:, k] if sel is None else us[sel, k]
        return [float(x) for x in col if x > -1e6]

    print(f"\n{shape}: {rows.shape[0]} CTAs; us from the first CTA's start, median / latest")
    for k, name in enumerate(POINTS):
        if col := column(k):
            print(f"  {name:34s} {statistics.median(col):8.2f} {max(col):8.2f}  ({len(col)})")
    plan = metadata.seesaw_plan.view(-1, 8)[: rows.shape[0]].cpu()
    two = plan[:, 2] > plan[:, 1]  # b1 > b0: the share holds two sequences or more
    end = torch.maximum(us[:, 14], us[:, 15])
    qs = torch.quantile(end, torch.tensor([0.5, 0.9, 1.0], dtype=end.dtype))
    print(f"  CTA end (both warpgroups): median {qs[0]:.2f}, p90 {qs[1]:.2f}, latest {qs[2]:.2f}")
    late = end.argsort(descending=True)[:6]
    for i in late.tolist():
        print(
            f"    late CTA {i}: start {us[i, 0]:.2f} plan {us[i, 1]:.2f} issued {us[i, 3]:.2f} "
            f"pair0 {us[i, 16]:.2f} end {end[i]:.2f} segments {int(plan[i, 2] - plan[i, 1]) + 1}"
        )
    for label, sel in (("one segment", ~two), ("two or more", two)):
        if int(sel.sum()):
            picked = [float(x) for x in end[sel]]
            print(
                f"  CTAs of {label:12s} ({int(sel.sum())}): end {statistics.median(picked):.2f} "
                f"median, {max(picked):.2f} latest"
            )
    ends = [statistics.median(c) for k in range(16, 48) if (c := column(k))]
    print("  left's pair ends:", " ".join(f"{t:.1f}" for t in ends))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        stamps(name)
