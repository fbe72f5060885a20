"""Bar chart of the share of the roofline each contender reaches, per shape.

    python scripts/bench_plot.py DIR        # redraw DIR/roofline*.png from DIR/results.json

Imported by ``bench_output.py`` (the benchmark's outputs) as the module
beside it; needs matplotlib (the import fails without it, and bench.py
then skips the plot).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

logger = logging.getLogger("bench_plot")

SHAPES_PER_FIGURE = 24
COLORS = {
    "tuned": "#1f77b4",
    "paged": "#17becf",
    "default": "#aec7e8",
    "mha": "#c7c7c7",
    "triton": "#9edae5",
    "flashinfer": "#ff7f0e",
    "flashmla": "#d62728",
    "torch_ref": "#98df8a",
}


def _roofline_table(
    rows: Sequence[dict[str, Any]], contenders: Sequence[str]
) -> tuple[list[str], dict[str, list[float | None]], dict[str, str]]:
    """Shapes in first-seen order, % roofline per contender (None where not
    ok) and each shape's bound ('memory' / 'compute')."""
    shapes: list[str] = []
    values: dict[tuple[str, str], float] = {}
    bound: dict[str, str] = {}
    for row in rows:
        shape = row["shape"]
        if shape not in shapes:
            shapes.append(shape)
        if row.get("status") == "ok" and row.get("frac_roofline") not in (None, ""):
            values[(shape, row["contender"])] = 100.0 * float(row["frac_roofline"])
            bound[shape] = row.get("bound") or ""
    series = {c: [values.get((s, c)) for s in shapes] for c in contenders}
    return shapes, series, bound


def plot_roofline(
    rows: Sequence[dict[str, Any]],
    out_dir: Path,
    *,
    title: str = "",
    contenders: Sequence[str] = ("tuned", "paged", "triton", "flashinfer", "flashmla"),
) -> list[Path]:
    """Write roofline.png (or roofline_01.png, ... past 24 shapes); returns the paths."""
    shapes, series, bound = _roofline_table(rows, contenders)
    present = [c for c in contenders if any(v is not None for v in series[c])]
    if not shapes or not present:
        logger.info("no plot: no contender has a %% roofline value")
        return []
    chunks = [
        range(i, min(i + SHAPES_PER_FIGURE, len(shapes)))
        for i in range(0, len(shapes), SHAPES_PER_FIGURE)
    ]
    paths = []
    for n, chunk in enumerate(chunks, 1):
        name = "roofline.png" if len(chunks) == 1 else f"roofline_{n:02d}.png"
        path = out_dir / name
        _draw(
            [shapes[i] for i in chunk],
            {c: [series[c][i] for i in chunk] for c in present},
            bound,
            path,
            title if len(chunks) == 1 else f"{title} ({n}/{len(chunks)})",
        )
        paths.append(path)
    return paths


def _draw(
    shapes: list[str],
    series: dict[str, list[float | None]],
    bound: dict[str, str],
    path: Path,
    title: str,
) -> None:
    n = len(series)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(8.0, 0.75 * len(shapes) * max(n, 2) / 2 + 2), 5.5))
    top = 100.0
    for k, (name, vals) in enumerate(series.items()):
        xs = [i + (k - (n - 1) / 2) * width for i in range(len(shapes))]
        heights = [v if v is not None else 0.0 for v in vals]
        bars = ax.bar(xs, heights, width, label=name, color=COLORS.get(name))
        for bar, v in zip(bars, vals, strict=True):
            if v is None:
                ax.text(
                    bar.get_x() + bar.get_width() / 2,
                    1,
                    "n/a",
                    ha="center",
                    va="bottom",
                    fontsize=6,
                    rotation=90,
                    color="gray",
                )
            elif name == "tuned":
                ax.text(
                    bar.get_x() + bar.get_width() / 2,
                    v + 1,
                    f"{v:.0f}",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        top = max(top, *(v for v in vals if v is not None and math.isfinite(v)))
    ax.axhline(100, color="black", linestyle="--", linewidth=0.8)
    ax.set_ylim(0, top * 1.12)
    ax.set_xticks(range(len(shapes)))
    labels = [f"{s}\n({bound[s]})" if bound.get(s) else s for s in shapes]
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("% of roofline floor (max of copy-BW and matmul time)")
    ax.set_title(f"MLA verify attention: share of the roofline reached\n{title}", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="a bench.py --out directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    data = json.loads((args.dir / "results.json").read_text(encoding="utf-8"))
    meta = data.get("meta", {})
    title = ", ".join(
        (meta.get("device", ""), f"commit {meta.get('git_commit', '?')}", meta.get("date_utc", ""))
    )
    for path in plot_roofline(data["rows"], args.dir, title=title):
        logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
