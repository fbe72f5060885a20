"""scripts/bench_host.py on the CPU: the paired timing's bookkeeping (the
GPU hold replaced by nothing). The host times themselves need a GPU and
are the script's job, not a test's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_host  # noqa: E402  (scripts/ is not a package)


def _no_hold() -> None:
    pass


def test_host_us_counts_the_timed_calls_alone():
    made = []
    bench_host.host_us(lambda: made.append(1), calls=7, hold=_no_hold)
    assert len(made) == bench_host.WARMUP_CALLS + 7


def test_paired_takes_turns_and_reports_medians(monkeypatch):
    """Timings alternate between the two sides, and the ratio is the median
    of each pair's, not the ratio of the medians."""
    order = []
    times = {"this": iter([10.0, 10.0, 30.0]), "other": iter([20.0, 40.0, 30.0])}

    def fake_host_us(call, calls, hold):
        side = call()
        order.append(side)
        return next(times[side])

    monkeypatch.setattr(bench_host, "host_us", fake_host_us)
    result = bench_host.paired(lambda: "this", lambda: "other", repeats=3, calls=1, hold=_no_hold)
    assert order == ["this", "other"] * 3
    assert (result.this_us, result.other_us) == (10.0, 30.0)
    assert result.ratio == pytest.approx(2.0)  # pairs 2.0, 4.0, 1.0


def test_paired_without_a_revision_times_this_tree_alone(monkeypatch):
    timed = []

    def fake_host_us(call, calls, hold):
        timed.append(call())
        return 5.0

    monkeypatch.setattr(bench_host, "host_us", fake_host_us)
    result = bench_host.paired(lambda: "this", None, repeats=3, calls=2, hold=_no_hold)
    assert timed == ["this"] * 3
    assert (result.this_us, result.other_us, result.ratio) == (5.0, None, None)


def test_calls_of_a_paged_shape_give_each_package_both_entry_points():
    import torch

    import mla_verify

    calls = bench_host.calls_of("H8L2B2C128-page64", [mla_verify, mla_verify], torch.device("cpu"))
    assert sorted(calls) == ["verify_mla_fwd", "verify_mla_paged"]
    assert all(len(fns) == 2 and all(callable(f) for f in fns) for fns in calls.values())
