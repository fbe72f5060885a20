"""scripts/bench.py's shape specs and byte counts (CPU only; the timings
themselves need a GPU and are the benchmark's job, not a test's)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

BENCH_PATH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"
_spec = importlib.util.spec_from_file_location("mla_verify_bench", BENCH_PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # its dataclasses look their module up
_spec.loader.exec_module(bench)

SPECS = {
    "H16L4B32C16K": ("uniform", 16384, "bf16", "H16L4B32C16384"),
    "H16L4B32C16K-fp8": ("uniform", 16384, "fp8_e4m3", "H16L4B32C16384-fp8"),
    "H8L2B8Rlognormal2048-fp8": ("lognormal", 2048, "fp8_e4m3", "H8L2B8Rlognormal2048-fp8"),
    "H16L4B64Rlong64Kx512-fp8": ("long", 65536, "fp8_e4m3", "H16L4B64Rlong65536x512-fp8"),
}


@pytest.mark.parametrize("text, expected", SPECS.items(), ids=SPECS.keys())
def test_shape_spec_names_its_kv_dtype(text, expected):
    kind, ctx, kv_dtype, name = expected
    spec = bench.parse_shape(text)
    assert (spec.kind, spec.ctx, spec.kv_dtype, spec.name) == expected
    assert bench.parse_shape(spec.name) == spec  # the name parses back to the shape


@pytest.mark.parametrize("text", ["H16L4B32C16K-fp16", "H16L4B32C16K-", "H16L4B32-fp8"])
def test_bad_shape_spec_is_refused(text):
    with pytest.raises(ValueError, match="shape"):
        bench.parse_shape(text)


def test_fp8_kv_counts_one_byte_per_cache_element():
    # 1000 prefix tokens of 576 latent values: 2 bytes each in bf16, 1 in
    # fp8; q, the drafts and the output stay bf16 in both.
    lens = [600, 400]
    bf16 = bench.shape_work(16, 4, lens, kv_bytes=2)
    fp8 = bench.shape_work(16, 4, lens, kv_bytes=1)
    assert bf16.bytes - fp8.bytes == 1000 * 576
    assert bf16.flops == fp8.flops
    spec = bench.parse_shape("H16L4B2C500-fp8")
    assert spec.kv_bytes == 1 and bench.parse_shape("H16L4B2C500").kv_bytes == 2


def test_contenders_are_timed_in_rotating_rounds_and_pooled(monkeypatch):
    # Timed one after another, the contender timed first ran up to 12%
    # faster: each round starts with the next one, and every round's
    # replays count.
    calls = []

    def fake_time(contender, batch, ctx, row):
        calls.append(row["contender"])
        base = {"a": 10.0, "b": 20.0, "c": 30.0}[row["contender"]]
        return bench._summarise([base + len(calls)] * 4, "cudagraph", 1)

    monkeypatch.setattr(bench, "time_contender", fake_time)
    ctx = types.SimpleNamespace(rounds=3, ceilings=bench.Ceilings(None, None))
    rows = [{"contender": n, "status": None, "bytes": 1, "flops": 1} for n in "abc"]
    bench.time_interleaved([(row, object()) for row in rows], batch=None, ctx=ctx)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    a = rows[0]
    assert a["status"] == "ok" and a["replays"] == 12
    # a's rounds ran as calls 1, 6 and 8: samples 11, 16 and 18 (4 each)
    assert (a["p20_us"], a["median_us"], a["p80_us"]) == (11.0, 16.0, 18.0)
