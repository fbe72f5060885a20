"""The tuner end to end (CPU interpreter, injected timer), resuming after a
kill, the model-derived AMD tables, and the shipped tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch

from mla_verify import code_hash, hopper, lookup, tables, tune
from mla_verify.code_hash import KERNEL_HASH, KERNEL_HASHES
from mla_verify.config import (
    HOPPER_KERNELS,
    VerifyConfig,
    default_config,
    hopper_config,
    kernel_family,
    triton_default_config,
)
from mla_verify.search_space import MIN_SHARE_CANDIDATES

REPO = Path(__file__).resolve().parent.parent
TINY = ["--heads", "2", "--draft-lens", "2", "--batch-sizes", "1,2", "--contexts", "40"]
ONE_BUCKET = ["--heads", "2", "--draft-lens", "2", "--batch-sizes", "1"]


def _pythonpath(first: Path) -> str:
    """``first`` ahead of whatever PYTHONPATH already holds (dependencies)."""
    return os.pathsep.join([str(first), *filter(None, [os.environ.get("PYTHONPATH")])])


def fake_timer(config: VerifyConfig, batches) -> float:
    """Deterministic 'time' that favours BLOCK_N 32, 3 stages, 2 splits."""
    return (
        100.0
        + (config.BLOCK_N != 32) * 30
        + (config.num_stages != 3) * 20
        + abs(config.NUM_KV_SPLITS - 2) * 10
        + (config.num_warps != 4) * 5
    )


def hopper_flat_triton_bn32(config: VerifyConfig, batches) -> float:
    """Every Hopper config alike (its default stays); on the Triton kernel,
    BLOCK_N 32 wins."""
    return 40.0 if config.kernel != "triton" else 100.0 - 20 * (config.BLOCK_N == 32)


def run(argv, out_dir, device, timer=fake_timer, arch="cpu_test"):
    args = tune.parse_args(argv)
    return tune.run_tuning(
        args,
        arch=arch,
        device=device,
        device_name="test device",
        sm_count=2,
        timer=timer,
        out_dir=out_dir,
    )


@pytest.fixture
def table_env(tmp_path, monkeypatch):
    """Lookups see only the tables under tmp_path/out."""
    out = tmp_path / "out"
    monkeypatch.setenv(tables.ENV_VAR, str(out))
    monkeypatch.setattr(tables, "user_table_dir", lambda: tmp_path / "user")
    monkeypatch.setattr(tables, "shipped_table_dir", lambda: tmp_path / "shipped")
    yield out
    monkeypatch.undo()
    lookup.reload_tables()


def test_time_limit_counts_the_compile_step(table_env, monkeypatch):
    """--time-limit is wall time from the start: a limit spent while the
    kernels compile (on a GPU; a 0.2 s stand-in here) tunes nothing."""
    monkeypatch.setattr(tune, "precompile", lambda *args, **kwargs: time.sleep(0.2))
    assert run([*TINY, "--time-limit", "0.1"], table_env, "cuda") == []
    assert not (table_env / "cpu_test.json").exists()


def test_tiny_tune_writes_a_table_the_lookup_reads(table_env, device):
    results = run(TINY, table_env, device)
    assert [(r.key, r.batch_size) for r in results] == [("H2_L2_bf16", 1), ("H2_L2_bf16", 2)]
    for r in results:
        # The fake timer's optimum among the candidates, found by the search.
        assert (r.config.BLOCK_N, r.config.num_stages, r.config.num_warps) == (32, 3, 4)
        # Times are the injected timer's values: the table keeps what it returned.
        assert r.tuned_us == pytest.approx(fake_timer(r.config, None))
        assert r.config != tune.default_config(2, 2, r.batch_size, "cpu_test")
    table = json.loads((table_env / "cpu_test.json").read_text())
    tables.validate_table(table, expected_arch="cpu_test")
    bucket = table["entries"]["H2_L2_bf16"]["buckets"]["2"]
    assert bucket["tuned_us"] == pytest.approx(results[1].tuned_us, abs=0.01)
    assert table["metadata"]["kernel_hash"] == KERNEL_HASH
    # Each record names the code of its kernel family it was measured with.
    assert bucket["kernel_hash"] == KERNEL_HASHES["triton"]

    lookup.reload_tables()
    config, source = lookup.resolve_config(2, 2, 2, arch="cpu_test")
    assert config == results[1].config
    assert "cpu_test.json entry H2_L2_bf16, bucket 2" in source


def test_tuned_hopper_kernel_round_trips_through_the_table(table_env, device):
    """An sm90 search offers the Gluon kernel and its share floors; a table
    that picks them writes, validates and reads back (on CPU the config runs
    the Triton fallback)."""
    floor = MIN_SHARE_CANDIDATES[-1]
    prefers_columns_and_floor = lambda config, batches: (  # noqa: E731
        80.0 - 40 * (config.kernel == "gluon_sm90") - 10 * (config.MIN_SHARE == floor)
    )
    results = run(TINY, table_env, device, timer=prefers_columns_and_floor, arch="sm90")
    assert [(r.config.kernel, r.config.MIN_SHARE) for r in results] == [("gluon_sm90", floor)] * 2
    table = json.loads((table_env / "sm90.json").read_text())
    tables.validate_table(table, expected_arch="sm90")
    lookup.reload_tables()
    assert lookup.resolve_config(2, 2, 2, arch="sm90")[0] == results[1].config


def test_sm90_keeps_the_triton_winner_beside_the_hopper_one(table_env, device):
    """On sm90 the Triton kernel is tuned too, against its own default, and
    its winner sits beside the Hopper winner in the table and the lookup."""

    results = run(TINY, table_env, device, timer=hopper_flat_triton_bn32, arch="sm90")
    for r in results:
        assert r.config.kernel in HOPPER_KERNELS
        assert (r.triton.config.kernel, r.triton.config.BLOCK_N) == ("triton", 32)
        assert r.triton.tuned_us == pytest.approx(80.0)
        # timed against the Triton kernel's default, BLOCK_N 64 on sm90
        assert triton_default_config(2, 2, r.batch_size, "sm90").BLOCK_N == 64
        assert r.triton.default_us == pytest.approx(100.0)
    table = json.loads((table_env / "sm90.json").read_text())
    tables.validate_table(table, expected_arch="sm90")
    bucket = table["entries"]["H2_L2_bf16"]["buckets"]["2"]
    assert bucket["triton"]["config"] == results[1].triton.config.to_dict()
    assert bucket["triton"]["default_us_by_context"] == [100.0]
    assert bucket["kernel_hash"] == KERNEL_HASHES["gluon_sm90"]
    assert bucket["triton"]["kernel_hash"] == KERNEL_HASHES["triton"]
    lookup.reload_tables()
    assert lookup.block_config(2, 2, 2, arch="sm90") == results[1].config
    assert lookup.block_config(2, 2, 2, arch="sm90", kernel="triton") == results[1].triton.config


def test_a_triton_winner_the_own_search_left_out_takes_the_own_record(table_env, device):
    """The own search carries only its fastest tile at the representative
    batch (--top-k 1: a Hopper config) to the split search; where the Triton
    search beside finds a config that beats the own winner side by side
    (here one split), that config is the bucket's own record too, stamped
    with the Triton kernel's hash, and the default keeps its time."""

    def timer(config, batches):
        if config.kernel != "triton":
            return 40.0
        return 100.0 - 20 * (config.BLOCK_N == 32) - 55 * (config.NUM_KV_SPLITS == 1)

    results = run([*TINY, "--top-k", "1"], table_env, device, timer=timer, arch="sm90")
    table = json.loads((table_env / "sm90.json").read_text())
    tables.validate_table(table, expected_arch="sm90")
    for r in results:
        winner = r.triton.config
        assert (winner.kernel, winner.BLOCK_N, winner.NUM_KV_SPLITS) == ("triton", 32, 1)
        assert r.config == winner
        assert r.tuned_us == pytest.approx(25.0)
        assert r.default_us == pytest.approx(40.0)  # the Hopper default's
        bucket = table["entries"]["H2_L2_bf16"]["buckets"][str(r.batch_size)]
        assert bucket["config"] == winner.to_dict()
        assert bucket["kernel_hash"] == KERNEL_HASHES["triton"]
    lookup.reload_tables()
    assert lookup.block_config(2, 2, 2, arch="sm90") == results[1].triton.config


def test_the_own_record_stays_where_the_triton_winner_does_not_beat_it(table_env, device):
    """A Triton winner slower than the own winner (or within the margin of
    it) leaves the own record the Hopper kernel's."""

    def timer(config, batches):
        if config.kernel != "triton":
            return 40.0
        return 100.0 - 20 * (config.BLOCK_N == 32) - 40.5 * (config.NUM_KV_SPLITS == 1)

    results = run([*TINY, "--top-k", "1"], table_env, device, timer=timer, arch="sm90")
    for r in results:
        assert r.config.kernel in HOPPER_KERNELS
        assert r.triton.tuned_us == pytest.approx(39.5)


def test_after_a_triton_kernel_change_a_rerun_searches_only_its_records(
    table_env, device, monkeypatch
):
    """A rerun after a change to the Triton kernel alone (its family's hash
    changed, the Hopper kernel's not) times only Triton configs, rewrites
    the Triton records and keeps the Hopper records beside them as they
    were; then nothing is left to do."""

    run(TINY, table_env, device, timer=hopper_flat_triton_bn32, arch="sm90")
    before = json.loads((table_env / "sm90.json").read_text())["entries"]["H2_L2_bf16"]
    monkeypatch.setitem(code_hash.KERNEL_HASHES, "triton", "feedfeedfeedfeed")
    timed = []

    def watched(config, batches):
        timed.append(config)
        return hopper_flat_triton_bn32(config, batches)

    results = run(TINY, table_env, device, timer=watched, arch="sm90")
    assert timed and {c.kernel for c in timed} == {"triton"}
    assert [(r.batch_size, r.config.kernel) for r in results] == [(1, "triton"), (2, "triton")]
    after = json.loads((table_env / "sm90.json").read_text())["entries"]["H2_L2_bf16"]
    for bs in ("1", "2"):
        old, new = before["buckets"][bs], after["buckets"][bs]
        assert {k: v for k, v in new.items() if k != "triton"} == {
            k: v for k, v in old.items() if k != "triton"
        }
        assert new["kernel_hash"] == KERNEL_HASHES["gluon_sm90"]
        assert new["triton"]["kernel_hash"] == "feedfeedfeedfeed"
        assert new["triton"]["config"] == old["triton"]["config"]
    assert run(TINY, table_env, device, timer=watched, arch="sm90") == []


def test_remeasure_times_the_stale_records_configs_again_instead_of_searching(
    table_env, device, monkeypatch
):
    """After a change to both kernel families, --remeasure times each stale
    record's config and the built-in default only: a config that still wins
    stays with its new times and this code's hash; one the default now
    beats by the margin gives way to it; then nothing is left to do."""

    run(TINY, table_env, device, timer=hopper_flat_triton_bn32, arch="sm90")
    before = json.loads((table_env / "sm90.json").read_text())["entries"]["H2_L2_bf16"]
    recorded = {
        (int(bs), k): tables.Record.from_json(r).config
        for bs, bucket in before["buckets"].items()
        for k, r in tables.bucket_records(bucket).items()
    }
    for family in ("gluon_sm90", "triton"):
        monkeypatch.setitem(code_hash.KERNEL_HASHES, family, "feedfeedfeedfeed")
    slower_at_2 = recorded[(2, "triton")]
    timed = []

    def watched(config, batches):
        timed.append(config)
        if config == slower_at_2 and batches[0].batch_size == 2:
            return 200.0  # the recorded Triton winner at batch 2 lost its edge
        return hopper_flat_triton_bn32(config, batches)

    results = run([*TINY, "--remeasure"], table_env, device, timer=watched, arch="sm90")
    defaults = {
        (bs, k): (triton_default_config if k == "triton" else default_config)(2, 2, bs, "sm90")
        for bs in (1, 2)
        for k in (None, "triton")
    }
    assert set(timed) == set(recorded.values()) | set(defaults.values())
    after = json.loads((table_env / "sm90.json").read_text())["entries"]["H2_L2_bf16"]
    for (bs, k), config in recorded.items():
        record = tables.Record.from_json(tables.bucket_records(after["buckets"][str(bs)])[k])
        assert record.kernel_hash == "feedfeedfeedfeed"
        expected = defaults[(bs, k)] if (bs, k) == (2, "triton") else config
        assert record.config == expected, (bs, k)
    assert [r.batch_size for r in results] == [1, 2]
    metadata = json.loads((table_env / "sm90.json").read_text())["metadata"]
    assert metadata["timing"] == tune.TIMING_METHOD + tune.REMEASURE_METHOD
    assert run([*TINY, "--remeasure"], table_env, device, timer=watched, arch="sm90") == []


def test_remeasure_compiles_only_the_configs_it_times(monkeypatch):
    """precompile for an entry whose Hopper records are timed again and
    whose Triton search runs: the Hopper default and the recorded config,
    every Triton tile and the Triton default; not the other Hopper tile."""
    compiled = []
    monkeypatch.setattr(tune, "_compile_worker", lambda jobs: compiled.extend(jobs) or len(jobs))
    recorded = default_config(16, 4, 8, "sm90").with_splits(2)  # the Hopper default won
    dims = (576, 512)
    entry = (16, 4, "bf16", dims, [None, "triton"], ["triton"], [recorded])
    tune.precompile([entry], "sm90", workers=1)
    configs = {VerifyConfig.from_dict(cfg) for _, _, _, cfg, _ in compiled}
    triton_tiles = tune.searched_tiles(16, 4, "bf16", "sm90", dims, "triton")
    hopper_tiles = tune.searched_tiles(16, 4, "bf16", "sm90", dims, None)
    expected = {
        recorded,
        default_config(16, 4, 1, "sm90").with_splits(2),
        triton_default_config(16, 4, 1, "sm90").with_splits(2),
        *(t.with_splits(2) for t in triton_tiles),
    }
    assert {t.with_splits(2) for t in hopper_tiles} - expected, "Hopper tiles a search compiles"
    assert configs == expected


def test_remeasure_and_redo_do_not_go_together(cli_error):
    assert "--remeasure: not with --redo" in cli_error(tune.main, [*TINY, "--remeasure", "--redo"])


def test_amd_search_times_only_tiles_that_fit_and_tries_compiler_options(
    table_env, device, monkeypatch
):
    """On an AMD arch a tile the compile check rejects is never timed (a
    stand-in check here: the interpreter cannot compile), and the finalists
    are timed with the AMD compiler options too."""
    from mla_verify import aot

    monkeypatch.setattr(
        aot, "fits", lambda config, *args: config.BLOCK_N == 16 and config.waves_per_eu != 1
    )
    timed = []

    def timer(config, batches):
        timed.append(config)
        return 100.0 - 10 * (config.matrix_instr_nonkdim == 16) - 5 * (config.num_stages == 2)

    results = run(TINY, table_env, device, timer=timer, arch="gfx950")
    assert timed and all(c.BLOCK_N == 16 and c.waves_per_eu != 1 for c in timed)
    assert {c.waves_per_eu for c in timed} == {None, 2}
    for r in results:
        assert (r.config.matrix_instr_nonkdim, r.config.num_stages) == (16, 2)
        assert r.triton is None  # the Triton kernel is the arch's own: one search
    table = json.loads((table_env / "gfx950.json").read_text())
    assert table["entries"]["H2_L2_bf16"]["buckets"]["1"]["config"]["matrix_instr_nonkdim"] == 16


def test_default_kept_when_tuning_does_not_beat_it(table_env, device):
    flat = lambda config, batches: 50.0  # noqa: E731
    results = run(TINY, table_env, device, timer=flat)
    for r in results:
        assert r.config == tune.default_config(2, 2, r.batch_size, "cpu_test")
        assert r.tuned_us == r.default_us == pytest.approx(50.0)


def test_beats_default_by_the_mean_or_by_a_win_that_ties_elsewhere():
    def beats(tuned, default=(100.0, 100.0)):
        return tune.beats_default(tune.Timing(tuned), tune.Timing(default), margin=0.03)

    assert beats((90.0, 98.0))  # by the margin on the geometric mean
    assert beats((78.0, 108.0))  # a trade whose net gain passes the margin
    assert beats((95.0, 100.0))  # a share floor's gain at short contexts, a tie at long
    assert beats((95.0, 102.0))  # within the margin where it loses
    assert not beats((98.0, 98.0))  # faster everywhere, by less than the margin
    assert not beats((90.0, 105.0))  # a trade whose net gain is under the margin
    assert not beats((96.0, 104.5))  # slower on the geometric mean


def _context_of(batches) -> int:
    return batches[0].prefix_lens[0]


def test_a_config_that_wins_at_one_context_and_ties_at_the_other_is_kept(table_env, device):
    """5% faster at the short context, a tie at the long one: 2.5% on the
    geometric mean, less than the margin, yet the bucket keeps it; the table
    records the times of each context."""
    default = tune.default_config(2, 2, 1, "cpu_test")
    timer = lambda config, batches: (  # noqa: E731
        95.0 if config != default and _context_of(batches) == 40 else 100.0
    )
    (result,) = run([*ONE_BUCKET, "--contexts", "40,72"], table_env, device, timer=timer)
    assert result.config != default
    assert result.tuned.per_context == pytest.approx((95.0, 100.0))
    bucket = json.loads((table_env / "cpu_test.json").read_text())["entries"]["H2_L2_bf16"]
    bucket = bucket["buckets"]["1"]
    assert bucket["context_lens"] == [40, 72]
    assert bucket["tuned_us_by_context"] == [95.0, 100.0]
    assert bucket["default_us_by_context"] == [100.0, 100.0]


def test_a_lucky_timing_does_not_beat_the_default(table_env, device):
    """A candidate that reads fast once (the fastest of several noisy
    timings) is timed again beside the default, and the default stays."""
    default = tune.default_config(2, 2, 1, "cpu_test")
    lucky = []  # problem sets (kept alive: ids stay unique) that had their lucky read

    def timer(config, batches):
        if config != default and not any(b is batches for b in lucky):
            lucky.append(batches)
            return 50.0
        return 100.0

    (result,) = run([*ONE_BUCKET, "--contexts", "40"], table_env, device, timer=timer)
    assert result.config == default
    assert result.tuned_us == result.default_us == pytest.approx(100.0)


def test_a_buckets_first_timing_is_not_the_defaults(table_env, device):
    """The first timing on a bucket's new problems reads slow; the default
    is timed again after it. Every candidate is slower than the default, so
    no confirmation runs: the default's recorded time is its search time,
    which must not be the slow first one."""
    seen = []  # problem sets timed so far (kept alive: ids stay unique)

    def timer(config, batches):
        first = not any(b is batches for b in seen)
        seen.append(batches)
        if first:
            return 130.0
        default = tune.default_config(2, 2, batches[0].batch_size, "cpu_test")
        return 100.0 if config == default else 140.0

    for result in run(TINY, table_env, device, timer=timer):
        assert result.config == tune.default_config(2, 2, result.batch_size, "cpu_test")
        assert result.tuned_us == result.default_us == pytest.approx(100.0)


def test_a_derived_table_in_the_output_is_all_to_tune(tmp_path):
    """Tuning with --out configs on the hardware whose shipped table is
    derived from the model (same kernel hash, unmeasured) tunes every
    bucket; a measured table of this kernel resumes."""
    args = tune.parse_args(TINY)
    path = tmp_path / "gfx950.json"
    body = {"num_heads": 2, "draft_len": 2, "kv_dtype": "bf16"}
    body["buckets"] = {"1": tables.bucket_json(tables.Record(tune.default_config(2, 2, 1, "x")))}
    for measured, todo in ((False, [1, 2]), (True, [2])):
        meta = {"arch": "gfx950", "kernel_hash": KERNEL_HASH, "measured": measured}
        if measured:
            body["buckets"]["1"] |= {"tuned_us": 10.0, "default_us": 10.0}
        tables.write_entries(path, "gfx950", meta, {"H2_L2_bf16": body})
        [work] = tune.pending_work(args, path)
        assert (work.heads, work.draft_len, work.kv_dtype, work.head_dims) == (2, 2, "bf16", MLA)
        assert work.searches == {b: (None,) for b in todo} and work.kept == {}


MLA = (576, 512)


def sm90_bucket(bs: int, hopper_hash: str, triton_hash: str | None) -> dict:
    """A measured sm90 bucket: the Hopper kernel's record stamped
    ``hopper_hash``, and the Triton kernel's beside it stamped
    ``triton_hash`` (none where None)."""
    hopper_record = tables.Record(hopper_config(2, 2, bs), 10.0, 12.0, kernel_hash=hopper_hash)
    triton = triton_default_config(2, 2, bs, "sm90")
    triton_record = tables.Record(triton, 20.0, 25.0, kernel_hash=triton_hash)
    return tables.bucket_json(hopper_record, triton_record if triton_hash else None)


CURRENT = (KERNEL_HASHES["gluon_sm90"], KERNEL_HASHES["triton"])
OLD = "0" * 16  # the hash of code since changed
RESUME = {
    # bucket 1's (Hopper, Triton) record hashes (None: no bucket 1), options
    # -> searches left, by bucket (bucket 2's records are current)
    "all_current": (CURRENT, [], {}),
    "triton_changed": ((CURRENT[0], OLD), [], {1: ("triton",)}),
    "gluon_changed": ((OLD, CURRENT[1]), [], {1: (None,)}),
    "both_changed": ((OLD, OLD), [], {1: (None, "triton")}),
    # a bucket tuned with --own-kernel-only gets no Triton search on resume
    "no_triton_record": ((CURRENT[0], None), [], {}),
    "triton_changed_own_kernel_only": ((CURRENT[0], OLD), ["--own-kernel-only"], {}),
    "bucket_missing": (None, [], {1: (None, "triton")}),
    "redo": (CURRENT, ["--redo"], {1: (None, "triton"), 2: (None, "triton")}),
    # --triton-only: the Triton search alone where the bucket is held
    "no_triton_record_triton_only": ((CURRENT[0], None), ["--triton-only"], {1: ("triton",)}),
    "both_changed_triton_only": ((OLD, OLD), ["--triton-only"], {1: ("triton",)}),
    "all_current_triton_only": (CURRENT, ["--triton-only"], {}),
    "bucket_missing_triton_only": (None, ["--triton-only"], {1: (None, "triton")}),
    "redo_triton_only": (CURRENT, ["--redo", "--triton-only"], {1: ("triton",), 2: ("triton",)}),
}


@pytest.mark.parametrize("bucket1, flags, searches", RESUME.values(), ids=RESUME.keys())
def test_resume_searches_only_the_stale_records(tmp_path, bucket1, flags, searches):
    """pending_work on sm90 (the Hopper kernel, the Triton kernel beside):
    a bucket runs only the searches whose records are stale or missing,
    and keeps the others as they are."""
    args = tune.parse_args(["--heads", "2", "--draft-lens", "2", "--batch-sizes", "1,2", *flags])
    path = tmp_path / "sm90.json"
    buckets = {"2": sm90_bucket(2, *CURRENT)}
    if bucket1 is not None:
        buckets["1"] = sm90_bucket(1, *bucket1)
    body = {"num_heads": 2, "draft_len": 2, "kv_dtype": "bf16", "buckets": buckets}
    meta = {"arch": "sm90", "kernel_hash": KERNEL_HASH, "measured": True}
    tables.write_entries(path, "sm90", meta, {"H2_L2_bf16": body})
    work = tune.pending_work(args, path)
    assert {b: s for w in work for b, s in w.searches.items()} == searches
    for w in work:
        for bs, bucket_searches in w.searches.items():
            kept = w.kept.get(bs, {})
            bucket = buckets.get(str(bs))
            records = {} if bucket is None else tables.bucket_records(bucket)
            # every record the bucket has that no search replaces, as it was
            assert set(kept) == set(records) - set(bucket_searches)
            for search, record in kept.items():
                assert record == tables.Record.from_json(records[search])


@pytest.mark.parametrize(
    "own_hash, flags, searches",
    [
        (OLD, ["--triton-only"], {1: (None, "triton")}),
        (KERNEL_HASHES["triton"], ["--triton-only"], {}),
        (KERNEL_HASHES["triton"], ["--triton-only", "--redo"], {1: (None, "triton")}),
    ],
    ids=["stale", "current", "redo"],
)
def test_triton_only_searches_in_full_a_bucket_whose_own_record_is_a_triton_config(
    tmp_path, own_hash, flags, searches
):
    """--triton-only keeps a held bucket's own record as it is, unless that
    record is itself a Triton config (the Triton kernel won the bucket): it
    goes stale with the Triton records, and the bucket runs both searches,
    since the Hopper kernel may win it now."""
    args = tune.parse_args(["--heads", "2", "--draft-lens", "2", "--batch-sizes", "1", *flags])
    path = tmp_path / "sm90.json"
    triton = triton_default_config(2, 2, 1, "sm90")
    own = tables.Record(triton, 15.0, 12.0, kernel_hash=own_hash)
    beside = tables.Record(triton, 15.0, 25.0, kernel_hash=own_hash)
    body = {
        "num_heads": 2,
        "draft_len": 2,
        "kv_dtype": "bf16",
        "buckets": {"1": tables.bucket_json(own, beside)},
    }
    meta = {"arch": "sm90", "kernel_hash": KERNEL_HASH, "measured": True}
    tables.write_entries(path, "sm90", meta, {"H2_L2_bf16": body})
    work = tune.pending_work(args, path)
    assert {b: s for w in work for b, s in w.searches.items()} == searches


def test_resume_of_a_legacy_table_keeps_its_meaning(tmp_path):
    """Records without a hash of their own date from the table's combined
    one: current where it is this code's, all to search where it is not,
    and a record a run keeps without searching it stays stale."""
    path = tmp_path / "sm90.json"
    body = {"num_heads": 2, "draft_len": 2, "kv_dtype": "bf16"}
    body["buckets"] = {"1": sm90_bucket(1, *CURRENT)}
    del body["buckets"]["1"]["kernel_hash"], body["buckets"]["1"]["triton"]["kernel_hash"]
    for table_hash, searches in ((KERNEL_HASH, []), (OLD, [{1: (None, "triton")}])):
        meta = {"arch": "sm90", "kernel_hash": table_hash, "measured": True}
        tables.write_entries(path, "sm90", meta, {"H2_L2_bf16": body})
        work = tune.pending_work(tune.parse_args(ONE_BUCKET), path)
        assert [w.searches for w in work] == searches
    [work] = tune.pending_work(tune.parse_args([*ONE_BUCKET, "--own-kernel-only"]), path)
    assert work.searches == {1: (None,)}
    assert work.kept[1]["triton"].kernel_hash == OLD  # dated: stays stale once written


def test_check_reports_stale_records_per_family():
    import triton

    from mla_verify import tune_report

    buckets = {"1": sm90_bucket(1, CURRENT[0], OLD), "2": sm90_bucket(2, *CURRENT)}
    body = {"num_heads": 2, "draft_len": 2, "kv_dtype": "bf16", "buckets": buckets}
    versions = {"triton": triton.__version__, "torch": torch.__version__}
    meta = {"arch": "sm90", "kernel_hash": KERNEL_HASH, "measured": True} | versions
    table = {"metadata": meta, "entries": {"H2_L2_bf16": body}}
    compared, differs = tune_report._metadata_fit(table, None)
    assert compared == ["kernel", "triton", "torch"]
    assert differs == [f"stale: 1 of 2 triton records (this code: triton {CURRENT[1]})"]
    buckets["1"] = sm90_bucket(1, *CURRENT)
    assert tune_report._metadata_fit(table, None)[1] == []


def test_resume_after_kill(table_env, device):
    """A tuner killed (no clean-up at all) after its second bucket keeps the
    buckets written so far; a rerun tunes only the rest."""
    grid = ["--heads", "2", "--draft-lens", "1,2", "--batch-sizes", "1,2", "--contexts", "40"]
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from mla_verify import tune
        timer = lambda config, batches: 100.0
        buckets = []
        args = tune.parse_args({grid!r})
        original = tune.tables.write_entries
        def write_then_maybe_die(*a, **k):
            original(*a, **k)
            buckets.append(1)
            if len(buckets) == 2:
                os._exit(9)  # as SIGKILL: nothing after this runs
        tune.tables.write_entries = write_then_maybe_die
        tune.run_tuning(args, arch="cpu_test", device={device!r}, device_name="test", sm_count=2,
                        timer=timer, out_dir=Path({str(table_env)!r}))
        """
    )
    env = os.environ | {"PYTHONPATH": _pythonpath(REPO)}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 9, proc.stderr
    table = tables.read_table(table_env / "cpu_test.json")
    assert {k: sorted(e["buckets"]) for k, e in table["entries"].items()} == {
        "H2_L1_bf16": ["1", "2"]
    }
    results = run(grid, table_env, device)
    assert [(r.key, r.batch_size) for r in results] == [("H2_L2_bf16", 1), ("H2_L2_bf16", 2)]
    table = tables.read_table(table_env / "cpu_test.json")
    assert sorted(table["entries"]) == ["H2_L1_bf16", "H2_L2_bf16"]


@pytest.mark.slow
def test_model_table_is_derived_without_a_gpu_and_marked_unmeasured(tmp_path):
    """--write-reported derives a table for an AMD GPU from the model,
    compiling every candidate ahead of time (a process without
    TRITON_INTERPRET); its metadata says it is not measured and states the
    model, and every bucket's config is one that fits."""
    argv = ["--write-reported", "gfx942", "--out", str(tmp_path), "--jobs", "2"]
    argv += ["--heads", "8", "--draft-lens", "2", "--batch-sizes", "1,64"]
    argv += ["--kv-dtype", "bf16,fp8_e4m3fnuz"]
    script = textwrap.dedent(
        f"""
        from mla_verify import aot, tables, tune
        assert tune.main({argv!r}) == 0
        table = tables.read_table({str(tmp_path / "gfx942.json")!r})
        for entry in table["entries"].values():
            for bucket in entry["buckets"].values():
                config = tune.VerifyConfig.from_dict(bucket["config"])
                assert aot.fits(config, entry["draft_len"], entry["kv_dtype"], "gfx942"), config
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = _pythonpath(REPO)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = tables.read_table(tmp_path / "gfx942.json")
    meta = table["metadata"]
    assert meta["measured"] is False
    assert "NOT MEASURED" in meta["device"] and "UNMEASURED" in meta["provenance"]
    assert meta["model"]["compute_units"] == 304 and meta["model"]["lds_bytes"] == 65536
    assert sorted(table["entries"]) == ["H8_L2_bf16", "H8_L2_fp8_e4m3fnuz"]
    for entry in table["entries"].values():
        for bucket in entry["buckets"].values():
            assert bucket == {"config": bucket["config"], "tuned_us": None, "default_us": None}


# ------------------------------------------------------------ shipped tables

SHIPPED = sorted((REPO / "configs").glob("*.json"))
PROVENANCE = {"device", "arch", "triton", "torch", "kernel_hash", "date", "timing", "measured"}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_table_is_valid_and_says_where_it_came_from(path):
    data = json.loads(path.read_text())
    tables.validate_table(data, expected_arch=path.stem)
    assert PROVENANCE <= set(data["metadata"])
    if data["metadata"]["measured"]:
        # A kernel change without re-tuning leaves the shipped table stale.
        assert data["metadata"]["kernel_hash"] == KERNEL_HASH
        for entry in data["entries"].values():
            for bucket in entry["buckets"].values():
                assert bucket["tuned_us"] > 0 and bucket["default_us"] > 0
                # Every record measured with this code of its kernel family:
                # re-tune the records of a family whose code changed.
                for record in tables.bucket_records(bucket).values():
                    family = kernel_family(record["config"].get("kernel", "triton"))
                    assert record["kernel_hash"] == KERNEL_HASHES[family], (entry, record)


@pytest.mark.parametrize("arch,fp8", [("gfx942", "fp8_e4m3fnuz"), ("gfx950", "fp8_e4m3")])
def test_shipped_amd_tables_are_derived_for_both_dtypes_and_unmeasured(arch, fp8):
    """The MLA grid in bf16 and the arch's fp8, and 256/256 (Qwen3.5's local
    heads) in bf16 at L 4 as in the sm90 table; all derived, none measured."""
    data = json.loads((REPO / "configs" / f"{arch}.json").read_text())
    assert data["metadata"]["measured"] is False
    assert "UNMEASURED" in data["metadata"]["provenance"]
    assert data["metadata"]["model"]["arch"] == arch
    grid = {(h, l) for h in tune.DEFAULT_HEADS for l in tune.DEFAULT_DRAFT_LENS}
    mla = {tables.entry_key(h, l, d) for h, l in grid for d in ("bf16", fp8)}
    shared_kv = {tables.entry_key(h, 4, "bf16", (256, 256)) for h in tune.SHARED_KV_HEADS}
    assert set(data["entries"]) == mla | shared_kv


def test_shipped_tables_cover_the_default_grid():
    """Every arch has the whole bf16 grid; other entries (another KV dtype,
    which a tuning run may cover only in part) are tunable dtypes of the
    same grid, each with every batch bucket."""
    grid = {(h, l) for h in tune.DEFAULT_HEADS for l in tune.DEFAULT_DRAFT_LENS}
    # Entries of other head dims (shared-KV models) take their own heads.
    shared_kv_grid = {(h, l) for h in tune.SHARED_KV_HEADS for l in tune.DEFAULT_DRAFT_LENS}
    bf16 = {tables.entry_key(h, l, "bf16") for h, l in grid}
    for arch in ("sm90", "gfx942", "gfx950"):
        data = json.loads((REPO / "configs" / f"{arch}.json").read_text())
        assert bf16 <= set(data["entries"]), sorted(bf16 - set(data["entries"]))
        for key, entry in data["entries"].items():
            mla = "head_dims" not in entry
            assert entry["kv_dtype"] in tune.TUNABLE_KV_DTYPES, key
            assert (entry["num_heads"], entry["draft_len"]) in (grid if mla else shared_kv_grid), (
                key
            )
            assert sorted(map(int, entry["buckets"])) == list(tune.DEFAULT_BATCH_SIZES), key


PIP = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The package's wheel, built once for this module."""
    wheel_dir = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir), str(REPO)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return next(wheel_dir.glob("mla_verify-*.whl"))


def test_the_wheel_carries_the_license_and_needs_numpy(wheel):
    """A plain install runs the first command: Triton's CPU interpreter
    imports numpy, so numpy is a dependency without extras."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        [license_name] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        license_text = zf.read(license_name).decode()
    assert license_text == (REPO / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in license_text
    assert "License-Expression: Apache-2.0" in metadata
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert "Requires-Dist: numpy" in requires


def test_shipped_tables_load_from_a_wheel(wheel, tmp_path):
    """Install the wheel without -e into a folder of its own and import
    from there, away from the checkout."""
    site = tmp_path / "site"
    subprocess.run(
        [*PIP, "install", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    script = textwrap.dedent(
        """
        import mla_verify
        from mla_verify import lookup
        print(mla_verify.__file__)
        for arch in ("sm90", "gfx942", "gfx950"):
            print(lookup.resolve_config(128, 4, 32, arch=arch)[1])
        """
    )
    env = {k: v for k, v in os.environ.items() if k != tables.ENV_VAR}
    env |= {
        "PYTHONPATH": _pythonpath(site),
        "TRITON_INTERPRET": "1",
        "XDG_DATA_HOME": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(str(site))
    for line, arch in zip(lines[1:], ("sm90", "gfx942", "gfx950"), strict=True):
        assert f"{arch}.json entry H128_L4_bf16, bucket 32 ({site}/mla_verify/configs/" in line


# ------------------------------------------------------------------ GPU lane


@pytest.mark.gpu
def test_gpu_capture_uses_the_table_and_never_tunes(monkeypatch):
    """Graph capture with the shipped table: the config comes from it, and
    nothing during capture reads a file or imports the tuner."""
    import builtins

    import mla_verify
    from mla_verify.testing import check_close, make_batch

    heads, draft_len, bs = 128, 4, 8
    config, source = mla_verify.resolve_config(heads, draft_len, bs)
    assert "sm90.json entry H128_L4_bf16" in source
    batch = make_batch(heads, draft_len, [3000] * bs, device="cuda")
    mla_verify.prepare_workspace(bs, heads, draft_len)
    out = batch.new_output()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        batch.run(out)
    torch.cuda.current_stream().wait_stream(stream)

    def no_files(*args, **kwargs):
        raise AssertionError("file access during capture")

    sys.modules.pop("mla_verify.tune", None)
    graph = torch.cuda.CUDAGraph()
    with monkeypatch.context() as m:
        m.setattr(builtins, "open", no_files)
        m.setattr(os, "open", no_files)
        with torch.cuda.graph(graph):
            batch.run(out)
    assert "mla_verify.tune" not in sys.modules
    out.fill_(float("nan"))
    graph.replay()
    check_close(out, batch.reference())


def test_show_names_the_table_a_shape_comes_from(capsys):
    assert (
        tune.main(
            [
                "--show",
                "--arch",
                "sm90",
                "--heads",
                "16",
                "--draft-lens",
                "4,9",
                "--batch-sizes",
                "32",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "H16 L4 bs32 bf16" in out and "sm90.json entry H16_L4_bf16, bucket 32" in out
    assert "H16 L9 bs32 bf16" in out and "nearest: sm90.json entry H16_L8_bf16" in out


def test_show_with_shapes_lists_only_those_shapes(capsys):
    argv = [
        "--show",
        "--arch",
        "sm90",
        "--heads",
        "16",
        "--draft-lens",
        "4",
        "--batch-sizes",
        "1,32",
    ]
    assert tune.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "configs for arch sm90:"
    assert [line.split(":")[0] for line in lines[1:]] == ["  H16 L4 bs1 bf16", "  H16 L4 bs32 bf16"]


def test_show_without_shapes_describes_the_tables(capsys):
    assert tune.main(["--show"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("config dirs, highest precedence first:")
    assert "configs for arch" not in out
    assert "--heads, --draft-lens or --batch-sizes" in out.splitlines()[-1]


def test_check_says_what_it_checked(capsys):
    assert tune.main(["--check"]) == 0
    out = capsys.readouterr().out
    for arch in ("sm90", "gfx942", "gfx950"):
        entries = json.loads((REPO / "configs" / f"{arch}.json").read_text())["entries"]
        assert f"{arch}.json: {len(entries)} entries" in out
    summary = out.splitlines()[-1]
    assert "all good" not in out
    if not torch.cuda.is_available():
        assert out.count("  configs not run (no GPU here)") == 3
        assert "0 config(s) run against the reference, 0 failed" in summary
        assert "configs not run (no GPU here): gfx942.json, gfx950.json, sm90.json" in summary
    sm90 = json.loads((REPO / "configs" / "sm90.json").read_text())["metadata"]
    if sm90["torch"] != torch.__version__:
        assert f"torch {sm90['torch']} != {torch.__version__}" in out
        assert "made with another kernel or software: " in summary and "sm90.json" in summary


def test_check_warns_once_about_a_corrupt_table_and_a_missing_dir(tmp_path):
    """In a fresh process, as a user runs it: the import reads the bad file
    and --check reads it again; one warning each."""
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    (env_dir / "sm90.json").write_text('{"schema_version": 1, "ar')
    missing = tmp_path / "missing"
    env = os.environ | {
        tables.ENV_VAR: os.pathsep.join([str(env_dir), str(missing)]),
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "PYTHONPATH": _pythonpath(REPO),
        "TRITON_INTERPRET": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "mla_verify.tune", "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert f"[env] {env_dir / 'sm90.json'}: UNREADABLE" in proc.stdout
    assert proc.stderr.count(f"ignoring config table {env_dir / 'sm90.json'}") == 1
    assert proc.stderr.count(f"{tables.ENV_VAR} entry {missing}: no such directory") == 1


BAD_ARGS = {
    "kv_dtype_int8": (
        ["--kv-dtype", "int8"],
        "--kv-dtype: expected one of bf16, fp8_e4m3, fp8_e4m3fnuz, got",
    ),
    "kv_dtype_fp16": (
        ["--kv-dtype", "fp16"],
        "--kv-dtype: expected one of bf16, fp8_e4m3, fp8_e4m3fnuz, got",
    ),
    "heads_0": (["--heads", "0"], "--heads: expected an int in 1..1024, got 0"),
    "draft_lens_17": (["--draft-lens", "4,17"], "--draft-lens: expected an int in 1..16, got 17"),
    "batch_sizes": (["--batch-sizes", "100000"], "--batch-sizes: expected an int in 1..65535"),
    "contexts_0": (["--contexts", "0"], "--contexts: expected an int in 1.."),
    "heads_not_ints": (["--heads", "x"], "argument --heads: expected comma-separated integers"),
    "arch_bogus": (["--show", "--arch", "bogus"], "--arch: expected one of gfx942, gfx950, "),
    "arch_without_show": (["--arch", "sm90"], "--arch: only with --show"),
    "top_k_0": (["--top-k", "0"], "--top-k: expected a positive int, got 0"),
    "jobs_0": (["--jobs", "0"], "--jobs: expected a positive int, got 0"),
    "margin": (["--margin", "1.5"], "--margin: expected a fraction in [0, 1), got 1.5"),
    "time_limit": (["--time-limit", "0"], "--time-limit: expected a positive number"),
}


@pytest.mark.parametrize("argv, message", BAD_ARGS.values(), ids=BAD_ARGS.keys())
def test_bad_arguments_are_one_line_and_exit_status_2(cli_error, argv, message):
    error = cli_error(tune.main, argv)
    assert error.startswith(f"python -m mla_verify.tune: error: {message}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_show_shapes_without_a_gpu_asks_for_arch(capsys):
    with pytest.raises(SystemExit) as info:
        tune.main(["--show", "--heads", "16"])
    assert info.value.code == 2
    assert (
        "--show: no GPU here to take the arch from; pass --arch (one of" in capsys.readouterr().err
    )


def test_the_tuner_writes_every_metadata_key_of_the_shipped_tables():
    """configs/ is written by the tuner: no hand-added metadata."""
    args = tune.parse_args(["--note", "why this table"])
    written = set(tune.table_metadata("sm90", "test", 132, args))
    assert tune.table_metadata("sm90", "test", 132, args)["note"] == "why this table"
    for path in sorted((REPO / "configs").glob("*.json")):
        metadata = json.loads(path.read_text())["metadata"]
        if metadata.get("measured", True):
            assert set(metadata) <= written, (path.name, set(metadata) - written)


def test_head_dims_grid_tunes_entries_keyed_by_them(table_env, device):
    """--head-dims adds entries keyed by head dims (timed with V a cache of
    its own); MLA's keys stay as they were; the lookup finds each."""
    assert tune.parse_args(["--head-dims", "576x512,256"]).head_dims == [(576, 512), (256, 256)]
    with pytest.raises(SystemExit):
        tune.parse_args(["--head-dims", "256x128"])
    results = run([*TINY, "--batch-sizes", "1", "--head-dims", "128"], table_env, device)
    assert [(r.key, r.head_dims) for r in results] == [("H2_L2_bf16_D128", (128, 128))]
    entry = json.loads((table_env / "cpu_test.json").read_text())["entries"]["H2_L2_bf16_D128"]
    assert entry["head_dims"] == [128, 128]
    lookup.reload_tables()
    source = lookup.resolve_config(2, 2, 1, arch="cpu_test", head_dims=(128, 128))[1]
    assert "entry H2_L2_bf16_D128" in source


def test_own_kernel_only_leaves_the_portable_search_out():
    """On sm90 the Triton kernel is searched beside the Hopper kernel unless
    --own-kernel-only asks for the Hopper kernel's alone."""
    assert tune.parse_args(["--own-kernel-only"]).own_kernel_only
    assert not tune.parse_args([]).own_kernel_only
    with pytest.raises(SystemExit):
        tune.parse_args(["--own-kernel-only", "--triton-only"])
    if hopper.available():
        assert tune._searches(16, 4, "bf16", "sm90", (576, 512)) == [None, "triton"]
    assert tune._searches(16, 4, "bf16", "sm90", (576, 512), portable=False) == [None]
    assert tune._searches(16, 4, "bf16", "gfx950", (576, 512)) == [None]


def test_other_head_dims_default_to_shared_kv_heads():
    """Qwen3.5-style entries default to its local heads; MLA's stay."""
    assert tune.parse_args(["--head-dims", "256"]).heads == list(tune.SHARED_KV_HEADS)
    assert tune.parse_args([]).heads == list(tune.DEFAULT_HEADS)
    assert tune.parse_args(["--head-dims", "576x512,256"]).heads == list(tune.DEFAULT_HEADS)
    assert tune.parse_args(["--head-dims", "256", "--heads", "32"]).heads == [32]


def test_check_compiles_the_tables_configs_ahead(monkeypatch, caplog):
    """--check's compile step: each distinct kernel of the table's configs
    (splits aside, as a launch compiles them) once, with the entry's head
    dims, and no config the table does not hold."""
    from mla_verify import tune_report

    compiled = []
    monkeypatch.setattr(tune, "_compile_worker", lambda jobs: compiled.extend(jobs) or len(jobs))
    small = {"BLOCK_H": 4, "BLOCK_N": 16, "NUM_KV_SPLITS": 2, "num_warps": 4, "num_stages": 1}
    wide = {**small, "BLOCK_N": 32, "NUM_KV_SPLITS": 8}
    table = {
        "entries": {
            "H4_L2_bf16": {
                "num_heads": 4,
                "draft_len": 2,
                "kv_dtype": "bf16",
                "buckets": {"1": {"config": small}, "2": {"config": {**small, "NUM_KV_SPLITS": 4}}},
            },
            "H8_L4_fp8_e4m3_D256": {
                "num_heads": 8,
                "draft_len": 4,
                "kv_dtype": "fp8_e4m3",
                "head_dims": [256, 256],
                "buckets": {"4": {"config": wide}},
            },
        }
    }
    tune_report.compile_ahead(table, "sm90", jobs=1)
    got = sorted(
        (h, d, k, VerifyConfig.from_dict(c).BLOCK_N, tuple(dims)) for h, d, k, c, dims in compiled
    )
    assert got == [(4, 2, "bf16", 16, (576, 512)), (8, 4, "fp8_e4m3", 32, (256, 256))]

    def broken(*args):
        raise RuntimeError("no worker")

    monkeypatch.setattr(tune, "precompile", broken)
    with caplog.at_level("WARNING", logger="mla_verify.tune"):
        tune_report.compile_ahead(table, "sm90", jobs=2)  # a head start only: no raise
    assert "compiling ahead failed (no worker)" in caplog.text


def test_check_runs_each_config_with_a_progress_bar(device, monkeypatch, capsys):
    """--check's run of a table: every bucket's config against the
    reference (here a small Triton config, under the interpreter without a
    GPU), a progress bar on stderr, and each failure named."""
    from mla_verify import tune_report

    config = {"BLOCK_H": 4, "BLOCK_N": 16, "NUM_KV_SPLITS": 2, "num_warps": 4, "num_stages": 1}
    entry = {"num_heads": 4, "draft_len": 2, "kv_dtype": "bf16"}
    table = {
        "entries": {
            "H4_L2_bf16": {**entry, "buckets": {"1": {"config": config}, "2": {"config": config}}}
        }
    }
    assert tune_report.run_configs(table, "t.json", device) == (2, 0)
    err = capsys.readouterr().err
    assert "checking t.json" in err and "2/2" in err

    def wrong(out, ref, *, what):
        raise AssertionError(f"{what}: off")

    monkeypatch.setattr("mla_verify.testing.check_close", wrong)
    assert tune_report.run_configs(table, "t.json", device) == (2, 2)
    out = capsys.readouterr().out
    assert "FAILED H4_L2_bf16 bucket 1: H4_L2_bf16 bucket 1: off" in out
    assert "FAILED H4_L2_bf16 bucket 2" in out


def test_the_summary_keeps_its_columns_for_long_keys_and_three_contexts(capsys):
    # A 256/256 fp8 key (20 characters) and three contexts' ratios are wider
    # than the columns' usual widths; each column must still start where its
    # heading does.
    config = VerifyConfig(BLOCK_H=16, BLOCK_N=64, NUM_KV_SPLITS=1, num_warps=4, num_stages=3)
    result = tune.BucketResult(
        num_heads=16,
        draft_len=4,
        kv_dtype="fp8_e4m3",
        batch_size=256,
        config=config,
        tuned=tune.Timing((100.0, 200.0, 400.0)),
        default=tune.Timing((165.0, 330.0, 700.0)),
        contexts=[2048, 16384, 65536],
        head_dims=(256, 256),
    )
    tune.print_summary([result])
    heading, row = capsys.readouterr().out.splitlines()[:2]
    assert row.startswith("H16_L4_fp8_e4m3_D256 ")
    assert row.index(" 256 ") + len(" 256") == heading.index("batch") + len("batch")
    assert row.index("1.65 1.65 1.75 ") == heading.index("by context")
    assert row.index("{'BLOCK_H': 16") == heading.index("config")
