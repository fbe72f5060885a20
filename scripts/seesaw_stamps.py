"""Measurement only (this commit's seesaw kernel writes timer stamps): where a
seesaw call's stage 1 spends its time, CTA by CTA.

    python scripts/seesaw_stamps.py H128L2B32C2048 H128L2B32C16384

makes 40 eager ``verify_mla_paged`` calls of each shape on 64-token pages
(scattered, uniform lengths) and prints, for the last call, each stamped
point's median and latest time over the CTAs, in microseconds from the
first CTA's start, and the left warpgroup's pair ends (pairs 0-31 of its
first segment).
"""

from __future__ import annotations

import re
import statistics
import sys

import torch

import mla_verify
from mla_verify import kernel_seesaw

POINTS = (
    "start", "plan done", "left: segment", "left: tiles 0-1 issued", "left: q staged",
    "left: q ready", "left: pair 0 done", "left: middle pair done", "left: loop done",
    "left: last pair done", "left: stored", "right: q staged", "right: stored",
)  # fmt: skip


def stamps(shape: str) -> None:
    heads, drafts, batch, ctx = map(int, re.fullmatch(r"H(\d+)L(\d+)B(\d+)C(\d+)", shape).groups())
    pages = -(-(ctx + drafts) // 64)
    kv = (torch.randn(batch * pages, 64, 1, 576, device="cuda") / 2).to(torch.bfloat16)
    table = torch.randperm(batch * pages, device="cuda", dtype=torch.int32).view(batch, pages)
    seqlens = torch.full((batch,), ctx + drafts, device="cuda", dtype=torch.int32)
    q = (torch.randn(batch, drafts, heads, 576, device="cuda") / 2).to(torch.bfloat16)
    out = torch.empty(batch, drafts, heads, 512, device="cuda", dtype=torch.bfloat16)
    kernel_seesaw.TIMES.clear()
    for _ in range(40):
        mla_verify.verify_mla_paged(q, kv, table, seqlens, out=out)
    torch.cuda.synchronize()
    [times] = kernel_seesaw.TIMES.values()
    rows = times.view(-1, kernel_seesaw.STAMP_SLOTS.value).cpu()
    rows = rows[rows[:, 0] > 0]
    t0 = int(rows[:, 0].min())

    def column(k: int) -> list[float]:
        return [(int(x) - t0) / 1000 for x in rows[:, k] if int(x) > 0]

    print(f"\n{shape}: {rows.shape[0]} CTAs; us from the first CTA's start, median / latest")
    for k, name in enumerate(POINTS):
        if col := column(k):
            print(f"  {name:24s} {statistics.median(col):8.2f} {max(col):8.2f}")
    ends = [statistics.median(c) for k in range(16, 48) if (c := column(k))]
    print("  left's pair ends:", " ".join(f"{t:.1f}" for t in ends))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        stamps(name)
