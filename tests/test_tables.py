"""Table format: validation, reading, atomic merged writes, config dirs and
loading with precedence and staleness. CPU only."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import multiprocessing
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from mla_verify import tables
from mla_verify.config import VerifyConfig
from mla_verify.tables import TableError

HASH = "0123456789abcdef"
OTHER_HASH = "fedcba9876543210"
# This code's hash per kernel family (code_hash.KERNEL_HASHES), beside HASH,
# its combined one (code_hash.KERNEL_HASH).
HASHES = {"triton": "1111111111111111", "gluon_sm90": "2222222222222222"}


# --- helpers --------------------------------------------------------------------


def cfg(block_h: int = 4, splits: int = 8, **kw: int) -> dict:
    fields = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2} | kw
    return VerifyConfig(BLOCK_H=block_h, NUM_KV_SPLITS=splits, **fields).to_dict()


def bucket(config: dict, tuned: float | None = 10.0, default: float | None = 12.0) -> dict:
    return {"config": config, "tuned_us": tuned, "default_us": default, "context_lens": [2048]}


def entry(h: int, l: int, dtype: str, buckets: dict[int, dict]) -> tuple[str, dict]:
    body = {"num_heads": h, "draft_len": l, "kv_dtype": dtype}
    body["buckets"] = {str(b): v for b, v in buckets.items()}
    return tables.entry_key(h, l, dtype), body


def meta(arch: str = "sm90", kernel_hash: str | None = HASH, **kw: object) -> dict:
    out = {"device": "test", "arch": arch, "measured": True} | kw
    if kernel_hash is not None:
        out["kernel_hash"] = kernel_hash
    return out


def table(arch: str = "sm90", entries: list | None = None, **meta_kw: object) -> dict:
    if entries is None:
        entries = [entry(128, 4, "bf16", {1: bucket(cfg()), 32: bucket(cfg(splits=2))})]
    return {
        "schema_version": 1,
        "arch": arch,
        "metadata": meta(arch, **meta_kw),
        "entries": dict(entries),
    }


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def warnings_from(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "mla_verify.tables" and r.levelno == logging.WARNING
    ]


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Isolated env / user / shipped config dirs."""
    d = SimpleNamespace(env=tmp_path / "env", user=tmp_path / "user", shipped=tmp_path / "shipped")
    for p in vars(d).values():
        p.mkdir()
    monkeypatch.setenv(tables.ENV_VAR, str(d.env))
    monkeypatch.setattr(tables, "user_table_dir", lambda: d.user)
    monkeypatch.setattr(tables, "shipped_table_dir", lambda: d.shipped)
    return d


# --- keys and validation ----------------------------------------------------------


def test_entry_key():
    assert tables.entry_key(128, 4, "bf16") == "H128_L4_bf16"
    assert tables.entry_key(12, 1, "fp8_e4m3") == "H12_L1_fp8_e4m3"
    # MLA keys stay as they were; other head dims add a suffix.
    assert tables.entry_key(16, 4, "bf16", (576, 512)) == "H16_L4_bf16"
    assert tables.entry_key(16, 4, "bf16", (256, 256)) == "H16_L4_bf16_D256"
    assert tables.entry_key(8, 2, "fp8_e4m3", (128, 128)) == "H8_L2_fp8_e4m3_D128"
    with pytest.raises(ValueError, match="head_dims"):
        tables.entry_key(16, 4, "bf16", (192, 128))


def _d256_entry(**over) -> tuple[str, dict]:
    _, body = entry(16, 4, "bf16", {8: bucket(cfg())})
    body = body | {"head_dims": [256, 256]} | over
    return tables.entry_key(16, 4, "bf16", (256, 256)), body


def test_head_dims_entries_validate_and_load(dirs):
    data = table(entries=[entry(16, 4, "bf16", {8: bucket(cfg())}), _d256_entry()])
    tables.validate_table(data, expected_arch="sm90")
    write_json(dirs.shipped / "sm90.json", data)
    loaded = tables.load_tables(HASH, HASHES)["sm90"]
    assert loaded["H16_L4_bf16"].head_dims == (576, 512)
    assert loaded["H16_L4_bf16_D256"].head_dims == (256, 256)


@pytest.mark.parametrize(
    "over,match",
    [
        ({"head_dims": [192, 128]}, "head_dims"),
        ({"head_dims": "256"}, "head_dims"),
        ({"head_dims": [128, 128]}, "expected 'H16_L4_bf16_D128'"),
    ],
    ids=["unsupported", "not_a_list", "key_mismatch"],
)
def test_head_dims_entry_errors(over, match):
    with pytest.raises(TableError, match=match):
        tables.validate_table(table(entries=[_d256_entry(**over)]))


def test_validate_accepts_good_and_unmeasured_tables():
    tables.validate_table(table(), expected_arch="sm90")
    by_context = copy.deepcopy(table())
    measured = by_context["entries"]["H128_L4_bf16"]["buckets"]["1"]
    measured.update(context_lens=[2048, 16384], tuned_us_by_context=[8.1, 18.7])
    measured["default_us_by_context"] = [9.9, 22.7]
    tables.validate_table(by_context, expected_arch="sm90")
    unmeasured = table(
        entries=[entry(16, 2, "fp8_e4m3", {8: bucket(cfg(), tuned=None, default=None)})],
        measured=False,
        free_form={"any": ["thing"]},
    )
    tables.validate_table(unmeasured)
    amd = table("gfx950", [entry(8, 4, "bf16", {1: bucket(cfg(waves_per_eu=2, kpack=2))})])
    tables.validate_table(amd, expected_arch="gfx950")
    tables.validate_table(with_triton(), expected_arch="sm90")


def with_triton() -> dict:
    """A table whose bucket 1 keeps the Triton kernel's winner beside a
    Hopper kernel config."""
    hopper = bucket(cfg(16, 5, num_warps=8, kernel="gluon_sm90_sv"))
    hopper["triton"] = bucket(cfg(16, 3, BLOCK_N=32), tuned=20.0, default=25.0)
    return table(entries=[entry(128, 4, "bf16", {1: hopper, 32: bucket(cfg(splits=2))})])


def _set(path: list, value: object):
    def mutate(t: dict) -> None:
        for part in path[:-1]:
            t = t[part]
        t[path[-1]] = value

    return mutate


def _delete(path: list):
    def mutate(t: dict) -> None:
        for part in path[:-1]:
            t = t[part]
        del t[path[-1]]

    return mutate


def _chain(*mutations):
    def mutate(t: dict) -> None:
        for m in mutations:
            m(t)

    return mutate


E = ["entries", "H128_L4_bf16"]
B = [*E, "buckets", "1"]
C = [*B, "config"]

BAD_TABLES = {
    "schema_version_2": (_set(["schema_version"], 2), "schema_version"),
    "schema_version_missing": (_delete(["schema_version"]), "schema_version"),
    "schema_version_bool": (_set(["schema_version"], True), "schema_version"),
    "entries_missing": (_delete(["entries"]), "missing keys ['entries']"),
    "unknown_top_key": (_set(["extra"], 1), "unknown keys ['extra']"),
    "arch_empty": (_set(["arch"], ""), "arch"),
    "metadata_not_object": (_set(["metadata"], []), "metadata"),
    "metadata_arch_differs": (_set(["metadata", "arch"], "sm100"), "metadata.arch"),
    "kernel_hash_not_str": (_set(["metadata", "kernel_hash"], 5), "kernel_hash"),
    "measured_not_bool": (_set(["metadata", "measured"], "yes"), "measured"),
    "entries_not_object": (_set(["entries"], []), "entries"),
    "entry_key_mismatch": (_set([*E, "num_heads"], 64), "expected 'H64_L4_bf16'"),
    "entry_missing_buckets": (_delete([*E, "buckets"]), "missing keys ['buckets']"),
    "entry_unknown_key": (_set([*E, "note"], "x"), "unknown keys ['note']"),
    "entry_heads_zero": (_set([*E, "num_heads"], 0), "num_heads"),
    "entry_draft_len_str": (_set([*E, "draft_len"], "4"), "draft_len"),
    "entry_dtype_unknown": (_set([*E, "kv_dtype"], "fp32"), "kv_dtype"),
    "buckets_empty": (_set([*E, "buckets"], {}), "non-empty"),
    "bucket_key_zero": (_set([*E, "buckets", "0"], {}), "bucket key '0'"),
    "bucket_key_negative": (_set([*E, "buckets", "-4"], {}), "bucket key '-4'"),
    "bucket_key_leading_zero": (_set([*E, "buckets", "08"], {}), "bucket key '08'"),
    "bucket_key_not_number": (_set([*E, "buckets", "big"], {}), "bucket key 'big'"),
    "bucket_key_superscript": (_set([*E, "buckets", "\u00b2"], {}), "bucket key '\u00b2'"),
    "bucket_missing_config": (_delete(C), "missing keys ['config']"),
    "bucket_missing_tuned_us": (_delete([*B, "tuned_us"]), "missing keys ['tuned_us']"),
    "config_not_object": (_set(C, [4, 64]), "config"),
    "config_bad_block_n": (_set([*C, "BLOCK_N"], 48), "BLOCK_N"),
    "config_zero_splits": (_set([*C, "NUM_KV_SPLITS"], 0), "NUM_KV_SPLITS"),
    "config_unknown_field": (_set([*C, "BLOCK_M"], 16), "unknown fields ['BLOCK_M']"),
    "config_missing_field": (_delete([*C, "num_warps"]), "num_warps"),
    "config_float_value": (_set([*C, "BLOCK_H"], 4.0), "BLOCK_H"),
    "config_kernel_not_a_name": (_set([*C, "kernel"], 1), "config.kernel: expected a string"),
    "config_unknown_kernel": (_set([*C, "kernel"], "cuda"), "VerifyConfig.kernel"),
    "tuned_us_negative": (_set([*B, "tuned_us"], -1.0), "tuned_us"),
    "tuned_us_string": (_set([*B, "tuned_us"], "fast"), "tuned_us"),
    "default_us_nan": (_set([*B, "default_us"], float("nan")), "default_us"),
    "context_lens_not_list": (_set([*B, "context_lens"], 2048), "context_lens"),
    "times_by_context_too_few": (_set([*B, "tuned_us_by_context"], []), "tuned_us_by_context"),
    "times_by_context_without_lens": (
        _chain(_delete([*B, "context_lens"]), _set([*B, "tuned_us_by_context"], [9.0])),
        "tuned_us_by_context",
    ),
    "times_by_context_null": (
        _set([*B, "default_us_by_context"], [None]),
        "default_us_by_context[0]: expected a positive number, got None",
    ),
    "times_by_context_zero": (_set([*B, "default_us_by_context"], [0.0]), "[0]"),
    "triton_not_object": (_set([*B, "triton"], 3), "buckets[1].triton: expected an object"),
    "triton_missing_times": (
        _set([*B, "triton"], {"config": cfg()}),
        "triton: missing keys ['default_us', 'tuned_us']",
    ),
    "triton_nested": (
        _set([*B, "triton"], bucket(cfg()) | {"triton": bucket(cfg())}),
        "triton: unknown keys ['triton']",
    ),
    "triton_is_hopper": (
        _set([*B, "triton"], bucket(cfg(16, 5, num_warps=8, kernel="gluon_sm90"))),
        "triton.config.kernel: expected 'triton', got 'gluon_sm90'",
    ),
    "triton_bad_config": (
        _set([*B, "triton"], bucket(cfg() | {"BLOCK_N": 48})),
        "triton.config: VerifyConfig.BLOCK_N",
    ),
    "record_kernel_hash_int": (_set([*B, "kernel_hash"], 5), "buckets[1].kernel_hash"),
    "record_kernel_hash_short": (_set([*B, "kernel_hash"], "0123abcd"), "16 hex digits"),
    "record_kernel_hash_upper": (_set([*B, "kernel_hash"], HASH.upper()), "16 hex digits"),
    "record_kernel_hash_null": (_set([*B, "kernel_hash"], None), "kernel_hash"),
    "triton_kernel_hash_not_hex": (
        _set([*B, "triton"], bucket(cfg()) | {"kernel_hash": "g" * 16}),
        "triton.kernel_hash: expected 16 hex digits",
    ),
}


@pytest.mark.parametrize("mutate, reason", BAD_TABLES.values(), ids=BAD_TABLES.keys())
def test_validate_rejects(mutate, reason):
    data = copy.deepcopy(table())
    mutate(data)
    with pytest.raises(TableError) as info:
        tables.validate_table(data)
    assert reason in str(info.value)


def test_validate_rejects_non_object_and_foreign_arch():
    with pytest.raises(TableError, match="expected an object"):
        tables.validate_table([])
    with pytest.raises(TableError, match="'sm100' in a file for 'sm90'"):
        tables.validate_table(table("sm100"), expected_arch="sm90")


# --- reading --------------------------------------------------------------------


def test_read_table_round_trips(tmp_path: Path):
    hopper = cfg(16, 5, num_warps=8, kernel="gluon_sm90")
    data = table(entries=[entry(64, 4, "bf16", {1: bucket(cfg()), 32: bucket(hopper)})])
    path = write_json(tmp_path / "sm90.json", data)
    assert tables.read_table(path) == data
    path = write_json(tmp_path / "sm90.json", with_triton())
    assert tables.read_table(path) == with_triton()


def test_records_round_trip_through_the_one_serialiser():
    """The tuner writes buckets with ``bucket_json`` and the loader reads
    them with ``Record.from_json``: one code path, times rounded once."""
    measured = tables.Record(
        VerifyConfig.from_dict(cfg(16, 5, num_warps=8, kernel="gluon_sm90")),
        tuned_us=10.004,
        default_us=12.0,
        context_lens=(2048, 16384),
        tuned_us_by_context=(8.1, 18.7),
        default_us_by_context=(9.9, 22.7),
    )
    triton = tables.Record(VerifyConfig.from_dict(cfg(16, 3)), tuned_us=20.0, default_us=25.0)
    data = tables.bucket_json(measured, triton)
    assert data["tuned_us"] == 10.0 and data["triton"]["config"] == cfg(16, 3)
    assert "context_lens" not in data["triton"]  # written only where measured per context
    assert tables.Record.from_json(data) == dataclasses.replace(measured, tuned_us=10.0)
    assert tables.Record.from_json(data["triton"]) == triton
    unmeasured = tables.bucket_json(tables.Record(VerifyConfig.from_dict(cfg())))
    assert unmeasured == {"config": cfg(), "tuned_us": None, "default_us": None}
    tables.validate_table(table(entries=[entry(8, 1, "bf16", {1: data, 2: unmeasured})]))


def test_records_carry_the_hash_of_the_code_they_were_measured_with():
    """A record's kernel hash is written beside its config where known, and
    read back; a record without one reads as None (a table older than it)."""
    record = tables.Record(VerifyConfig.from_dict(cfg()), 10.0, 12.0, kernel_hash=OTHER_HASH)
    data = tables.bucket_json(record, dataclasses.replace(record, kernel_hash=HASH))
    assert list(data)[:2] == ["config", "kernel_hash"]
    assert (data["kernel_hash"], data["triton"]["kernel_hash"]) == (OTHER_HASH, HASH)
    assert tables.Record.from_json(data) == record
    assert tables.Record.from_json(data["triton"]).kernel_hash == HASH
    assert tables.Record.from_json(bucket(cfg())).kernel_hash is None
    tables.validate_table(table(entries=[entry(8, 1, "bf16", {1: data})]))


BAD_FILES = {
    "corrupt": (lambda p: p.write_text("{not json"), "Expecting property name"),
    "truncated": (lambda p: p.write_text(json.dumps(table())[:80]), "line 1"),
    "empty": (lambda p: p.write_text(""), "Expecting value"),
    "not_utf8": (lambda p: p.write_bytes(b"\xff\xfe{}"), "codec"),
    "foreign_arch": (lambda p: write_json(p, table("sm100")), "'sm100' in a file for 'sm90'"),
    "wrong_schema": (lambda p: write_json(p, table() | {"schema_version": 2}), "schema_version"),
    "invalid_config": (
        lambda p: write_json(p, table(entries=[entry(8, 4, "bf16", {1: bucket({"BLOCK_H": 4})})])),
        "config",
    ),
    "missing": (lambda p: None, "No such file"),
}


@pytest.mark.parametrize("make, reason", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_read_table_bad_file_warns_once(tmp_path, caplog, make, reason):
    path = tmp_path / "sm90.json"
    make(path)
    with caplog.at_level(logging.WARNING, logger="mla_verify.tables"):
        assert tables.read_table(path) is None
    [record] = warnings_from(caplog)
    assert str(path) in record.getMessage()
    assert reason in record.getMessage()


# --- writing --------------------------------------------------------------------


def test_write_entries_round_trip(tmp_path: Path):
    path = tmp_path / "new" / "dir" / "sm90.json"  # directory is created
    entries = dict([entry(128, 4, "bf16", {32: bucket(cfg(splits=2)), 1: bucket(cfg())})])
    tables.write_entries(path, "sm90", meta(), entries)
    data = tables.read_table(path)
    assert data == {"schema_version": 1, "arch": "sm90", "metadata": meta(), "entries": entries}
    assert list(data["entries"]["H128_L4_bf16"]["buckets"]) == ["1", "32"]  # sorted numerically
    assert sorted(p.name for p in path.parent.iterdir()) == ["sm90.json", "sm90.json.lock"]


def test_write_entries_merges_per_entry_and_bucket(tmp_path: Path):
    path = tmp_path / "sm90.json"
    first = dict([entry(128, 4, "bf16", {1: bucket(cfg(splits=1)), 8: bucket(cfg(splits=8))})])
    tables.write_entries(path, "sm90", meta(run=1), first)
    second = dict(
        [
            entry(128, 4, "bf16", {8: bucket(cfg(splits=3)), 64: bucket(cfg(splits=64))}),
            entry(16, 2, "fp8_e4m3", {4: bucket(cfg())}),
        ]
    )
    tables.write_entries(path, "sm90", meta(run=2), second)
    data = tables.read_table(path)
    assert data["metadata"]["run"] == 2
    assert set(data["entries"]) == {"H128_L4_bf16", "H16_L2_fp8_e4m3"}
    buckets = data["entries"]["H128_L4_bf16"]["buckets"]
    splits = {b: v["config"]["NUM_KV_SPLITS"] for b, v in buckets.items()}
    assert splits == {"1": 1, "8": 3, "64": 64}


def test_measured_and_unmeasured_buckets_never_share_a_table(tmp_path: Path):
    """Tuning on the hardware into a model-derived table (``--out configs``)
    replaces it whole: an interrupted run must not leave derived buckets
    under a measured table's metadata."""
    path = tmp_path / "gfx950.json"
    derived = dict([entry(8, 1, "bf16", {1: bucket(cfg(), None, None)})])
    derived |= dict([entry(8, 2, "bf16", {1: bucket(cfg(), None, None)})])
    tables.write_entries(path, "gfx950", meta("gfx950", measured=False), derived)
    measured = dict([entry(8, 1, "bf16", {2: bucket(cfg(splits=3))})])
    tables.write_entries(path, "gfx950", meta("gfx950"), measured)
    data = tables.read_table(path)
    assert data["entries"] == measured
    more = dict([entry(8, 2, "bf16", {1: bucket(cfg(splits=5))})])
    tables.write_entries(path, "gfx950", meta("gfx950"), more)  # measured ones merge as before
    assert tables.read_table(path)["entries"] == measured | more


def test_write_entries_rejects_bad_input(tmp_path: Path):
    path = tmp_path / "sm90.json"
    with pytest.raises(TableError, match="must be named sm100.json"):
        tables.write_entries(path, "sm100", meta("sm100"), {})
    bad = dict([entry(8, 4, "bf16", {1: bucket({"BLOCK_H": 4})})])
    with pytest.raises(TableError, match="config"):
        tables.write_entries(path, "sm90", meta(), bad)
    with pytest.raises(TableError, match="bucket key 'big'"):
        tables.write_entries(
            path,
            "sm90",
            meta(),
            {"H8_L4_bf16": entry(8, 4, "bf16", {})[1] | {"buckets": {"big": {}}}},
        )
    assert not path.exists()


def test_write_entries_replaces_corrupt_file(tmp_path: Path, caplog):
    path = tmp_path / "sm90.json"
    path.write_text("{trunc")
    with caplog.at_level(logging.WARNING, logger="mla_verify.tables"):
        tables.write_entries(path, "sm90", meta(), dict([entry(8, 4, "bf16", {1: bucket(cfg())})]))
    assert len(warnings_from(caplog)) == 1
    assert list(tables.read_table(path)["entries"]) == ["H8_L4_bf16"]


WORKERS = 4
ROUNDS = 25


def _writer(path: str, worker: int, start) -> None:
    """One tuner process: its own entry gains a bucket per round; a shared
    entry gets this worker's bucket rewritten every round."""
    start.wait()  # all workers write at once, not staggered by their imports
    for r in range(ROUNDS):
        entries = dict(
            [
                entry(8 * (worker + 1), 4, "bf16", {r + 1: bucket(cfg(splits=r + 1))}),
                entry(128, 4, "bf16", {worker + 1: bucket(cfg(splits=r + 1))}),
            ]
        )
        tables.write_entries(path, "sm90", meta(worker=worker, round=r), entries)


def test_concurrent_writers_lose_nothing(tmp_path: Path):
    path = tmp_path / "sm90.json"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=_writer, args=(str(path), w, start)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WORKERS

    data = json.loads(path.read_text())
    tables.validate_table(data, expected_arch="sm90")
    expected_keys = {f"H{8 * (w + 1)}_L4_bf16" for w in range(WORKERS)} | {"H128_L4_bf16"}
    assert set(data["entries"]) == expected_keys
    for w in range(WORKERS):
        own = data["entries"][f"H{8 * (w + 1)}_L4_bf16"]["buckets"]
        assert sorted(map(int, own)) == list(range(1, ROUNDS + 1))
    shared = data["entries"]["H128_L4_bf16"]["buckets"]
    # Every worker's last round survives.
    assert {b: v["config"]["NUM_KV_SPLITS"] for b, v in shared.items()} == {
        str(w + 1): ROUNDS for w in range(WORKERS)
    }
    assert data["metadata"]["round"] == ROUNDS - 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sm90.json", "sm90.json.lock"]


# --- directories --------------------------------------------------------------------


def test_config_dirs_order(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv(tables.ENV_VAR, f"{a}{os.pathsep}{b}")
    monkeypatch.setattr(tables.platformdirs, "user_data_dir", lambda app: str(tmp_path / app))
    labels, paths = zip(*tables.config_dirs(), strict=True)
    assert labels == ("env", "env", "user", "shipped")
    assert paths[:3] == (a, b, tmp_path / "mla_verify" / "configs")
    assert paths[3] == tables.shipped_table_dir()


def test_config_dirs_without_env(monkeypatch):
    monkeypatch.delenv(tables.ENV_VAR, raising=False)
    assert [label for label, _ in tables.config_dirs()] == ["user", "shipped"]


def test_shipped_dir_from_package_spec(tmp_path, monkeypatch):
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(tables.importlib.util, "find_spec", lambda name: spec)
    assert tables.shipped_table_dir() == tmp_path


def test_shipped_dir_source_checkout_fallback(monkeypatch):
    monkeypatch.setattr(tables.importlib.util, "find_spec", lambda name: None)
    expected = Path(tables.__file__).resolve().parent.parent / "configs"
    assert tables.shipped_table_dir() == expected


# --- loading --------------------------------------------------------------------


def test_load_tables_builds_entries(dirs):
    write_json(dirs.user / "sm90.json", table())
    loaded = tables.load_tables(HASH, HASHES)
    e = loaded["sm90"]["H128_L4_bf16"]
    assert (e.num_heads, e.draft_len, e.kv_dtype, e.stale) == (128, 4, "bf16", False)
    assert e.buckets == {
        1: VerifyConfig.from_dict(cfg()),
        32: VerifyConfig.from_dict(cfg(splits=2)),
    }
    assert e.times == {1: (10.0, 12.0), 32: (10.0, 12.0)}
    assert e.source == str(dirs.user / "sm90.json")
    # Triton configs all, as the buckets hold nothing else
    assert e.triton == e.buckets


def test_load_tables_keeps_the_triton_winners(dirs):
    """A bucket's Triton winner where its config is the Hopper kernel's; its
    own config where that is the Triton kernel's."""
    write_json(dirs.user / "sm90.json", with_triton())
    e = tables.load_tables(HASH, HASHES)["sm90"]["H128_L4_bf16"]
    assert e.buckets[1].kernel == "gluon_sm90_sv"
    assert e.triton == {
        1: VerifyConfig.from_dict(cfg(16, 3, BLOCK_N=32)),
        32: VerifyConfig.from_dict(cfg(splits=2)),
    }
    hopper_only = copy.deepcopy(with_triton())
    del hopper_only["entries"]["H128_L4_bf16"]["buckets"]["1"]["triton"]
    write_json(dirs.user / "sm90.json", hopper_only)
    e = tables.load_tables(HASH, HASHES)["sm90"]["H128_L4_bf16"]
    assert list(e.triton) == [32]  # bucket 1 knows no Triton config


def test_load_tables_precedence_is_per_entry(dirs):
    def one(h: int, splits: int, buckets=(1,)) -> tuple[str, dict]:
        return entry(h, 4, "bf16", {b: bucket(cfg(splits=splits)) for b in buckets})

    write_json(dirs.env / "sm90.json", table(entries=[one(128, 1)]))
    write_json(dirs.user / "sm90.json", table(entries=[one(128, 2, (1, 64)), one(64, 2)]))
    write_json(dirs.shipped / "sm90.json", table(entries=[one(128, 3), one(64, 3), one(32, 3)]))
    write_json(dirs.shipped / "gfx950.json", table("gfx950", entries=[one(16, 3)]))
    loaded = tables.load_tables(HASH, HASHES)

    assert set(loaded) == {"sm90", "gfx950"}
    got = {
        k: (e.buckets[1].NUM_KV_SPLITS, Path(e.source).parent) for k, e in loaded["sm90"].items()
    }
    assert got == {
        "H128_L4_bf16": (1, dirs.env),
        "H64_L4_bf16": (2, dirs.user),
        "H32_L4_bf16": (3, dirs.shipped),
    }
    # The winning entry replaces the lower one whole: the user's bucket 64 is gone.
    assert list(loaded["sm90"]["H128_L4_bf16"].buckets) == [1]


def test_load_tables_first_env_path_wins(dirs, tmp_path, monkeypatch):
    second = tmp_path / "env2"
    monkeypatch.setenv(tables.ENV_VAR, f"{dirs.env}{os.pathsep}{second}")
    write_json(
        dirs.env / "sm90.json", table(entries=[entry(8, 4, "bf16", {1: bucket(cfg(splits=1))})])
    )
    write_json(
        second / "sm90.json", table(entries=[entry(8, 4, "bf16", {1: bucket(cfg(splits=2))})])
    )
    assert tables.load_tables(HASH, HASHES)["sm90"]["H8_L4_bf16"].buckets[1].NUM_KV_SPLITS == 1


def test_load_tables_skips_bad_files_with_one_warning_each(dirs, caplog):
    bad_env = dirs.env / "sm90.json"
    bad_env.write_text('{"schema_version": 1, "arch": "sm9')
    write_json(dirs.env / "sm100.json", table("sm90"))  # foreign arch
    write_json(dirs.user / "sm90.json", table())
    with caplog.at_level(logging.WARNING, logger="mla_verify.tables"):
        loaded = tables.load_tables(HASH, HASHES)
    assert set(loaded) == {"sm90"}
    assert loaded["sm90"]["H128_L4_bf16"].source == str(dirs.user / "sm90.json")
    messages = sorted(r.getMessage() for r in warnings_from(caplog))
    assert len(messages) == 2
    assert str(dirs.env / "sm100.json") in messages[0]
    assert str(bad_env) in messages[1]


def test_read_table_warns_once_per_file_and_reason(tmp_path, caplog):
    """The import reads every table, and --check or the tuner read the
    same file again: one warning, not one per read."""
    path = tmp_path / "sm90.json"
    path.write_text("{corrupt")
    with caplog.at_level(logging.WARNING, logger="mla_verify.tables"):
        assert tables.read_table(path) is None
        assert tables.read_table(path) is None
        path.write_text(json.dumps({"schema_version": 2}))
        assert tables.read_table(path) is None  # another reason: said again
    assert len(warnings_from(caplog)) == 2


def test_load_tables_warns_once_about_a_missing_env_dir(dirs, tmp_path, monkeypatch, caplog):
    missing = tmp_path / "typo"
    monkeypatch.setenv(tables.ENV_VAR, os.pathsep.join([str(dirs.env), str(missing)]))
    write_json(dirs.env / "sm90.json", table())
    with caplog.at_level(logging.WARNING, logger="mla_verify.tables"):
        assert set(tables.load_tables(HASH, HASHES)) == {"sm90"}
        tables.load_tables(HASH, HASHES)
    [record] = warnings_from(caplog)
    assert record.getMessage() == (
        f"mla_verify: ignoring {tables.ENV_VAR} entry {missing}: no such directory"
    )


def test_load_tables_tolerates_missing_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv(tables.ENV_VAR, str(tmp_path / "nope"))
    monkeypatch.setattr(tables, "user_table_dir", lambda: tmp_path / "also-nope")
    monkeypatch.setattr(tables, "shipped_table_dir", lambda: tmp_path / "file.json")
    (tmp_path / "file.json").write_text("{}")
    assert tables.load_tables(HASH, HASHES) == {}


STALENESS = {
    "same_hash": ({"kernel_hash": HASH}, False),
    "other_hash": ({"kernel_hash": OTHER_HASH}, True),
    "no_hash": ({"kernel_hash": None}, True),
    "other_hash_unmeasured": ({"kernel_hash": OTHER_HASH, "measured": False}, False),
}


@pytest.mark.parametrize("meta_kw, stale", STALENESS.values(), ids=STALENESS.keys())
def test_load_tables_staleness(dirs, caplog, meta_kw, stale):
    path = write_json(dirs.shipped / "sm90.json", table(**meta_kw))
    with caplog.at_level(logging.WARNING, logger="mla_verify.tables"):
        loaded = tables.load_tables(HASH, HASHES)
        assert warnings_from(caplog) == []  # loading says nothing of staleness
        e = loaded.arch_entries("sm90")["H128_L4_bf16"]  # used either way
    assert e.stale is stale
    assert e.buckets[32] == VerifyConfig.from_dict(cfg(splits=2))
    records = warnings_from(caplog)
    assert len(records) == int(stale)
    if stale:
        assert str(path) in records[0].getMessage()
        assert "stale" in records[0].getMessage()


def test_a_stale_table_warns_at_the_first_lookup_of_its_arch(dirs, caplog):
    """Every process that imports the package loads every arch's tables (the
    tuner's compile workers too); only a lookup of an arch warns about its
    stale tables, once per table and process."""
    sm90 = write_json(dirs.shipped / "sm90.json", family_table(OTHER_HASH, TRITON))
    gfx950 = write_json(dirs.user / "gfx950.json", table("gfx950", kernel_hash=OTHER_HASH))
    write_json(dirs.user / "sm100.json", table("sm100"))  # current
    with caplog.at_level(logging.WARNING, logger="mla_verify.tables"):
        loaded = tables.load_tables(HASH, HASHES)
        assert warnings_from(caplog) == []
        assert set(loaded.arch_entries("sm100")) == {"H128_L4_bf16"}
        assert loaded.arch_entries("gfx942") == {}
        assert warnings_from(caplog) == []  # other arches: not a word of sm90's or gfx950's
        assert set(loaded.arch_entries("sm90")) == {"H128_L4_bf16"}
        [record] = warnings_from(caplog)
        assert record.getMessage() == (
            f"mla_verify: config table {sm90} has stale records, measured with other kernel "
            f"code: 1 of 1 gluon_sm90 records (this code: gluon_sm90 {GLUON}); their configs "
            "are still used but their timings may no longer hold: re-tune to refresh"
        )
        loaded.arch_entries("sm90")
        tables.load_tables(HASH, HASHES).arch_entries("sm90")  # a reload: the same table
        assert len(warnings_from(caplog)) == 1
        loaded.arch_entries("gfx950")
    messages = [r.getMessage() for r in warnings_from(caplog)]
    assert len(messages) == 2
    assert f"config table {gfx950} has stale records" in messages[1]
    assert "2 of 2 triton records" in messages[1]


# --- per-record staleness ----------------------------------------------------------


def stamped(config: dict, kernel_hash: str, **kw: float) -> dict:
    return bucket(config, **kw) | {"kernel_hash": kernel_hash}


HOPPER = cfg(16, 5, num_warps=8, kernel="gluon_sm90_sv")


def family_table(hopper_hash: str, triton_hash: str, **meta_kw: object) -> dict:
    """Bucket 1: a Hopper record with a Triton one beside it; bucket 32: a
    Triton record; the Hopper record stamped ``hopper_hash``, the Triton
    ones ``triton_hash``."""
    one = stamped(HOPPER, hopper_hash)
    one["triton"] = stamped(cfg(16, 3, BLOCK_N=32), triton_hash)
    buckets = {1: one, 32: stamped(cfg(splits=2), triton_hash)}
    return table(entries=[entry(128, 4, "bf16", buckets)], **meta_kw)


TRITON, GLUON = HASHES["triton"], HASHES["gluon_sm90"]
RECORD_STALENESS = {
    # (hopper record's hash, triton records' hash, metadata) ->
    # (stale buckets, stale triton buckets, warning's counts)
    "current": ((GLUON, TRITON, {}), (set(), set(), None)),
    # Records carry their own hash: the table's combined one plays no part.
    "current_records_other_table_hash": (
        (GLUON, TRITON, {"kernel_hash": OTHER_HASH}),
        (set(), set(), None),
    ),
    "triton_changed": ((GLUON, OTHER_HASH, {}), ({32}, {1, 32}, "2 of 2 triton records")),
    "gluon_changed": ((OTHER_HASH, TRITON, {}), ({1}, set(), "1 of 1 gluon_sm90 records")),
    # A family's hash is not another's: a Hopper record stamped with the
    # Triton kernel's hash is stale.
    "families_swapped": ((TRITON, GLUON, {}), ({1, 32}, {1, 32}, "1 of 1 gluon_sm90 records")),
    "unmeasured": ((OTHER_HASH, OTHER_HASH, {"measured": False}), (set(), set(), None)),
}


@pytest.mark.parametrize("given, expected", RECORD_STALENESS.values(), ids=RECORD_STALENESS.keys())
def test_staleness_is_per_record_and_family(dirs, caplog, given, expected):
    hopper_hash, triton_hash, meta_kw = given
    stale_buckets, stale_triton, counts = expected
    path = write_json(dirs.shipped / "sm90.json", family_table(hopper_hash, triton_hash, **meta_kw))
    with caplog.at_level(logging.WARNING, logger="mla_verify.tables"):
        loaded = tables.load_tables(HASH, HASHES)
        assert warnings_from(caplog) == []
        e = loaded.arch_entries("sm90")["H128_L4_bf16"]
    assert (e.stale_buckets, e.stale_triton) == (stale_buckets, stale_triton)
    assert e.stale is bool(stale_buckets or stale_triton)
    assert e.buckets[1] == VerifyConfig.from_dict(HOPPER)  # used either way
    records = warnings_from(caplog)
    assert len(records) == (counts is not None)  # one warning per table
    if counts is not None:
        message = records[0].getMessage()
        assert str(path) in message and "stale" in message and counts in message


def test_a_stale_warning_counts_every_family_with_stale_records(dirs, caplog):
    write_json(dirs.shipped / "sm90.json", family_table(OTHER_HASH, OTHER_HASH))
    with caplog.at_level(logging.WARNING, logger="mla_verify.tables"):
        loaded = tables.load_tables(HASH, HASHES)
        assert warnings_from(caplog) == []
        loaded.arch_entries("sm90")
    [record] = warnings_from(caplog)
    assert (
        "1 of 1 gluon_sm90 records, 2 of 2 triton records "
        f"(this code: gluon_sm90 {GLUON}, triton {TRITON})" in record.getMessage()
    )


def test_stale_records_counts_per_family():
    data = family_table(GLUON, OTHER_HASH)
    assert tables.stale_records(data, HASH, HASHES) == {"gluon_sm90": (0, 1), "triton": (2, 2)}
    # Records without a hash of their own date from the table's.
    legacy = table(entries=[entry(8, 1, "bf16", {1: bucket(HOPPER), 2: bucket(cfg())})])
    assert tables.stale_records(legacy, HASH, HASHES) == {"gluon_sm90": (0, 1), "triton": (0, 1)}
    assert tables.stale_records(legacy, OTHER_HASH, HASHES) == {
        "gluon_sm90": (1, 1),
        "triton": (1, 1),
    }


def test_records_with_and_without_a_hash_share_a_table(dirs):
    """A record without a hash of its own dates from the table's combined
    one; a record with one answers for itself."""
    buckets = {1: bucket(cfg()), 2: stamped(cfg(), TRITON), 4: stamped(cfg(), OTHER_HASH)}
    data = table(entries=[entry(8, 1, "bf16", buckets)], kernel_hash=OTHER_HASH)
    write_json(dirs.shipped / "sm90.json", data)
    e = tables.load_tables(HASH, HASHES)["sm90"]["H8_L1_bf16"]
    assert e.stale_buckets == {1, 4}
    write_json(dirs.shipped / "sm90.json", data | {"metadata": meta(kernel_hash=HASH)})
    e = tables.load_tables(HASH, HASHES)["sm90"]["H8_L1_bf16"]
    assert e.stale_buckets == {4}


def test_a_write_that_changes_the_table_hash_dates_the_records_without_one(tmp_path):
    """Records of an older table carry no hash and date from its combined
    one. A write under a new combined hash gives them the old one, so they
    stay stale instead of reading as current under the new."""
    path = tmp_path / "sm90.json"
    old = entry(8, 1, "bf16", {1: with_triton()["entries"]["H128_L4_bf16"]["buckets"]["1"]})
    tables.write_entries(path, "sm90", meta(kernel_hash=OTHER_HASH), dict([old]))
    new = entry(16, 1, "bf16", {1: stamped(cfg(), TRITON)})
    tables.write_entries(path, "sm90", meta(kernel_hash=HASH), dict([new]))
    data = tables.read_table(path)
    kept = data["entries"]["H8_L1_bf16"]["buckets"]["1"]
    assert (kept["kernel_hash"], kept["triton"]["kernel_hash"]) == (OTHER_HASH, OTHER_HASH)
    assert data["entries"]["H16_L1_bf16"]["buckets"]["1"]["kernel_hash"] == TRITON
    assert tables.stale_records(data, HASH, HASHES) == {"gluon_sm90": (1, 1), "triton": (1, 2)}
    # Under the same combined hash nothing changes meaning: nothing is dated.
    tables.write_entries(path, "sm90", meta(kernel_hash=OTHER_HASH), dict([old]))
    tables.write_entries(path, "sm90", meta(kernel_hash=OTHER_HASH), dict([new]))
    assert "kernel_hash" not in tables.read_table(path)["entries"]["H8_L1_bf16"]["buckets"]["1"]


def test_a_table_that_named_no_hash_dates_its_records_as_unknown(tmp_path):
    path = tmp_path / "sm90.json"
    tables.write_entries(
        path, "sm90", meta(kernel_hash=None), dict([entry(8, 1, "bf16", {1: bucket(cfg())})])
    )
    tables.write_entries(path, "sm90", meta(), dict([entry(16, 1, "bf16", {1: bucket(cfg())})]))
    data = tables.read_table(path)
    assert (
        data["entries"]["H8_L1_bf16"]["buckets"]["1"]["kernel_hash"] == tables.UNKNOWN_KERNEL_HASH
    )
    assert tables.stale_records(data, HASH, HASHES) == {"triton": (1, 2)}
