"""Runtime lookup: exact entries and batch buckets, nearest-entry adaptation,
dtype fallback, the built-in default with one warning, purity (no file
access, no tuner import). CPU only."""

from __future__ import annotations

import ast
import builtins
import io
import json
import logging
import os
import pathlib
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mla_verify import device as device_facts
from mla_verify import lookup, tables
from mla_verify.code_hash import KERNEL_HASH, KERNEL_HASHES, kernel_hash
from mla_verify.config import (
    HOPPER_KERNELS,
    VerifyConfig,
    default_config,
    hopper_config,
    triton_default_config,
)

PACKAGE_DIR = Path(lookup.__file__).parent


# --- helpers --------------------------------------------------------------------


def cfg(block_h: int = 4, splits: int = 8, **kw: int) -> VerifyConfig:
    fields = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2} | kw
    return VerifyConfig(BLOCK_H=block_h, NUM_KV_SPLITS=splits, **fields)


def entry(h: int, l: int, dtype: str, buckets: dict[int, VerifyConfig]) -> tuple[str, dict]:
    body = {
        "num_heads": h,
        "draft_len": l,
        "kv_dtype": dtype,
        "buckets": {
            str(b): {"config": c.to_dict(), "tuned_us": 10.0, "default_us": 12.0}
            for b, c in buckets.items()
        },
    }
    return tables.entry_key(h, l, dtype), body


def write_table(directory: Path, arch: str, entries: list, kernel_hash: str = KERNEL_HASH) -> Path:
    path = directory / f"{arch}.json"
    meta = {"arch": arch, "kernel_hash": kernel_hash, "measured": True}
    tables.write_entries(path, arch, meta, dict(entries))
    return path


def lookup_records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "mla_verify.lookup" and r.levelno == level
    ]


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Isolated env / user / shipped dirs; tables reloaded from them. Call
    ``lookup.reload_tables()`` after writing tables."""
    d = SimpleNamespace(env=tmp_path / "env", user=tmp_path / "user", shipped=tmp_path / "shipped")
    for p in vars(d).values():
        p.mkdir()
    monkeypatch.setenv(tables.ENV_VAR, str(d.env))
    monkeypatch.setattr(tables, "user_table_dir", lambda: d.user)
    monkeypatch.setattr(tables, "shipped_table_dir", lambda: d.shipped)
    lookup.reload_tables()
    yield d
    monkeypatch.undo()
    lookup.reload_tables()


H128 = {"BLOCK_N": 32, "num_warps": 8, "num_stages": 1}  # unlike any default_config


@pytest.fixture
def sm90(dirs) -> Path:
    """sm90 table: H128 L4 bf16 with buckets 1..256, and H16/H64 L4 entries."""
    path = write_table(
        dirs.shipped,
        "sm90",
        [
            entry(128, 4, "bf16", {b: cfg(16, b % 64 + 1, **H128) for b in (1, 4, 16, 64, 256)}),
            entry(16, 4, "bf16", {8: cfg(16, 5, BLOCK_N=32)}),
            entry(64, 4, "bf16", {8: cfg(16, 3, BLOCK_N=32, num_stages=3)}),
        ],
    )
    lookup.reload_tables()
    return path


# --- exact entries and buckets ----------------------------------------------------


def test_head_dims_entries_stand_in_only_for_their_dims(dirs, caplog):
    """An entry keyed by head dims serves those dims (exactly and as the
    nearest), never MLA's, and MLA's entries never serve other dims."""
    d256 = entry(16, 4, "bf16", {8: cfg(8, 6, BLOCK_N=32)})
    d256 = (tables.entry_key(16, 4, "bf16", (256, 256)), d256[1] | {"head_dims": [256, 256]})
    write_table(dirs.shipped, "sm90", [entry(16, 4, "bf16", {8: cfg(16, 5)}), d256])
    lookup.reload_tables()
    config, source = lookup.resolve_config(16, 4, 8, arch="sm90", head_dims=(256, 256))
    assert config == cfg(8, 6, BLOCK_N=32) and "H16_L4_bf16_D256" in source
    assert lookup.resolve_config(16, 4, 8, arch="sm90")[0] == cfg(16, 5)
    assert (
        "H16_L4_bf16_D256" in lookup.resolve_config(32, 4, 8, arch="sm90", head_dims=(256, 256))[1]
    )
    config, source = lookup.resolve_config(16, 4, 8, arch="sm90", head_dims=(128, 128))
    assert source == "built-in default"
    assert "--head-dims 128x128" in lookup_records(caplog, logging.WARNING)[-1]
    # No MLA entry stands in: the built-in default, for bf16 128/128 on sm90
    # the Hopper kernel's score/value schedule.
    assert config.kernel == "gluon_sm90_sv"
    with pytest.raises(ValueError, match="head_dims"):
        lookup.block_config(16, 4, 8, arch="sm90", head_dims=(256, 128))


def test_exact_entry(sm90):
    config, source = lookup.resolve_config(128, 4, 16, torch.bfloat16, arch="sm90")
    assert config == cfg(16, 17, **H128)
    assert source == f"sm90.json entry H128_L4_bf16, bucket 16 ({sm90})"
    assert lookup.block_config(128, 4, 16, "bf16", arch="sm90") is config


BUCKETS = {  # buckets are 1, 4, 16, 64, 256
    "bs1_exact": (1, 1),
    "bs2_tie_goes_larger": (2, 4),
    "bs3_nearer_4": (3, 4),
    "bs5_nearer_4": (5, 4),
    "bs8_tie_goes_larger": (8, 16),
    "bs100_nearer_64": (100, 64),
    "bs128_tie_goes_larger": (128, 256),
    "bs1000_above_all": (1000, 256),
}


@pytest.mark.parametrize("batch, bucket", BUCKETS.values(), ids=BUCKETS.keys())
def test_bucket_nearest_in_log2(sm90, batch, bucket):
    config, source = lookup.resolve_config(128, 4, batch, arch="sm90")
    assert f"bucket {bucket} " in source
    assert config == cfg(16, bucket % 64 + 1, **H128)  # as the sm90 fixture wrote it


def test_bucket_tie_is_exact_for_non_powers_of_two(dirs):
    # 10/5 == 20/10, but float log2 makes 5 look nearer by 4e-16.
    write_table(dirs.env, "sm90", [entry(8, 2, "bf16", {5: cfg(splits=1), 20: cfg(splits=2)})])
    lookup.reload_tables()
    assert lookup.block_config(8, 2, 10, arch="sm90") == cfg(splits=2)


def test_stale_entry_still_used(dirs):
    path = write_table(dirs.user, "sm90", [entry(8, 2, "bf16", {4: cfg(splits=7)})], "0" * 16)
    lookup.reload_tables()
    config, source = lookup.resolve_config(8, 2, 4, arch="sm90")
    assert config == cfg(splits=7)
    assert source == f"sm90.json entry H8_L2_bf16, bucket 4 ({path}, stale)"


OLD_HASH = "0" * 16  # the hash of code since changed


def write_stamped(directory: Path, triton_hash: str, hopper_hash: str | None = None) -> Path:
    """sm90 H128 L4 bf16: buckets 1 and 64 of the Hopper kernel with the
    Triton kernel's winner beside, each record stamped with this code's
    hash of its family; bucket 64's Triton record ``triton_hash``, its
    Hopper record ``hopper_hash`` (this code's where None)."""
    buckets = {}
    for bs in (1, 64):
        hopper = hopper_config(128, 4, bs, "gluon_sm90_sv")
        hopper_record = tables.Record(hopper, 10.0, 12.0, kernel_hash=kernel_hash(hopper))
        triton = tables.Record(cfg(16, bs, **H128), 20.0, 25.0, kernel_hash=kernel_hash("triton"))
        if bs == 64:
            triton = tables.Record(triton.config, 20.0, 25.0, kernel_hash=triton_hash)
            hopper_record = tables.Record(
                hopper, 10.0, 12.0, kernel_hash=hopper_hash or kernel_hash(hopper)
            )
        buckets[str(bs)] = tables.bucket_json(hopper_record, triton)
    body = {"num_heads": 128, "draft_len": 4, "kv_dtype": "bf16", "buckets": buckets}
    path = directory / "sm90.json"
    meta = {"arch": "sm90", "kernel_hash": OLD_HASH, "measured": True}  # records answer alone
    tables.write_entries(path, "sm90", meta, {"H128_L4_bf16": body})
    lookup.reload_tables()
    return path


def test_a_source_names_a_stale_record_not_a_stale_table(dirs):
    """After a change to the Triton kernel alone, its stale record says so;
    the Hopper records beside it, measured with the Hopper kernel's current
    code, and the Triton record of another bucket do not."""
    path = write_stamped(dirs.shipped, triton_hash=OLD_HASH)
    _, source = lookup.resolve_config(128, 4, 64, arch="sm90", kernel="triton")
    assert source == f"sm90.json entry H128_L4_bf16, bucket 64 (triton) ({path}, stale)"
    _, source = lookup.resolve_config(128, 4, 1, arch="sm90", kernel="triton")
    assert source == f"sm90.json entry H128_L4_bf16, bucket 1 (triton) ({path})"
    for bs in (1, 64):
        _, source = lookup.resolve_config(128, 4, bs, arch="sm90")
        assert source == f"sm90.json entry H128_L4_bf16, bucket {bs} ({path})"


def test_a_stale_table_warns_at_the_first_lookup_of_its_arch(dirs, caplog):
    """Not at load: tables of other arches are never looked up."""
    path = write_table(dirs.user, "sm90", [entry(8, 2, "bf16", {4: cfg(splits=7)})], OLD_HASH)
    write_table(dirs.user, "gfx950", [entry(8, 2, "bf16", {4: cfg(splits=5)})])

    def stale_warnings() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "mla_verify.tables" and "stale records" in r.getMessage()
        ]

    with caplog.at_level(logging.WARNING, logger="mla_verify.tables"):
        lookup.reload_tables()
        assert stale_warnings() == []
        assert lookup.block_config(8, 2, 4, arch="gfx950") == cfg(splits=5)
        assert lookup.block_config(8, 2, 4, arch="gfx942") == default_config(8, 2, 4, "gfx942")
        assert stale_warnings() == []
        assert lookup.block_config(8, 2, 4, arch="sm90") == cfg(splits=7)
        lookup.block_config(8, 2, 1, arch="sm90")  # another batch size
        lookup.resolve_config(16, 2, 4, arch="sm90", kernel="triton")  # another shape and kernel
    [warning] = stale_warnings()
    assert f"config table {path} has stale records" in warning
    assert f"1 of 1 triton records (this code: triton {KERNEL_HASHES['triton']})" in warning


def test_a_change_to_the_hopper_kernel_stales_only_its_records(dirs):
    path = write_stamped(dirs.shipped, triton_hash=kernel_hash("triton"), hopper_hash=OLD_HASH)
    _, source = lookup.resolve_config(128, 4, 64, arch="sm90")
    assert source == f"sm90.json entry H128_L4_bf16, bucket 64 ({path}, stale)"
    _, source = lookup.resolve_config(128, 4, 64, arch="sm90", kernel="triton")
    assert source == f"sm90.json entry H128_L4_bf16, bucket 64 (triton) ({path})"


def test_memoized_and_dtype_spellings_agree(sm90):
    a = lookup.resolve_config(128, 4, 16, torch.bfloat16, arch="sm90")
    b = lookup.resolve_config(128, 4, 16, "bf16", arch="sm90")
    assert a is b
    with pytest.raises(ValueError, match="kv_dtype"):
        lookup.resolve_config(128, 4, 16, torch.float32, arch="sm90")


def test_rejects_non_positive_shapes(sm90):
    with pytest.raises(ValueError, match="batch_size"):
        lookup.block_config(128, 4, 0, arch="sm90")
    with pytest.raises(ValueError, match="draft_len"):
        lookup.block_config(128, 0, 1, arch="sm90")


# --- nearest entries ----------------------------------------------------------------


ADAPT = {
    # tuned H128 L4: BLOCK_H 16 (64 rows), 8 head blocks, bucket 16 -> 17 splits
    "L3_more_heads_per_block": (128, 3, VerifyConfig(21, 32, 19, 8, 1)),  # 17*8/7 = 19.4
    "L8_fewer_heads_per_block": (128, 8, VerifyConfig(8, 32, 9, 8, 1)),  # 17*8/16 = 8.5 -> 9
    "L16_longest_drafts": (128, 16, VerifyConfig(4, 32, 4, 8, 1)),  # 17*8/32 = 4.25 -> 4
    "L2_block_h_capped": (128, 2, VerifyConfig(32, 32, 34, 8, 1)),  # 17*8/4
}


@pytest.mark.parametrize("heads, draft_len, expected", ADAPT.values(), ids=ADAPT.keys())
def test_unseen_draft_len_adapts_nearest(sm90, heads, draft_len, expected):
    config, source = lookup.resolve_config(heads, draft_len, 16, arch="sm90")
    assert config == expected
    assert config != default_config(heads, draft_len, 16, "sm90")
    assert source.startswith("nearest: sm90.json entry H128_L4_bf16, bucket 16 (")
    assert source.endswith(f"adapted to H{heads}_L{draft_len}_bf16")


@pytest.mark.parametrize("kernel", HOPPER_KERNELS)
def test_hopper_entry_adapts_to_a_full_tile(dirs, kernel):
    # Tuned at H12 L4 the Hopper tile holds all 12 heads (48 of its 64 rows):
    # carried to more heads it takes as many as fill the 64 rows.
    tuned = hopper_config(12, 4, 32, kernel).with_splits(3)
    assert tuned.BLOCK_H == 12
    write_table(dirs.env, "sm90", [entry(12, 4, "bf16", {32: tuned})])
    lookup.reload_tables()
    config, source = lookup.resolve_config(128, 4, 32, arch="sm90")
    assert "entry H12_L4_bf16" in source
    assert (config.kernel, config.BLOCK_H) == (kernel, 16)
    assert config.NUM_KV_SPLITS == 1  # 3 splits x 1 head block / 8 head blocks, at least 1
    # a longer draft: 8 heads of 8 rows (the Triton rule would give 12 * 4 // 8 = 6)
    assert lookup.resolve_config(12, 8, 32, arch="sm90")[0].BLOCK_H == 8


HEADS = {
    # sm90 has H16, H64, H128 at L4 (BLOCK_H 16 everywhere)
    "H32_tie_goes_larger_H64": (32, 8, VerifyConfig(16, 32, 6, 4, 3)),  # 3 * 4/2 splits
    "H24_nearer_H16": (24, 8, VerifyConfig(16, 32, 3, 4, 2)),  # 5 * 1/2 = 2.5 -> 3
    "H96_nearer_H128": (96, 16, VerifyConfig(16, 32, 23, 8, 1)),  # 17 * 8/6 = 22.7
}


@pytest.mark.parametrize("heads, batch, expected", HEADS.values(), ids=HEADS.keys())
def test_unseen_head_count_adapts_nearest(sm90, heads, batch, expected):
    config, source = lookup.resolve_config(heads, 4, batch, arch="sm90")
    assert config == expected
    assert source.startswith("nearest: ")


def test_triton_tile_carries_over_only_at_its_rows_per_program(sm90, caplog):
    """H8 L4's nearest entry, H16 L4, is tuned at 64 rows (BLOCK_H 16); with
    BLOCK_H capped at 8 it would run 32 rows on warps and stages chosen for
    64, so the built-in default runs, with the warning that says how to
    tune the shape."""
    with caplog.at_level(logging.WARNING, logger="mla_verify.lookup"):
        config, source = lookup.resolve_config(8, 4, 8, arch="sm90")
    assert (config, source) == (default_config(8, 4, 8, "sm90"), "built-in default")
    [warning] = lookup_records(caplog, logging.WARNING)
    assert "no tuned config for sm90 H8_L4_bf16" in warning
    # the same entry carried to more heads keeps its 64 rows, and is used
    assert lookup.resolve_config(24, 4, 8, arch="sm90")[1].startswith("nearest: ")


def _source_key(heads: int, draft_len: int, arch: str = "sm90", dtype: str = "bf16") -> str:
    source = lookup.resolve_config(heads, draft_len, 1, dtype, arch=arch)[1]
    return source.split(" entry ")[1].split(",")[0]


def test_nearest_prefers_same_heads_then_nearest_draft_len(dirs):
    write_table(
        dirs.env,
        "sm90",
        [
            entry(128, 2, "bf16", {1: cfg()}),
            entry(128, 4, "bf16", {1: cfg()}),
            entry(64, 3, "bf16", {1: cfg()}),
            entry(16, 2, "bf16", {1: cfg()}),
            entry(16, 6, "bf16", {1: cfg()}),
            entry(8, 5, "bf16", {1: cfg()}),
        ],
    )
    lookup.reload_tables()
    assert _source_key(128, 3) == "H128_L4_bf16"  # same H beats exact L; |dL| tie -> larger L
    assert _source_key(128, 1) == "H128_L2_bf16"
    assert _source_key(32, 1) == "H64_L3_bf16"  # H tie 16/64 -> larger H, then its L
    assert _source_key(12, 3) == "H16_L2_bf16"  # nearer H16 (12/8 > 16/12), then nearest L
    assert _source_key(16, 4) == "H16_L6_bf16"  # |dL| tie within H16 -> larger L


KV_FALLBACK = ["fp16", "fp8_e4m3"] + (["fp8_e4m3fnuz"] if hasattr(torch, "float8_e4m3fnuz") else [])


@pytest.mark.parametrize("dtype", KV_FALLBACK)
def test_missing_kv_dtype_falls_back_to_bf16(sm90, dtype):
    config, source = lookup.resolve_config(128, 4, 64, dtype, arch="sm90")
    assert config == lookup.block_config(128, 4, 64, "bf16", arch="sm90")
    assert source.startswith("nearest: sm90.json entry H128_L4_bf16, bucket 64")


def test_own_kv_dtype_entries_win_over_bf16(dirs):
    write_table(
        dirs.env,
        "sm90",
        [entry(128, 4, "bf16", {1: cfg(16)}), entry(64, 4, "fp8_e4m3", {1: cfg(8, 2)})],
    )
    lookup.reload_tables()
    config, source = lookup.resolve_config(128, 4, 1, torch.float8_e4m3fn, arch="sm90")
    assert "H64_L4_fp8_e4m3" in source
    assert config == cfg(8, 1)  # twice the head blocks, half the splits


def test_bf16_does_not_borrow_fp8_entries(dirs, caplog):
    write_table(dirs.env, "sm90", [entry(128, 4, "fp8_e4m3", {1: cfg(16)})])
    lookup.reload_tables()
    assert lookup.resolve_config(128, 4, 1, arch="sm90") == (
        default_config(128, 4, 1, "sm90"),
        "built-in default",
    )


def test_nearest_logs_one_info_per_shape(sm90, caplog):
    with caplog.at_level(logging.INFO, logger="mla_verify.lookup"):
        for batch in (1, 2, 3, 1):
            lookup.block_config(128, 3, batch, arch="sm90")
        lookup.block_config(128, 5, 1, arch="sm90")
    infos = lookup_records(caplog, logging.INFO)
    assert len(infos) == 2
    assert "H128_L3_bf16" in infos[0] and "H128_L5_bf16" in infos[1]
    assert lookup_records(caplog, logging.WARNING) == []


# --- the portable kernel (kernel="triton") -------------------------------------------


def write_with_triton(directory: Path, winners: dict[int, VerifyConfig | None]) -> Path:
    """sm90 H128 L4 bf16: Hopper buckets, each with its Triton winner (or none)."""
    buckets = {}
    for bs, winner in winners.items():
        hopper = tables.Record(hopper_config(128, 4, bs, "gluon_sm90_sv"), 10.0, 12.0)
        triton = None if winner is None else tables.Record(winner, 20.0, 25.0)
        buckets[str(bs)] = tables.bucket_json(hopper, triton)
    body = {"num_heads": 128, "draft_len": 4, "kv_dtype": "bf16", "buckets": buckets}
    path = directory / "sm90.json"
    meta = {"arch": "sm90", "kernel_hash": KERNEL_HASH, "measured": True}
    tables.write_entries(path, "sm90", meta, {"H128_L4_bf16": body})
    lookup.reload_tables()
    return path


def test_triton_kernel_gets_the_tuned_triton_winner(dirs):
    path = write_with_triton(dirs.shipped, {1: cfg(16, 33, **H128), 64: cfg(16, 3, **H128)})
    config, source = lookup.resolve_config(128, 4, 64, arch="sm90", kernel="triton")
    assert config == cfg(16, 3, **H128)
    assert source == f"sm90.json entry H128_L4_bf16, bucket 64 (triton) ({path})"
    assert lookup.block_config(128, 4, 2, arch="sm90", kernel="triton") == cfg(16, 33, **H128)
    # kernel=None keeps its meaning: the arch's best, the Hopper kernel here
    assert lookup.block_config(128, 4, 64, arch="sm90").kernel == "gluon_sm90_sv"
    assert lookup.block_config(128, 4, 64, arch="sm90", kernel=None).kernel == "gluon_sm90_sv"


def test_triton_kernel_takes_the_nearest_bucket_that_has_a_triton_winner(dirs):
    write_with_triton(dirs.shipped, {1: cfg(16, 33, **H128), 64: None})
    config, source = lookup.resolve_config(128, 4, 64, arch="sm90", kernel="triton")
    assert config == cfg(16, 33, **H128) and "bucket 1 (triton)" in source


def test_triton_kernel_adapts_a_nearest_triton_winner(dirs):
    write_with_triton(dirs.shipped, {16: cfg(16, 17, **H128)})
    config, source = lookup.resolve_config(128, 8, 16, arch="sm90", kernel="triton")
    assert config == VerifyConfig(8, 32, 9, 8, 1)  # as test_unseen_draft_len_adapts_nearest
    assert source.startswith("nearest: sm90.json entry H128_L4_bf16, bucket 16 (triton)")


def test_triton_kernel_without_a_tuned_winner_gets_its_own_default(dirs, caplog):
    """On sm90 the Triton kernel's built-in tile, not the Hopper one, with
    one warning that says which kernel is untuned."""
    write_with_triton(dirs.shipped, {1: None, 64: None})
    with caplog.at_level(logging.WARNING, logger="mla_verify.lookup"):
        for batch in (1, 64):
            config, source = lookup.resolve_config(128, 4, batch, arch="sm90", kernel="triton")
            assert config == triton_default_config(128, 4, batch, "sm90")
            assert config.kernel == "triton" and source == "built-in default (triton)"
        assert lookup.block_config(128, 4, 1, arch="sm90").kernel == "gluon_sm90_sv"
    [warning] = lookup_records(caplog, logging.WARNING)
    assert "no tuned triton config for sm90 H128_L4_bf16" in warning


def test_triton_kernel_on_amd_is_the_tables_config(dirs):
    write_table(dirs.shipped, "gfx950", [entry(16, 2, "bf16", {8: cfg(8, 5, BLOCK_N=16)})])
    lookup.reload_tables()
    assert lookup.block_config(16, 2, 8, arch="gfx950", kernel="triton") == cfg(8, 5, BLOCK_N=16)
    assert lookup.block_config(16, 2, 8, arch="gfx950") == cfg(8, 5, BLOCK_N=16)
    assert lookup.block_config(64, 4, 8, arch="gfx942", kernel="triton") == (
        triton_default_config(64, 4, 8, "gfx942")
    )


@pytest.mark.parametrize("kernel", ["gluon_sm90", "cuda", ""])
def test_kernel_argument_is_validated_and_named(sm90, kernel):
    with pytest.raises(
        ValueError, match=rf"kernel: expected one of \(None, 'triton'\), got '{kernel}'"
    ):
        lookup.block_config(128, 4, 1, arch="sm90", kernel=kernel)


# --- built-in default -------------------------------------------------------------


def test_no_entry_uses_default_with_one_warning(sm90, caplog):
    with caplog.at_level(logging.INFO, logger="mla_verify.lookup"):
        first = lookup.resolve_config(16, 2, 8, "fp8_e4m3", arch="sm100")
        again = lookup.resolve_config(16, 2, 8, "fp8_e4m3", arch="sm100")
        other_batch = lookup.resolve_config(16, 2, 64, "fp8_e4m3", arch="sm100")
    assert first == again == (default_config(16, 2, 8, "sm100"), "built-in default")
    assert other_batch[0] == default_config(16, 2, 64, "sm100")
    [warning] = lookup_records(caplog, logging.WARNING)
    assert "sm100 H16_L2_fp8_e4m3" in warning
    assert "python -m mla_verify.tune --heads 16 --draft-lens 2 --kv-dtype fp8_e4m3" in warning


def test_no_tables_at_all_uses_default(dirs, caplog):
    with caplog.at_level(logging.WARNING, logger="mla_verify.lookup"):
        config = lookup.block_config(128, 4, 32, arch="gfx950")
    assert config == default_config(128, 4, 32, "gfx950")
    assert len(lookup_records(caplog, logging.WARNING)) == 1


def test_reload_picks_up_new_tables_and_warns_again(dirs, caplog):
    with caplog.at_level(logging.WARNING, logger="mla_verify.lookup"):
        assert lookup.resolve_config(8, 4, 1, arch="sm90")[1] == "built-in default"
        write_table(dirs.user, "sm90", [entry(8, 4, "bf16", {1: cfg(splits=3)})])
        assert lookup.resolve_config(8, 4, 1, arch="sm90")[1] == "built-in default"  # memoized
        lookup.reload_tables()
        assert lookup.block_config(8, 4, 1, arch="sm90") == cfg(splits=3)
        assert lookup.resolve_config(8, 2, 1, "fp16", arch="sm100")[1] == "built-in default"
    assert len(lookup_records(caplog, logging.WARNING)) == 2


def test_bad_tables_never_break_reload(dirs, caplog):
    (dirs.env / "sm90.json").write_text('{"schema_version": 1, "ar')
    (dirs.user / "sm90.json").write_text(json.dumps({"schema_version": 2}))
    write_table(dirs.shipped, "sm90", [entry(8, 4, "bf16", {1: cfg(splits=3)})])
    with caplog.at_level(logging.WARNING):
        lookup.reload_tables()
    assert lookup.block_config(8, 4, 1, arch="sm90") == cfg(splits=3)
    warned = sorted(r.getMessage() for r in caplog.records if r.name == "mla_verify.tables")
    assert len(warned) == 2
    assert str(dirs.env / "sm90.json") in warned[0]
    assert str(dirs.user / "sm90.json") in warned[1]


# --- purity ---------------------------------------------------------------------


def test_lookups_touch_no_files(sm90, monkeypatch):
    def no_io(*args, **kwargs):
        raise AssertionError(f"file access during lookup: {args}")

    with monkeypatch.context() as m:
        for owner, name in (
            (builtins, "open"),
            (io, "open"),
            (os, "open"),
            (os, "stat"),
            (os, "listdir"),
            (os, "scandir"),
            (pathlib.Path, "open"),
        ):
            m.setattr(owner, name, no_io)
        exact = lookup.resolve_config(128, 4, 32, arch="sm90")
        nearest = lookup.resolve_config(128, 3, 32, "fp8_e4m3", arch="sm90")
        default = lookup.block_config(7, 3, 5, "fp16", arch="gfx942")
    assert exact[1].startswith("sm90.json")
    assert nearest[1].startswith("nearest:")
    assert default == default_config(7, 3, 5, "gfx942")


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names |= {base} | {f"{base}.{alias.name}".replace("..", ".") for alias in node.names}
    return names


@pytest.mark.parametrize("module", ["lookup.py", "tables.py"])
def test_runtime_modules_do_not_import_tuner(module):
    names = _imported_modules(PACKAGE_DIR / module)
    assert ".config" in names or ".tables" in names  # the parser does see our imports
    assert not any("tune" in name for name in names), names


def test_fresh_import_is_pure(tmp_path):
    """In a fresh interpreter: import with a corrupt table present never
    raises, lookups work, and the tuner is never imported."""
    env = tmp_path / "env"
    # Made-up arch names, so shipped tables in the checkout cannot interfere.
    write_table(env, "sm999", [entry(8, 4, "bf16", {1: cfg(splits=3)})])
    (env / "sm998.json").write_text("{corrupt")
    script = textwrap.dedent(
        """
        import sys
        import mla_verify.lookup as lookup
        print(lookup.block_config(8, 4, 1, arch="sm999").NUM_KV_SPLITS)
        print(lookup.resolve_config(8, 2, 1, "fp8_e4m3", arch="sm999")[1].split(":")[0])
        print(lookup.resolve_config(8, 4, 1, arch="sm998")[1])
        print("mla_verify.tune" in sys.modules)
        """
    )
    proc = _run_fresh(script, env, tmp_path)
    assert proc.stdout.split("\n")[:4] == ["3", "nearest", "built-in default", "False"]
    assert f"ignoring config table {env / 'sm998.json'}" in proc.stderr


def _run_fresh(script: str, env: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter that finds this checkout's package,
    the tables of ``env`` and an empty user dir; it must succeed."""
    run_env = os.environ | {
        tables.ENV_VAR: str(env),
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "PYTHONPATH": os.pathsep.join([str(PACKAGE_DIR.parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", script], env=run_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_importing_the_tuner_says_nothing_of_stale_tables(tmp_path):
    """In a fresh interpreter, as each of the tuner's compile workers
    imports the package: a stale table loads silently, and only the first
    lookup of its arch warns."""
    env = tmp_path / "env"
    path = write_table(env, "sm999", [entry(8, 4, "bf16", {1: cfg(splits=3)})], OLD_HASH)
    script = textwrap.dedent(
        """
        import sys
        import mla_verify.tune
        import mla_verify.lookup as lookup
        print("imported", file=sys.stderr, flush=True)
        lookup.block_config(8, 4, 1, arch="sm999")
        lookup.block_config(8, 2, 1, arch="sm999")
        """
    )
    proc = _run_fresh(script, env, tmp_path)
    at_import, at_lookup = proc.stderr.split("imported\n")
    assert "has stale records" not in at_import  # nor of the shipped tables
    assert at_lookup.count("has stale records") == 1
    assert f"config table {path} has stale records" in at_lookup


# --- arch detection ------------------------------------------------------------------


@pytest.fixture
def fake_gpu(monkeypatch):
    device_facts._arch_of.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    yield monkeypatch
    device_facts._arch_of.cache_clear()


def test_current_arch_nvidia(fake_gpu):
    fake_gpu.setattr(torch.version, "hip", None)
    fake_gpu.setattr(torch.cuda, "get_device_capability", lambda i: {0: (9, 0), 1: (10, 0)}[i])
    assert device_facts.current_arch() == "sm90"
    assert device_facts.current_arch(1) == "sm100"
    assert device_facts.current_arch("cuda:1") == "sm100"
    assert device_facts.current_arch(torch.device("cuda")) == "sm90"


def test_current_arch_rocm(fake_gpu):
    fake_gpu.setattr(torch.version, "hip", "6.3.0")
    props = SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-")
    fake_gpu.setattr(torch.cuda, "get_device_properties", lambda i: props)
    assert device_facts.current_arch() == "gfx942"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_current_arch_without_gpu_asks_for_arch():
    with pytest.raises(RuntimeError, match="no CUDA or ROCm GPU is visible"):
        device_facts.current_arch()
    with pytest.raises(RuntimeError, match="name it"):
        lookup.block_config(128, 4, 1)


# --- describe ----------------------------------------------------------------------


def test_describe_tables(dirs):
    fresh = write_table(dirs.user, "sm90", [entry(8, 4, "bf16", {1: cfg(), 32: cfg()})])
    stale = write_table(dirs.shipped, "gfx950", [entry(16, 2, "fp8_e4m3", {4: cfg()})], "0" * 16)
    lookup.reload_tables()
    text = lookup.describe_tables()
    assert f"  user: {dirs.user}" in text
    assert "sm90: 1 entry" in text and "gfx950: 1 entry" in text
    assert f"  {fresh}: 1 entry\n    H8_L4_bf16: buckets 1, 32" in text
    assert f"  {stale}: 1 entry (stale)" in text
    assert f"{fresh}: 1 entry (stale)" not in text


def test_describe_tables_names_the_buckets_with_stale_records(dirs):
    path = write_stamped(dirs.user, triton_hash=OLD_HASH)
    text = lookup.describe_tables()
    assert text.endswith(f"  {path}: 1 entry (stale)\n    H128_L4_bf16: buckets 1, 64 (stale: 64)")
    write_table(dirs.user, "sm90", [entry(8, 4, "bf16", {1: cfg()})])  # current, beside
    lookup.reload_tables()
    text = lookup.describe_tables()
    assert f"  {path}: 2 entries (1 with stale records)\n" in text
    assert "    H8_L4_bf16: buckets 1\n    H128_L4_bf16: buckets 1, 64 (stale: 64)" in text
