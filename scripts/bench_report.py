"""The summary tables of RESULTS.md's "Current state", from one run's CSV rows.

    python scripts/bench_report.py --commit 2011d95 \\
        --run 2026-12-04T12:36:04+00:00 --run 2026-12-04T12:39:46+00:00

reads ``results/results.csv`` (``--csv``), keeps the rows of that commit
whose ``date_utc`` (each bench run's start) is one of ``--run`` (a run
sharded over several calls has one per shard; without ``--run``, every
row of the commit), and prints in markdown:

- per contender, the median rate on the grid's compute-bound rows (H*L
  >= 128) and memory-bound ones (H*L <= 32), batch >= 8, 16K-64K
  contexts, with their ranges; the compute-bound median as a share of a
  typical matmul rate (``--matmul``, 789 TFLOP/s on the H200), the
  memory-bound one as the median share of each row's own copy ceiling;
- which contender is fastest on each plain MLA shape (the grid and the
  ragged batches: no ``-kind`` suffix);
- the geometric mean of t_contender / t_tuned for FlashMLA and
  FlashInfer, the lowest row, and how many rows fall below issue 23's
  bounds (0.85 and 0.9);
- the same ratios by batch and context;
- the other kinds of call (shapes with a ``-kind`` suffix: tree masks,
  ragged drafts, 256/256, paged calls): each one's time and share of the
  roofline, FlashMLA's and the token-indexed call's times beside it, and
  its efficiency against the plain shape's at one ceiling (``--copy``,
  ``--matmul``), since a run's shards measure ceilings of their own.

Only rows of status ok count. Nothing here runs a GPU.
"""

from __future__ import annotations

import argparse
import collections
import csv
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import bench_output  # scripts/, first on the path when run as a script
import bench_shapes
import bench_timing

from mla_verify.cli import Parser

BASELINE = "tuned"
RIVALS = ("flashmla", "flashinfer")
BELOW = {"flashmla": 0.85, "flashinfer": 0.9}  # issue 23: no row below these
CONTEXTS = {"uniform": "{ctx}", "lognormal": "lognormal", "long": "one long among short"}
# Kinds that compute the plain shape's problem another way (a mask, fewer
# drafts, int64 indices, pages): their efficiency is set against the plain
# shape's.
SAME_PROBLEM = ("tree", "treefull", "ragged", "ragged-tree", "i64")


def same_commit(recorded: str, asked: str) -> bool:
    """Whether a row's ``git_commit`` names the commit asked for: rows hold
    a short hash or a full one, and either may be asked for."""
    return bool(recorded) and (recorded.startswith(asked) or asked.startswith(recorded))


def load_rows(path: Path, commit: str, runs: Sequence[str]) -> list[dict]:
    """The ok rows of ``commit`` from the runs that started at ``runs``
    (every run of it where empty)."""
    with path.open(newline="", encoding="utf-8") as f:
        return [
            row
            for row in csv.DictReader(f)
            if same_commit(row["git_commit"], commit)
            and row["status"] == "ok"
            and (not runs or row["date_utc"] in runs)
        ]


def is_plain(shape: str) -> bool:
    """A grid or ragged-batch MLA shape: no ``-kind`` suffix."""
    return "-" not in shape


def bound_class(row: dict) -> str | None:
    """'compute' (H*L >= 128) or 'memory' (H*L <= 32) for a grid row
    (plain, uniform contexts) of batch >= 8 and a 16K-64K context; else
    None."""
    rows_per_request = int(row["num_heads"]) * int(row["draft_len"])
    if not is_plain(row["shape"]) or row["ctx_kind"] != "uniform":
        return None
    if int(row["batch_size"]) < 8 or int(row["ctx"]) < 16384:
        return None
    if rows_per_request >= 128:
        return "compute"
    if rows_per_request <= 32:
        return "memory"
    return None


def rates(table: dict[str, dict[str, dict]], matmul: float) -> list[str]:
    """The median rates by class, one line a contender."""
    lines = [
        "| contender | compute-bound: median (range) | memory-bound: median (range) |",
        "|---|---|---|",
    ]
    contenders = sorted({c for per in table.values() for c in per})
    for name in contenders:
        flops = [
            float(per[name]["flop_per_s"])
            for per in table.values()
            if name in per and bound_class(per[name]) == "compute"
        ]
        moved = [
            (float(per[name]["bytes_per_s"]), float(per[name]["frac_copy_bw"]))
            for per in table.values()
            if name in per and bound_class(per[name]) == "memory"
        ]
        if not flops and not moved:
            continue
        compute = memory = "-"
        if flops:
            median = statistics.median(flops)
            compute = (
                f"{median / 1e12:.0f} TFLOP/s ({min(flops) / 1e12:.0f}-{max(flops) / 1e12:.0f}), "
                f"{100 * median / matmul:.0f}% of {matmul / 1e12:.0f}, {len(flops)} rows"
            )
        if moved:
            speeds = [b for b, _ in moved]
            share = statistics.median(s for _, s in moved)
            memory = (
                f"{statistics.median(speeds) / 1e12:.2f} TB/s "
                f"({min(speeds) / 1e12:.2f}-{max(speeds) / 1e12:.2f}), "
                f"{100 * share:.1f}% of copy, {len(moved)} rows"
            )
        lines.append(f"| {name} | {compute} | {memory} |")
    return lines


def fastest(table: dict[str, dict[str, dict]]) -> list[str]:
    """How many plain shapes each contender is fastest on, among the
    baseline and its rivals."""
    wins: collections.Counter[str] = collections.Counter()
    plain = 0
    for shape, per in table.items():
        timed = {c: float(per[c]["median_us"]) for c in (BASELINE, *RIVALS) if c in per}
        if is_plain(shape) and timed:
            plain += 1
            wins[min(timed, key=timed.get)] += 1
    return [
        f"Fastest on (of {plain} plain shapes): "
        + ", ".join(f"{name} {count}" for name, count in wins.most_common())
    ]


def ratios(table: dict[str, dict[str, dict]], rival: str) -> dict[str, float]:
    """shape -> t_rival / t_baseline (above 1: the baseline is faster)."""
    return {
        shape: float(per[rival]["median_us"]) / float(per[BASELINE]["median_us"])
        for shape, per in table.items()
        if rival in per and BASELINE in per
    }


def geomeans(table: dict[str, dict[str, dict]]) -> list[str]:
    lines = []
    for rival in RIVALS:
        by = ratios(table, rival)
        if not by:
            continue
        low = min(by, key=by.get)
        bound = BELOW[rival]
        below = sum(r < bound for r in by.values())
        lines.append(
            f"- t_{rival} / t_{BASELINE}: geomean "
            f"{bench_timing.geomean(list(by.values())):.3f} over "
            f"{len(by)} shapes, lowest {by[low]:.2f} ({low}), {below} below {bound}"
        )
    return lines


def context_label(row: dict) -> str:
    return CONTEXTS[row["ctx_kind"]].format(ctx=f"{int(row['ctx']) // 1024}K")


def by_batch_and_context(table: dict[str, dict[str, dict]]) -> list[str]:
    """Geomean (lowest) of each rival's ratios by batch and context, plain
    shapes."""
    cells: dict[tuple[int, str], dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    for rival in RIVALS:
        for shape, ratio in ratios(table, rival).items():
            row = table[shape][BASELINE]
            if is_plain(shape):
                cells[(int(row["batch_size"]), context_label(row))][rival].append(ratio)
    labels = list(dict.fromkeys(label for _, label in sorted(cells, key=_context_order)))
    lines = [
        f"By batch and context, t_rival / t_{BASELINE} ({' / '.join(RIVALS)}), geomean (lowest):",
        "",
        "| batch | " + " | ".join(labels) + " |",
        "|---" * (len(labels) + 1) + "|",
    ]
    for batch in sorted({b for b, _ in cells}):
        cols = []
        for label in labels:
            got = cells.get((batch, label), {})
            cols.append(
                " / ".join(
                    f"{bench_timing.geomean(got[r]):.2f} ({min(got[r]):.2f})"
                    for r in RIVALS
                    if got.get(r)
                )
            )
        lines.append(f"| {batch} | " + " | ".join(cols) + " |")
    return lines


def _context_order(key: tuple[int, str]) -> tuple[int, float]:
    # Uniform contexts by length, then the ragged kinds.
    label = key[1]
    return (0, float(label[:-1])) if label.endswith("K") else (1, len(label))


def efficiency(row: dict, copy: float, matmul: float) -> float:
    """The row's share of the roofline at these ceilings (bytes/s, FLOP/s),
    as the bench takes it at its own."""
    work = bench_shapes.Work(int(float(row["bytes"])), int(float(row["flops"])))
    shares = bench_timing.metrics(
        float(row["median_us"]), work, bench_timing.Ceilings(copy, matmul)
    )
    return shares["frac_roofline"]


def every_kind(table: dict[str, dict[str, dict]], copy: float, matmul: float) -> list[str]:
    """One line per shape of another kind of call: the paged call on
    ``-page`` shapes, else the baseline."""
    lines = [
        "| shape | call | us | % roofline | FlashMLA us | token-indexed us "
        "| efficiency / plain's |",
        "|---|---|---|---|---|---|---|",
    ]
    plain_by_shape = bench_output.plain_rows(table)
    for shape in sorted(s for s in table if not is_plain(s)):
        per = table[shape]
        plain_shape, kind = shape.split("-", 1)
        name = "paged" if kind.startswith("page") and "paged" in per else BASELINE
        if name not in per:
            continue
        row = per[name]
        cols = [shape, name, f"{float(row['median_us']):.1f}"]
        cols.append(f"{100 * float(row['frac_roofline']):.1f}")
        cols.append(f"{float(per['flashmla']['median_us']):.1f}" if "flashmla" in per else "")
        token = per.get(BASELINE) if name != BASELINE else None
        cols.append(f"{float(token['median_us']):.1f}" if token else "")
        plain = plain_by_shape.get(plain_shape)
        if plain and plain is not row and (kind in SAME_PROBLEM or kind.startswith("page")):
            ratio = efficiency(row, copy, matmul) / efficiency(plain, copy, matmul)
            cols.append(f"{ratio:.3f}")
        else:
            cols.append("")
        lines.append("| " + " | ".join(cols) + " |")
    return lines if len(lines) > 2 else []


def report(rows: Sequence[dict], matmul: float, copy: float) -> str:
    table = bench_output._by_shape(rows)  # shape -> contender -> row
    parts = [
        rates(table, matmul),
        fastest(table),
        geomeans(table),
        by_batch_and_context(table),
        every_kind(table, copy, matmul),
    ]
    return "\n\n".join("\n".join(part) for part in parts if part) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = Parser(prog="bench_report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", required=True, help="the rows' git_commit")
    parser.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="DATE_UTC",
        help="a run's date_utc (repeat for shards; default: every run of the commit)",
    )
    parser.add_argument("--csv", type=Path, default=Path("results/results.csv"))
    parser.add_argument(
        "--matmul",
        type=float,
        default=789.0,
        metavar="TFLOPS",
        help="the typical matmul rate compute-bound medians are shared of (default 789)",
    )
    parser.add_argument(
        "--copy",
        type=float,
        default=4.27,
        metavar="TBPS",
        help="the copy rate (read + write) the other kinds' efficiencies are taken at "
        "(default 4.27)",
    )
    args = parser.parse_args(argv)
    if not args.csv.is_file():
        parser.error(f"--csv: expected a CSV file, got {str(args.csv)!r}")
    if args.matmul <= 0:
        parser.error(f"--matmul: expected a positive rate, got {args.matmul}")
    if args.copy <= 0:
        parser.error(f"--copy: expected a positive rate, got {args.copy}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows = load_rows(args.csv, args.commit, args.run)
    if not rows:
        print(
            f"bench_report.py: no ok rows of commit {args.commit!r} in {args.csv}"
            + (f" from runs {args.run}" if args.run else ""),
            file=sys.stderr,
        )
        return 1
    sys.stdout.write(report(rows, args.matmul * 1e12, args.copy * 1e12))
    return 0


if __name__ == "__main__":
    sys.exit(main())
