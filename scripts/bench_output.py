"""A run's outputs: the tidy CSV (its columns, rows appended or written),
results.json, summary.md and its comparisons, the table printed last, and
the roofline plot."""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_contenders import CONTENDERS
from bench_revisions import REV_PREFIX
from bench_shapes import ShapeSpec, draft_counts, parse_shape, plain_name
from bench_timing import Ceilings, geomean

logger = logging.getLogger("bench")

PLOT_CONTENDERS = ("tuned", "paged", "triton", "flashinfer", "flashmla")

# The tidy CSV: one row per shape x contender, the same columns in every
# run, so runs append to one file. Rates in bytes/s and FLOP/s; frac_* are
# fractions (0..1) of the run's own ceilings.
CSV_FIELDS = (
    # the run
    "date_utc",
    "git_commit",
    "device",
    "arch",
    "torch",
    "triton",
    "cuda",
    "mla_verify",
    "flashinfer",
    "flash_mla",
    # the shape
    "shape",
    "num_heads",
    "draft_len",
    "batch_size",
    "ctx_kind",
    "ctx",
    "kv_dtype",
    "prefix_tokens",
    "prefix_min",
    "prefix_max",
    # the contender and its config
    "contender",
    "status",
    "reason",
    "config_source",
    "kernel",
    "BLOCK_H",
    "BLOCK_N",
    "NUM_KV_SPLITS",
    "num_warps",
    "num_stages",
    "MIN_SHARE",
    "config",
    # the measurement
    "timing",
    "launches_per_replay",
    "replays",
    "rotations",
    "median_us",
    "p20_us",
    "p80_us",
    "bytes",
    "flops",
    "bytes_per_s",
    "flop_per_s",
    "copy_bytes_per_s",
    "matmul_flop_per_s",
    "frac_copy_bw",
    "frac_matmul",
    "frac_roofline",
    "bound",
    "tuned_speedup",
    "rel_err",
    "max_abs_err",
)
CONFIG_FIELDS = (
    "BLOCK_H",
    "BLOCK_N",
    "NUM_KV_SPLITS",
    "num_warps",
    "num_stages",
    "kernel",
    "MIN_SHARE",
)


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def pct(fraction: float | None, digits: int = 1) -> str:
    return fmt(None if fraction is None else 100.0 * fraction, digits)


def _scaled(value: float | None, scale: float, digits: int = 1) -> str:
    return fmt(None if value is None else value / scale, digits)


def config_text(row: dict[str, Any]) -> str:
    if row.get("BLOCK_H") is None:
        return ""
    text = "H{BLOCK_H}/N{BLOCK_N}/S{NUM_KV_SPLITS}/w{num_warps}/s{num_stages}".format(**row)
    if row.get("MIN_SHARE") is not None:
        text += f"/f{row['MIN_SHARE']}"
    return text if row.get("kernel", "triton") == "triton" else f"{text}/{row['kernel']}"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _csv_cells(row: dict[str, Any]) -> dict[str, Any]:
    return {k: ("" if row.get(k) is None else row.get(k)) for k in CSV_FIELDS}


def check_csv(path: Path) -> None:
    """Raise ValueError if ``path`` exists with columns other than CSV_FIELDS
    (rows appended to it would not line up)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), [])
    if tuple(header) != CSV_FIELDS:
        raise ValueError(
            f"{path}: its columns are not this benchmark's ({len(header)} vs "
            f"{len(CSV_FIELDS)}; first difference at "
            f"{next((a, b) for a, b in zip([*header, ''], [*CSV_FIELDS, '']) if a != b)}); "
            "pass another --csv"
        )


def append_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Append one line per row to the tidy CSV, with the header if the file is new."""
    check_csv(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(_csv_cells(row) for row in rows)


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """This run alone, in the tidy CSV's columns."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(_csv_cells(row) for row in rows)


def write_json(
    rows: Sequence[dict[str, Any]], meta: dict[str, Any], ceilings: Ceilings, path: Path
) -> None:
    data = {
        "meta": meta,
        "ceilings": {k: _json_safe(v) for k, v in ceilings.details.items()},
        "rows": [{k: _json_safe(row.get(k)) for k in CSV_FIELDS} for row in rows],
    }
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def _by_shape(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    shapes: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        shapes.setdefault(row["shape"], {})[row["contender"]] = row
    return shapes


def compared(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The contenders set against tuned: the fixed ones, then each rev:
    contender of ``rows``."""
    revs = dict.fromkeys(r["contender"] for r in rows if r["contender"].startswith(REV_PREFIX))
    return [c for c in CONTENDERS if c != "tuned"] + list(revs)


def tuned_geomeans(rows: Sequence[dict[str, Any]]) -> dict[str, tuple[float | None, int]]:
    """Per contender: geomean of t_contender / t_tuned over shapes where both
    are ok (> 1: tuned faster), and the number of shapes."""
    out = {}
    for name in compared(rows):
        ratios = [
            c[name]["tuned_speedup"]
            for c in _by_shape(rows).values()
            if name in c and c[name]["status"] == "ok" and c[name].get("tuned_speedup")
        ]
        out[name] = (geomean(ratios), len(ratios))
    return out


def describe_call(spec: ShapeSpec) -> str:
    """The kind of call a shape times, in words."""
    dqk, dv = spec.head_dims
    parts = ["absorbed MLA 576/512" if spec.mla else f"head dims {dqk}/{dv}, V a cache of its own"]
    if spec.ragged:
        counts = draft_counts(spec)
        parts.append(f"ragged drafts 1..{spec.draft_len} ({sum(counts)} in all)")
    else:
        parts.append(f"{spec.draft_len} drafts a request")
    parts.append(
        {
            "causal": "causal",
            "tree": "tree mask, prefix visible (skip_prefix_custom_mask=True)",
            "treefull": "tree mask, every prefix bit read (skip_prefix_custom_mask=False)",
        }[spec.mask]
    )
    if spec.page_size:
        parts.append(f"paged cache, {spec.page_size}-token pages")
    parts.append(f"{spec.kv_dtype} KV")
    return ", ".join(parts)


def paged_vs_flashmla(rows: Sequence[dict[str, Any]]) -> list[tuple[str, float]]:
    """(shape, t_flashmla / t_paged) on every -page64 shape where both are
    ok (> 1: the package's paged call is faster; issue 26's target)."""
    out = []
    for shape, c in _by_shape(rows).items():
        paged, flashmla = c.get("paged"), c.get("flashmla")
        if paged and flashmla and paged["status"] == flashmla["status"] == "ok":
            out.append((shape, flashmla["median_us"] / paged["median_us"]))
    return out


def plain_rows(table: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The tuned row that stands for each plain shape in ``table`` (shape ->
    contender -> row): the plain shape's own row, else the tuned row of one
    of its -page rows, the same call on the same values."""
    plain: dict[str, dict[str, Any]] = {}
    for shape, c in table.items():
        row, spec = c.get("tuned"), parse_shape(shape)
        if spec.plain and _measured(row) and (plain_name(spec) not in plain or not spec.page_size):
            plain[plain_name(spec)] = row
    return plain


def _measured(row: dict[str, Any] | None) -> bool:
    return bool(row and row["status"] == "ok" and row["frac_roofline"])


def kind_vs_plain(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, float]]:
    """(shape, plain shape, its tuned % roofline over the plain row's) for
    every tree, ragged or int64-index shape whose plain row ran
    (``plain_rows``); 1 means as efficient (issue 25 asks within 10% of
    its tree and ragged rows, issue 23 within 3% of its int64 rows)."""
    table = _by_shape(rows)
    plain = plain_rows(table)
    out = []
    for shape, c in table.items():
        row, spec = c.get("tuned"), parse_shape(shape)
        base = plain.get(plain_name(spec))
        if spec.mla and not spec.plain and base and _measured(row):
            out.append((shape, base["shape"], row["frac_roofline"] / base["frac_roofline"]))
    return out


def summary_markdown(
    rows: Sequence[dict[str, Any]], meta: dict[str, Any], ceilings: Ceilings
) -> str:
    lines = [
        "# mla_verify benchmark",
        "",
        f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, "
        f"CUDA {meta['cuda']}, flashinfer {meta['flashinfer']}, flash_mla {meta['flash_mla']}, "
        f"commit {meta['git_commit']}, {meta['date_utc']}",
        "",
        "Ceilings measured in this run: copy bandwidth "
        f"{_scaled(ceilings.copy_bw, 1e12, 2)} TB/s (best SM copy in a "
        "CUDA graph, read + write), bf16 matmul "
        f"{_scaled(ceilings.matmul_rate, 1e12, 0)} TFLOP/s "
        "(8192^3 torch.mm). Details: "
        + ", ".join(f"{k} {fmt(v)}" for k, v in ceilings.details.items()),
        "",
        "Times are microseconds per launch (median, p20-p80 over CUDA-graph replays; "
        "`eager` rows are per-call event timings). % roofline = max(bytes / copy BW, "
        "FLOPs / matmul rate) / time. t/t_tuned > 1 means tuned is faster.",
        "",
        "## Overview",
        "",
        "```",
        stdout_table(rows, ceilings),
        "```",
        "",
        "## Geomean of t_contender / t_tuned",
        "",
        "| contender | geomean t/t_tuned | shapes |",
        "|---|---|---|",
    ]
    for name, (gm, n) in tuned_geomeans(rows).items():
        lines.append(f"| {name} | {fmt(gm, 3)} | {n} |")
    pairs = paged_vs_flashmla(rows)
    if pairs:
        lines += [
            "",
            "## Paged: t_flashmla / t_paged on the same pages",
            "",
            f"Geomean {fmt(geomean([r for _, r in pairs]), 3)}, "
            f"lowest {fmt(min(r for _, r in pairs), 3)} (> 1: verify_mla_paged is faster).",
            "",
            "| shape | t_flashmla / t_paged |",
            "|---|---|",
        ]
        lines += [f"| {shape} | {fmt(ratio, 3)} |" for shape, ratio in pairs]
    kinds = kind_vs_plain(rows)
    if kinds:
        lines += [
            "",
            "## Tree and ragged rows: tuned % roofline over the plain row's",
            "",
            "| shape | plain row | ratio |",
            "|---|---|---|",
        ]
        lines += [f"| {shape} | {base} | {fmt(ratio, 3)} |" for shape, base, ratio in kinds]
    for shape, contenders in _by_shape(rows).items():
        any_row = next(iter(contenders.values()))
        lines += [
            "",
            f"## {shape}",
            "",
            f"H={any_row['num_heads']} L={any_row['draft_len']} bs={any_row['batch_size']}, "
            f"{any_row['ctx_kind']} prefixes: {any_row['prefix_tokens']} tokens "
            f"(min {any_row['prefix_min']}, max {any_row['prefix_max']}); "
            f"{fmt(any_row['bytes'] / 1e6, 1)} MB, {fmt(any_row['flops'] / 1e12, 3)} TFLOP; "
            f"{describe_call(parse_shape(shape))}",
            "",
            "| contender | status | median us | p20-p80 us | % copy BW | TFLOP/s | % roofline "
            "| t/t_tuned | rel err | config |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in contenders.items():
            if r["status"] == "ok":
                lines.append(
                    f"| {name} | ok ({r['timing']}) | {fmt(r['median_us'], 1)} "
                    f"| {fmt(r['p20_us'], 1)}-{fmt(r['p80_us'], 1)} "
                    f"| {pct(r['frac_copy_bw'])} | {_scaled(r['flop_per_s'], 1e12)} "
                    f"| {pct(r['frac_roofline'])} | {fmt(r['tuned_speedup'], 3)} "
                    f"| {fmt(r['rel_err'], 5)} | {config_text(r) or r['config_source'] or ''} |"
                )
            else:
                reason = str(r["reason"]).replace("|", "/").replace("\n", " ")[:200]
                lines.append(
                    f"| {name} | {r['status']} | - | - | - | - | - | - "
                    f"| {fmt(r['rel_err'], 5)} | {reason} |"
                )
    return "\n".join(lines) + "\n"


def stdout_table(rows: Sequence[dict[str, Any]], ceilings: Ceilings) -> str:
    """The short table printed last: tuned time and roofline share, and how
    many times slower each other contender is."""
    others = {c: max(13, len(c) + 3) for c in compared(rows)}  # name -> column width
    width = max([26] + [len(shape) + 2 for shape in _by_shape(rows)])
    header = f"{'shape':<{width}}{'tuned us':>10}{'%roof':>7}{'%BW':>7}" + "".join(
        f"{c + '/t':>{w}}" for c, w in others.items()
    )
    lines = [header, "-" * len(header)]
    for shape, contenders in _by_shape(rows).items():
        t = contenders.get("tuned")
        ok = t is not None and t["status"] == "ok"
        cells = [
            f"{shape:<{width}}",
            f"{fmt(t['median_us'], 1) if ok else (t['status'] if t else '-'):>10}",
            f"{pct(t['frac_roofline']) if ok else '-':>7}",
            f"{pct(t['frac_copy_bw']) if ok else '-':>7}",
        ]
        for c, w in others.items():
            r = contenders.get(c)
            if r is None:
                text = "-"
            elif r["status"] == "ok":
                text = fmt(r["tuned_speedup"], 2) if r["tuned_speedup"] else "ok"
            else:
                text = r["status"]
            cells.append(f"{text:>{w}}")
        lines.append("".join(cells))
    lines.append("")
    lines.append(
        "x/t = t_x / t_tuned (> 1: tuned is faster). Geomeans: "
        + ", ".join(
            f"{name} {fmt(gm, 3)} ({n} shapes)" for name, (gm, n) in tuned_geomeans(rows).items()
        )
    )
    pairs = paged_vs_flashmla(rows)
    if pairs:
        lines.append(
            f"paged vs FlashMLA (page 64, same pages): t_flashmla / t_paged geomean "
            f"{fmt(geomean([r for _, r in pairs]), 3)}, lowest "
            f"{fmt(min(r for _, r in pairs), 3)} ({len(pairs)} shapes)"
        )
    lines.append(
        f"ceilings: copy {_scaled(ceilings.copy_bw, 1e12, 2)} TB/s, "
        f"matmul {_scaled(ceilings.matmul_rate, 1e12, 0)} TFLOP/s"
    )
    return "\n".join(lines)


def write_outputs(
    rows: Sequence[dict[str, Any]],
    meta: dict[str, Any],
    ceilings: Ceilings,
    out_dir: Path,
    *,
    plot: bool,
) -> None:
    """This run's own files under ``out_dir``."""
    write_csv(rows, out_dir / "results.csv")
    write_json(rows, meta, ceilings, out_dir / "results.json")
    (out_dir / "summary.md").write_text(summary_markdown(rows, meta, ceilings), encoding="utf-8")
    if plot:
        try:
            # The module beside this script (run as a script, scripts/ is on the path).
            from bench_plot import plot_roofline
        except ImportError as exc:
            logger.info("no plot: %s", exc)
            return
        title = f"{meta['device']}, commit {meta['git_commit']}, {meta['date_utc']}"
        try:
            for path in plot_roofline(rows, out_dir, title=title, contenders=PLOT_CONTENDERS):
                logger.info("wrote %s", path)
        except Exception:  # a broken plot must not cost the tables
            logger.exception("plotting failed")
