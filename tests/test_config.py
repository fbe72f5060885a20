"""The config object, the built-in choices (which kernel runs where) and
the tuner's search space."""

from __future__ import annotations

import dataclasses

import pytest

from mla_verify import hopper
from mla_verify.config import (
    HOPPER_KERNELS,
    VerifyConfig,
    default_config,
    default_num_kv_splits,
    hopper_config,
    hopper_schedules,
    kernel_family,
    rows_per_program,
    runs_score_value,
    triton_default_config,
    value_chunk,
)
from mla_verify.plan import for_separate_v
from mla_verify.search_space import (
    amd_option_candidates,
    min_share_candidates,
    split_candidates,
    tile_candidates,
)


@pytest.fixture(autouse=True)
def _hopper_builds_fp8(monkeypatch):
    # The policy where the Hopper kernel builds for fp8 KV, as on every
    # Triton but 3.7 (whose gate, hopper.FP8_LOWERS, test_kernel.py tests).
    monkeypatch.setattr(hopper, "FP8_LOWERS", True)


def test_kernel_family_groups_the_hopper_schedules():
    """Both Hopper schedules are one kernel's code (one hash); the Triton
    kernel is another."""
    assert [kernel_family(k) for k in ("triton", *HOPPER_KERNELS)] == [
        "triton",
        "gluon_sm90",
        "gluon_sm90",
    ]
    assert kernel_family(hopper_config(16, 4, 8, "gluon_sm90_sv")) == "gluon_sm90"
    assert kernel_family(triton_default_config(16, 4, 8, "sm90")) == "triton"
    with pytest.raises(ValueError, match="kernel: expected one of"):
        kernel_family("cuda")


def test_kernel_field_is_validated_and_named():
    with pytest.raises(ValueError, match=r"VerifyConfig.kernel: expected one of .*got 'cuda'"):
        VerifyConfig(
            BLOCK_H=8, BLOCK_N=64, NUM_KV_SPLITS=1, num_warps=8, num_stages=2, kernel="cuda"
        )


@pytest.mark.parametrize("kernel", HOPPER_KERNELS)
@pytest.mark.parametrize("field,value", [("BLOCK_N", 32), ("num_warps", 4), ("num_stages", 3)])
def test_hopper_kernel_tile_is_fixed(field, value, kernel):
    fields = dict(BLOCK_H=16, BLOCK_N=64, NUM_KV_SPLITS=1, num_warps=8, num_stages=2)
    fields[field] = value
    with pytest.raises(ValueError, match=f"VerifyConfig.{field}: expected .*'{kernel}'"):
        VerifyConfig(**fields, kernel=kernel)


def test_to_dict_round_trips_and_leaves_out_the_default_kernel():
    triton_config = VerifyConfig(BLOCK_H=16, BLOCK_N=64, NUM_KV_SPLITS=3, num_warps=8, num_stages=2)
    assert "kernel" not in triton_config.to_dict()  # tables from before the field read the same
    hopper = hopper_config(128, 4, 32)
    assert hopper.to_dict()["kernel"] == "gluon_sm90"
    score_value = hopper_config(128, 4, 32, "gluon_sm90_sv")
    assert score_value.to_dict()["kernel"] == "gluon_sm90_sv"
    for config in (triton_config, hopper, score_value):
        assert VerifyConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "v_chunk,kernel,expected",
    [
        (48, "triton", r"None, or one of \(32, 64, 128, 256\) with kernel='triton', got 48"),
        (64, "gluon_sm90", r".* with kernel='triton', got 64"),
    ],
)
def test_v_chunk_is_validated_and_named(v_chunk, kernel, expected):
    with pytest.raises(ValueError, match=f"VerifyConfig.V_CHUNK: expected {expected}"):
        VerifyConfig(
            BLOCK_H=8,
            BLOCK_N=64,
            NUM_KV_SPLITS=1,
            num_warps=8,
            num_stages=2,
            kernel=kernel,
            V_CHUNK=v_chunk,
        )


def test_v_chunk_round_trips_and_is_capped_at_the_value_columns():
    config = VerifyConfig(
        BLOCK_H=8, BLOCK_N=64, NUM_KV_SPLITS=1, num_warps=4, num_stages=2, V_CHUNK=256
    )
    assert config.to_dict()["V_CHUNK"] == 256
    assert VerifyConfig.from_dict(config.to_dict()) == config
    unset = dataclasses.replace(config, V_CHUNK=None)
    assert "V_CHUNK" not in unset.to_dict()  # tables from before the field read the same
    assert [value_chunk(config, d_v) for d_v in (512, 256, 128)] == [256, 256, 128]
    assert value_chunk(unset, 512) == 0  # the kernel's rule


def _rows_by_chunk(arch, heads, draft_len, head_dims):
    by_chunk = {}
    for c in tile_candidates(heads, draft_len, arch, "bf16", head_dims, kernel="triton"):
        by_chunk.setdefault(c.V_CHUNK, set()).add(rows_per_program(c.BLOCK_H, draft_len))
    return by_chunk


@pytest.mark.parametrize("arch", ["sm80", "gfx950"])
@pytest.mark.parametrize(
    "heads,draft_len,head_dims", [(8, 4, (576, 512)), (16, 4, (256, 256)), (64, 2, (576, 512))]
)
def test_search_tries_value_chunks_below_64_rows_only(arch, heads, draft_len, head_dims):
    rows = _rows_by_chunk(arch, heads, draft_len, head_dims)
    assert rows[None] >= {16, 32}
    assert set(rows) == {None, 128, 64}
    assert rows[128] == rows[64] == rows[None] - {64, 128}


def test_search_tries_no_chunk_as_wide_as_the_value():
    # 128/128: a chunk of 128 is the whole value, the rule's own choice.
    assert set(_rows_by_chunk("gfx950", 16, 4, (128, 128))) == {None, 64}


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("heads,draft_len", [(8, 1), (16, 4), (128, 4), (40, 3), (128, 8)])
def test_default_on_sm90_is_the_hopper_kernel_with_64_rows(heads, draft_len, kv_dtype):
    # MLA: score/value for bf16 and fp8 KV
    config = default_config(heads, draft_len, 32, "sm90", kv_dtype)
    assert config.kernel == "gluon_sm90_sv"
    assert config.BLOCK_H == min(heads, 64 // draft_len)


@pytest.mark.parametrize("arch", ["sm80", "sm100", "gfx950"])
def test_default_elsewhere_is_the_triton_kernel(arch):
    assert default_config(64, 4, 32, arch) == triton_default_config(64, 4, 32, arch)
    assert default_config(64, 4, 32, arch).kernel == "triton"


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
def test_triton_default_on_sm90_is_not_the_hopper_tile(kv_dtype):
    config = triton_default_config(128, 4, 32, "sm90", kv_dtype)
    assert config.kernel == "triton"
    assert (config.BLOCK_H, config.BLOCK_N, config.num_warps) == (16, 64, 8)  # 64 rows
    assert triton_default_config(128, 4, 32, "sm80", kv_dtype) == config


@pytest.mark.parametrize(
    "arch,head_dims,tokens",
    [
        # 64 rows (H16 L4), 32 rows (H8 L4), 16 rows (H8 L2)
        ("sm90", (576, 512), (64, 64, 64)),
        ("sm80", (576, 512), (64, 64, 64)),
        ("sm100", (576, 512), (32, 64, 64)),  # tcgen05: 64 tokens x 64 rows fit triton 3.9 only
        ("sm100", (256, 256), (64, 64, 64)),
        ("sm89", (576, 512), (16, 32, 64)),  # 99 KB: 64 tokens need 152 KB at 64 rows
        ("sm86", (256, 256), (32, 64, 64)),
        ("sm120", (128, 128), (64, 64, 64)),
        ("sm75", (576, 512), (16, 32, 64)),  # not listed: the smallest of recent archs
        ("cpu", (576, 512), (64, 64, 64)),  # the interpreter has no shared memory limit
    ],
)
def test_nvidia_default_tile_fits_the_arch_shared_memory(arch, head_dims, tokens):
    configs = [
        triton_default_config(heads, draft_len, 8, arch, "bf16", head_dims)
        for heads, draft_len in ((16, 4), (8, 4), (8, 2))
    ]
    assert tuple(c.BLOCK_N for c in configs) == tokens
    assert [c.num_warps for c in configs] == [8, 4, 4]  # 8 warps at 64 rows only


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("heads,draft_len", [(8, 1), (16, 4), (128, 4), (128, 8), (12, 3)])
def test_amd_default_runs_16_token_tiles_on_4_waves(arch, heads, draft_len):
    # A tile that fits LDS and spills no register on either arch
    # (tests/test_aot.py compiles it for every shipped shape).
    config = triton_default_config(heads, draft_len, 1, arch)
    assert (config.BLOCK_N, config.num_warps, config.num_stages) == (16, 4, 2)
    assert rows_per_program(config.BLOCK_H, draft_len) <= 64


def test_portable_search_is_the_triton_kernel_on_every_arch():
    for arch in ("sm90", "sm80", "gfx942", "gfx950"):
        tiles = tile_candidates(16, 4, arch, "bf16", kernel="triton")
        assert tiles and {c.kernel for c in tiles} == {"triton"}, arch
    with pytest.raises(ValueError, match=r"kernel: expected one of \(None, 'triton'\), got 'x'"):
        tile_candidates(16, 4, "sm90", "bf16", kernel="x")


def test_amd_search_space_spans_row_tiles_16_to_128_and_stages_1_to_2():
    tiles = tile_candidates(128, 4, "gfx950", "bf16")
    assert {rows_per_program(c.BLOCK_H, 4) for c in tiles} == {16, 32, 64, 128}
    assert {c.num_stages for c in tiles} == {1, 2}
    assert 16 in {c.BLOCK_N for c in tiles}
    # A [128, 512] fp32 accumulator over 4 waves of 64 lanes (256 words a
    # lane) is left out without compiling it.
    assert all(rows_per_program(c.BLOCK_H, 4) * 512 // (64 * c.num_warps) <= 128 for c in tiles)


def test_amd_compiler_options_are_searched_on_amd_only():
    gfx950 = amd_option_candidates("gfx950")
    assert gfx950[0] == {"waves_per_eu": None, "matrix_instr_nonkdim": None, "kpack": None}
    assert {o["waves_per_eu"] for o in gfx950} == {None, 1, 2}
    assert {o["matrix_instr_nonkdim"] for o in gfx950} == {None, 16, 32}
    assert {o["kpack"] for o in gfx950} == {None}  # Triton resets kpack to 1 on gfx950
    assert {o["kpack"] for o in amd_option_candidates("gfx942")} == {None, 2}
    assert amd_option_candidates("sm90") == [{}]
    for options in gfx950:  # every option is a field a config carries to the launch
        config = VerifyConfig(
            BLOCK_H=8, BLOCK_N=16, NUM_KV_SPLITS=1, num_warps=4, num_stages=2, **options
        )
        assert {k: v for k, v in options.items() if v is not None}.items() <= (
            config.launch_options().items()
        )


def test_tuner_tries_the_hopper_kernel_only_where_it_runs():
    def hopper_kernels(arch, dtype):
        return [c.kernel for c in tile_candidates(16, 4, arch, dtype) if c.kernel != "triton"]

    # both schedules for MLA's bf16 and fp8 KV
    assert hopper_kernels("sm90", "bf16") == ["gluon_sm90", "gluon_sm90_sv"]
    assert hopper_kernels("sm90", "fp8_e4m3") == ["gluon_sm90", "gluon_sm90_sv"]
    assert hopper_kernels("sm90", "fp16") == []
    assert hopper_kernels("gfx950", "bf16") == []


def test_hopper_schedules_name_the_calls_the_hopper_kernel_runs():
    # MLA, 256/256 and 128/128: both schedules for bf16; for fp8 both for
    # MLA, columns for the others; nothing past a tile's 64 rows, nor for
    # other head dims.
    for dims in [(576, 512), (256, 256), (128, 128)]:
        assert hopper_schedules(4, "bf16", dims) == ["gluon_sm90", "gluon_sm90_sv"]
        assert hopper_schedules(65, "bf16", dims) == []
    assert hopper_schedules(4, "fp8_e4m3", (576, 512)) == ["gluon_sm90", "gluon_sm90_sv"]
    for dims in [(256, 256), (128, 128)]:
        assert hopper_schedules(4, "fp8_e4m3", dims) == ["gluon_sm90"]
    assert hopper_schedules(4, "bf16", (192, 128)) == []


@pytest.mark.skipif(not hopper.available(), reason="needs Triton's Gluon")
def test_sm90_search_leaves_out_triton_tiles_where_the_hopper_kernel_runs():
    kernels = lambda dtype: {c.kernel for c in tile_candidates(16, 4, "sm90", dtype)}  # noqa: E731
    assert kernels("bf16") == {"gluon_sm90", "gluon_sm90_sv"}
    assert kernels("fp8_e4m3") == {"gluon_sm90", "gluon_sm90_sv"}
    assert kernels("fp16") == {"triton"}  # the Hopper kernel takes bf16 q and bf16/fp8 KV
    assert "triton" in {c.kernel for c in tile_candidates(16, 4, "sm80", "bf16")}


@pytest.mark.skipif(not hopper.available(), reason="needs Triton's Gluon")
@pytest.mark.parametrize("kernel", HOPPER_KERNELS)
def test_tuner_searches_the_share_floor_of_the_hopper_kernel_only(kernel):
    floors = min_share_candidates("sm90", kernel)
    assert floors[0] is None and len(floors) > 1  # the default first, then larger floors
    assert min_share_candidates("sm90", "triton") == [None]
    assert min_share_candidates("gfx950", kernel) == [None]  # the Triton kernel runs there


@pytest.mark.parametrize(
    "kernel,kv_dtype,head_dims,runs",
    [
        ("gluon_sm90_sv", "bf16", (576, 512), True),
        ("gluon_sm90_sv", "fp8_e4m3", (576, 512), True),
        ("gluon_sm90_sv", "bf16", (256, 256), True),
        ("gluon_sm90_sv", "fp8_e4m3", (256, 256), False),
        ("gluon_sm90", "bf16", (576, 512), False),
        ("triton", "bf16", (576, 512), False),
    ],
)
def test_score_value_schedule_runs_where_its_kv_dtypes_allow(kernel, kv_dtype, head_dims, runs):
    # MLA's score/value takes bf16 and fp8 KV, the other head dims' bf16:
    # an sv entry used for their fp8 KV runs the columns schedule (same
    # tile, same plan).
    assert runs_score_value(kernel, kv_dtype, head_dims) is runs


def test_separate_v_takes_the_triton_kernel_with_a_smaller_ring():
    config = for_separate_v(hopper_config(16, 4, 32).with_min_share(2))
    assert (config.kernel, config.BLOCK_N, config.num_stages) == ("triton", 32, 1)
    assert config.MIN_SHARE is None  # a Hopper-only field


@pytest.mark.skipif(not hopper.available(), reason="needs Triton's Gluon")
@pytest.mark.parametrize("kernel", HOPPER_KERNELS)
def test_tuner_times_one_split_count_for_the_hopper_kernel(kernel):
    # The Hopper kernel plans its own shares and ignores NUM_KV_SPLITS: the
    # tuner must not time the same launch once per split count.
    assert split_candidates(16, 8, 16, "sm90", kernel) == [
        default_num_kv_splits(16, 8, 16, 64, "sm90")
    ]
    assert len(split_candidates(16, 8, 16, "sm90", "triton")) > 1
    assert len(split_candidates(16, 8, 16, "gfx950", kernel)) > 1  # the Triton kernel runs there


@pytest.mark.parametrize("head_dims", [(256, 256), (128, 128)])
def test_other_head_dims_on_sm90(head_dims):
    """256/256 and 128/128 default, as MLA does, to the Hopper kernel's
    score/value schedule with bf16 KV and to its columns schedule with fp8;
    the tuner searches them beside the Triton kernel's tiles. For
    the Triton kernel a separate V cache (as SGLang passes it) keeps the
    tuned tile: K and V together are no wider than MLA's K."""
    assert default_config(16, 4, 32, "sm90", "bf16", head_dims).kernel == "gluon_sm90_sv"
    assert default_config(16, 4, 32, "sm90", "fp8_e4m3", head_dims).kernel == "gluon_sm90"
    assert default_config(16, 4, 32, "sm80", "bf16", head_dims).kernel == "triton"
    tiles = tile_candidates(16, 4, "sm90", "bf16", head_dims)
    assert {c.kernel for c in tiles} == {"gluon_sm90", "gluon_sm90_sv", "triton"}
    fp8_tiles = tile_candidates(16, 4, "sm90", "fp8_e4m3", head_dims)
    assert {c.kernel for c in fp8_tiles} == {"gluon_sm90", "triton"}
    config = VerifyConfig(BLOCK_H=16, BLOCK_N=64, NUM_KV_SPLITS=3, num_warps=8, num_stages=2)
    assert for_separate_v(config, head_dims) == config
    fallback = for_separate_v(hopper_config(16, 4, 32), head_dims)
    assert (fallback.kernel, fallback.BLOCK_N, fallback.num_stages) == ("triton", 64, 2)
