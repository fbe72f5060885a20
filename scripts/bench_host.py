"""The host's cost of a call, as an engine that calls the kernel eagerly pays it.

Graph replays, which ``bench.py`` times, count no host time. Here, for each
shape, this package's ``verify_mla_fwd`` (and ``verify_mla_paged`` on
``-page<N>`` rows) is timed as the CPU time of one call while a sleep
kernel holds the GPU busy, so that no launch waits for the queue. With
``--rev``, the same calls of another revision, imported beside this one as
the benchmark's ``rev:`` contenders are (``bench_revisions``), are timed in
turn with them in the same process: each pair of timings shares the host's
drift, which moved separate processes 30-60% between rounds (RESULTS.md, "A
kept call's launches replayed"). The table gives each side's median and the
median of the pairs' ratios.

    python scripts/bench_host.py --rev 2ec0dd7 H16L4B8C2048-page64 H8L2B64C2048
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_batch  # noqa: E402  (scripts/ is not a package)
import bench_revisions  # noqa: E402
from bench_shapes import parse_shape, prefix_lengths  # noqa: E402

import mla_verify  # noqa: E402

SLEEP_CYCLES = 100_000_000  # about 60 ms of GPU time: longer than any timed run of calls
WARMUP_CALLS = 5


def hold_gpu() -> None:
    """Keep the GPU busy past the timed calls, so that no launch blocks."""
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)


def host_us(call: Callable[[], object], calls: int, hold: Callable[[], None] = hold_gpu) -> float:
    """Microseconds of host time a call: ``calls`` calls timed back to back
    after ``hold`` (then synchronised, untimed)."""
    for _ in range(WARMUP_CALLS):
        call()
    hold()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - start
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


@dataclass(frozen=True)
class Paired:
    """One call of one shape: each side's median and the median of the
    pairs' ratios (``other / this``: above 1, this tree takes less)."""

    this_us: float
    other_us: float | None
    ratio: float | None


def paired(
    this: Callable[[], object],
    other: Callable[[], object] | None,
    repeats: int,
    calls: int,
    hold: Callable[[], None] = hold_gpu,
) -> Paired:
    """``this`` and ``other`` timed in turn, ``repeats`` times each."""
    mine, theirs = [], []
    for _ in range(repeats):
        mine.append(host_us(this, calls, hold))
        if other is not None:
            theirs.append(host_us(other, calls, hold))
    if other is None:
        return Paired(statistics.median(mine), None, None)
    ratios = [o / m for o, m in zip(theirs, mine)]
    return Paired(statistics.median(mine), statistics.median(theirs), statistics.median(ratios))


def calls_of(text: str, packages: list, device: torch.device) -> dict[str, list[Callable]]:
    """The calls of shape ``text``, one a package: ``verify_mla_fwd`` as
    SGLang calls it, and ``verify_mla_paged`` on paged rows, each writing
    one output, the workspace prepared beforehand as an engine does."""
    spec = parse_shape(text)
    lens = prefix_lengths(spec)
    bs, draft_len, heads = spec.batch_size, spec.draft_len, spec.num_heads
    slots = 2 * (sum(lens) + bs * draft_len) + 64 * bs * 4
    batch = bench_batch.build_batch(spec, lens, rotations=1, slots=slots, device=device, seed=1)
    vb = batch.sets[0]
    out = vb.new_output()
    for pkg in packages:
        kv_dtype = batch.k_buffer.dtype
        pkg.prepare_workspace(
            bs, heads, draft_len, kv_dtype, device=device, head_dims=spec.head_dims
        )
    calls = {
        "verify_mla_fwd": [lambda pkg=pkg: vb.run(out, fwd=pkg.verify_mla_fwd) for pkg in packages]
    }
    if batch.paged:
        kv, table, seqlens = batch.paged[0]
        q4, out4 = batch.q.view(bs, draft_len, heads, -1), out.view(bs, draft_len, heads, -1)
        for pkg in packages:
            pkg.prepare_paged_workspace(
                bs, heads, draft_len, table.shape[1], spec.page_size, kv.dtype, device=device
            )
        calls["verify_mla_paged"] = [
            lambda pkg=pkg: pkg.verify_mla_paged(
                q4, kv, table, seqlens, sm_scale=batch.sm_scale, out=out4
            )
            for pkg in packages
        ]
    return calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="+", metavar="SPEC", help="bench.py shape specs")
    parser.add_argument("--rev", help="a commit, or a directory holding one's mla_verify/")
    parser.add_argument("--repeats", type=int, default=15, help="timings of each side (15)")
    parser.add_argument("--calls", type=int, default=100, help="calls a timing (100)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a GPU")
    device = torch.device("cuda")
    packages = [mla_verify]
    if args.rev:
        packages.append(bench_revisions.load_revision(args.rev).module)
    rows = []
    for text in args.shapes:
        for name, fns in calls_of(text, packages, device).items():
            other = fns[1] if len(fns) > 1 else None
            result = paired(fns[0], other, args.repeats, args.calls)
            rows.append((text, name, result))
            print(text, name, result, flush=True)
    print(f"\n{'shape':26s} {'call':17s} {'this us':>8s} {'rev us':>8s} {'rev/this':>8s}")
    for text, name, r in rows:
        other = "-" if r.other_us is None else f"{r.other_us:.1f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        print(f"{text:26s} {name:17s} {r.this_us:8.1f} {other:>8s} {ratio:>8s}")


if __name__ == "__main__":
    main()
