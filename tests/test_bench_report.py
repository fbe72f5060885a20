"""scripts/bench_report.py on a small CSV written here: the rows it picks,
how it classes them, and the ratios it prints. CPU only."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_output  # noqa: E402  (scripts/ is not a package)
import bench_report  # noqa: E402
import bench_shapes  # noqa: E402

RUN = "2026-12-04T12:00:00+00:00"


def _row(shape, contender, us, *, commit="abc1234", run=RUN, status="ok"):
    spec = bench_shapes.parse_shape(shape)
    flops = 2.0 * spec.num_heads * spec.draft_len * 16384 * spec.batch_size * 1088
    return {
        "date_utc": run,
        "git_commit": commit,
        "shape": shape,
        "contender": contender,
        "status": status,
        "num_heads": spec.num_heads,
        "draft_len": spec.draft_len,
        "batch_size": spec.batch_size,
        "ctx_kind": "uniform" if "R" not in shape.split("B")[1] else "lognormal",
        "ctx": 16384,
        "median_us": us,
        "bytes": 4.0e12 * 100e-6,
        "flops": flops,
        "flop_per_s": flops / (us * 1e-6),
        "bytes_per_s": 4.0e12 * 100 / us,
        "frac_copy_bw": 0.9 * 100 / us,
        "frac_roofline": 0.5,
    }


@pytest.fixture
def results(tmp_path):
    rows = [
        # compute-bound (H*L = 256), batch 32: tuned 100, FlashMLA 80, FlashInfer 110
        _row("H64L4B32C16384", "tuned", 100.0),
        _row("H64L4B32C16384", "flashmla", 80.0),
        _row("H64L4B32C16384", "flashinfer", 110.0),
        # memory-bound (H*L = 16), batch 8
        _row("H8L2B8C16384", "tuned", 100.0),
        _row("H8L2B8C16384", "flashmla", 90.0),
        _row("H8L2B8C16384", "flashinfer", 100.0),
        # batch 1: in the ratios, not in the classes
        _row("H8L2B1C16384", "tuned", 10.0),
        _row("H8L2B1C16384", "flashmla", 20.0),
        # a ragged batch: plain, but not a grid row of a class
        _row("H64L4B32Rlognormal16384", "tuned", 100.0),
        _row("H64L4B32Rlognormal16384", "flashmla", 50.0),
        # other kinds of call: not plain, not fastest-on; set against the
        # plain shape's efficiency where it is there
        _row("H16L4B32C16384-tree", "tuned", 100.0),
        _row("H64L4B32C16384-ragged", "tuned", 125.0),
        _row("H64L4B32C16384-page64", "paged", 90.0),
        _row("H64L4B32C16384-page64", "flashmla", 72.0),
        _row("H64L4B32C16384-page64", "tuned", 95.0),
        _row("H64L4B32C16384-i64", "tuned", 104.0),
        # left out: another commit, another run, a failed row
        _row("H64L4B32C16384", "flashmla", 1.0, commit="other"),
        _row("H64L4B32C16384", "flashmla", 1.0, run="2026-12-04T13:00:00+00:00"),
        _row("H8L2B8C16384", "flashinfer", 1.0, status="FAILED"),
    ]
    path = tmp_path / "results.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_picks_the_runs_rows_and_classes_them(results):
    rows = bench_report.load_rows(results, "abc1234", [RUN])
    assert len(rows) == 16
    table = bench_output._by_shape(rows)
    assert table["H64L4B32C16384"]["flashmla"]["median_us"] == "80.0"
    classes = {s: bench_report.bound_class(per["tuned"]) for s, per in table.items()}
    assert classes == {
        "H64L4B32C16384": "compute",
        "H8L2B8C16384": "memory",
        "H8L2B1C16384": None,  # batch 1
        "H64L4B32Rlognormal16384": None,  # ragged lengths
        "H16L4B32C16384-tree": None,  # not plain
        "H64L4B32C16384-ragged": None,
        "H64L4B32C16384-page64": None,
        "H64L4B32C16384-i64": None,
    }


def test_a_commit_is_named_by_its_short_or_full_hash(results):
    # the rows hold "abc1234"; a bench run outside git records the full hash
    assert len(bench_report.load_rows(results, "abc1234ffee", [RUN])) == 16
    assert bench_report.same_commit("abc1234ffee", "abc1234")
    assert not bench_report.same_commit("abc1234", "abc1235")
    assert not bench_report.same_commit("", "abc1234")  # a row outside git


def test_a_page_rows_token_indexed_call_stands_for_a_missing_plain_row():
    # The extra set runs H8L2B64C64K's -page64 row, not its plain row: the
    # -i64 row is set against the -page row's tuned call (the same call on
    # the same values), as the bench's own summary sets it.
    table = bench_output._by_shape(
        [
            _row("H8L2B64C65536-page64", "paged", 95.0),
            _row("H8L2B64C65536-page64", "tuned", 100.0),
            _row("H8L2B64C65536-i64", "tuned", 102.0),
        ]
    )
    lines = bench_report.every_kind(table, copy=4.0e12, matmul=7.5e14)
    assert "| H8L2B64C65536-i64 | tuned | 102.0 | 50.0 |  |  | 0.980 |" in lines
    assert "| H8L2B64C65536-page64 | paged | 95.0 | 50.0 |  | 100.0 | 1.053 |" in lines


def test_report_prints_rates_winners_and_ratios(results, capsys):
    assert bench_report.main(["--commit", "abc1234", "--run", RUN, "--csv", str(results)]) == 0
    text = capsys.readouterr().out
    # FlashMLA: 80 us on the compute-bound row, 2 H L ctx bs (576 + 512) FLOPs.
    flops = 2.0 * 64 * 4 * 16384 * 32 * 1088 / 80e-6
    assert f"| flashmla | {flops / 1e12:.0f} TFLOP/s" in text
    assert f"{100 * flops / 789e12:.0f}% of 789, 1 rows" in text
    assert "| flashinfer |" in text and "| tuned |" in text
    # Fastest: FlashMLA on the grid rows and the ragged one, tuned at batch 1.
    assert "Fastest on (of 4 plain shapes): flashmla 3, tuned 1" in text
    # The ratios take the -page row too (FlashMLA against the token-indexed call).
    ratios = [0.8, 0.9, 2.0, 0.5, 72 / 95]
    geomean = math.exp(sum(map(math.log, ratios)) / 5)
    assert (
        f"t_flashmla / t_tuned: geomean {geomean:.3f} over 5 shapes, lowest 0.50 "
        "(H64L4B32Rlognormal16384), 3 below 0.85"
    ) in text
    assert "t_flashinfer / t_tuned: geomean 1.049 over 2 shapes, lowest 1.00" in text
    assert "| 32 | 0.80 (0.80) / 1.10 (1.10) | 0.50 (0.50) |" in text
    # The other kinds: the paged call on the -page row, with FlashMLA and the
    # token-indexed call beside it; efficiencies against the plain row's
    # (the same work in 100 us): 100 / 125, 100 / 104 and 100 / 90. The tree row's
    # plain shape is not in the run.
    assert "| H64L4B32C16384-page64 | paged | 90.0 | 50.0 | 72.0 | 95.0 | 1.111 |" in text
    assert "| H64L4B32C16384-ragged | tuned | 125.0 | 50.0 |  |  | 0.800 |" in text
    assert "| H64L4B32C16384-i64 | tuned | 104.0 | 50.0 |  |  | 0.962 |" in text
    assert "| H16L4B32C16384-tree | tuned | 100.0 | 50.0 |  |  |  |" in text


def test_no_rows_says_so(results, capsys):
    assert bench_report.main(["--commit", "nothing", "--csv", str(results)]) == 1
    assert "no ok rows of commit 'nothing'" in capsys.readouterr().err


def test_bad_input_names_the_argument(cli_error, tmp_path):
    missing = str(tmp_path / "none.csv")
    assert "--csv: expected a CSV file" in cli_error(
        bench_report.main, ["--commit", "x", "--csv", missing]
    )
    assert "--matmul: expected a positive rate, got -1.0" in cli_error(
        bench_report.main, ["--commit", "x", "--matmul", "-1"]
    )
    assert "--copy: expected a positive rate, got 0.0" in cli_error(
        bench_report.main, ["--commit", "x", "--copy", "0"]
    )
