"""The model the AMD tables are derived from: what it charges for, and the
choices it makes, on stand-in compile results (no compiler needed)."""

from __future__ import annotations

import pytest

from mla_verify.aot import Resources
from mla_verify.config import VerifyConfig
from mla_verify.perf_model import MODELS, best_config, estimate_us, programs_per_cu

GFX950 = MODELS["gfx950"]
FITS = Resources(shared=36864, registers=283, spills=0, scratch=0)  # 4 waves: one a CU


def tile(
    block_h: int, block_n: int = 16, warps: int = 4, stages: int = 2, v_chunk: int | None = None
) -> VerifyConfig:
    return VerifyConfig(
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        NUM_KV_SPLITS=1,
        num_warps=warps,
        num_stages=stages,
        V_CHUNK=v_chunk,
    )


def test_the_models_state_the_brief():
    assert (GFX950.compute_units, GFX950.lds_bytes, GFX950.wave_size) == (256, 160 * 1024, 64)
    assert GFX950.mfma == "16x16x32 bf16" and GFX950.hbm_bytes_per_s == 8e12
    gfx942 = MODELS["gfx942"]
    assert (gfx942.compute_units, gfx942.lds_bytes, gfx942.mfma) == (304, 65536, "16x16x16 bf16")
    assert "hbm_latency_s" in GFX950.as_metadata()


def test_programs_a_cu_holds_follow_lds_and_registers():
    assert programs_per_cu(tile(8), FITS, GFX950) == 1  # over 256 VGPRs: one wave a SIMD
    small = Resources(shared=16384, registers=128, spills=0, scratch=0)
    assert programs_per_cu(tile(8), small, GFX950) == 4  # 4 waves a SIMD, 4 SIMDs, 4 waves each
    big_lds = Resources(shared=100_000, registers=128, spills=0, scratch=0)
    assert programs_per_cu(tile(8), big_lds, GFX950) == 1
    assert programs_per_cu(tile(8), big_lds, MODELS["gfx942"]) == 0  # over its 64 KB


def test_a_memory_bound_launch_runs_near_hbm_bandwidth():
    # H8 L1 bs256 ctx 4096: 1.2 GB of bf16 latent rows, 151 us at 8 TB/s
    config = tile(8).with_splits(1)
    t = estimate_us(config, FITS, GFX950, 8, 1, 256, 4096, 2)
    assert 151 <= t <= 151 * 1.1
    # one pipeline stage keeps half the bytes in flight: slower
    slower = estimate_us(tile(8, stages=1).with_splits(1), FITS, GFX950, 8, 1, 256, 4096, 2)
    assert slower > 1.3 * t


def test_small_batches_split_the_prefix_to_fill_the_cus():
    config, _ = best_config([(tile(8), FITS)], GFX950, 8, 1, 1, [2048, 16384], 2)
    assert config.NUM_KV_SPLITS == 64  # the most units: one request, 256 CUs
    config, _ = best_config([(tile(8), FITS)], GFX950, 8, 1, 256, [2048, 4096], 2)
    assert config.NUM_KV_SPLITS == 1  # 256 programs already fill the CUs


def test_many_heads_take_the_largest_row_tile_that_fits():
    # H128 L4: 64 rows (16 heads) read the prefix 8 times, 16 rows 32 times
    tiles = [(tile(4), FITS), (tile(16), FITS)]
    config, _ = best_config(tiles, GFX950, 128, 4, 64, [2048, 16384], 2)
    assert config.BLOCK_H == 16


def test_a_stage_the_compiler_did_not_build_earns_nothing():
    # gfx942 compiles 1 and 2 stages of this loop alike: the same kernel,
    # so the model keeps the one-stage config and its bytes in flight.
    same = [(tile(8, stages=1), FITS), (tile(8, stages=2), FITS)]
    config, alike = best_config(same, GFX950, 8, 1, 256, [2048, 4096], 2)
    assert config.num_stages == 1
    ring = Resources(shared=FITS.shared * 2, registers=FITS.registers, spills=0, scratch=0)
    built = [(tile(8, stages=1), FITS), (tile(8, stages=2), ring)]
    config, pipelined = best_config(built, GFX950, 8, 1, 256, [2048, 4096], 2)
    assert config.num_stages == 2 and pipelined < alike


def test_value_chunks_count_only_through_what_they_hold():
    # Chunks with less LDS but the same programs a CU tie the rule's
    # estimate: the rule (None) keeps the bucket.
    less_lds = Resources(shared=8192, registers=FITS.registers, spills=0, scratch=0)
    alike = [(tile(8, v_chunk=64), less_lds), (tile(8, v_chunk=128), less_lds), (tile(8), FITS)]
    config, _ = best_config(alike, GFX950, 8, 1, 256, [2048, 4096], 2)
    assert config.V_CHUNK is None
    # Chunks that hold fewer registers: two programs a CU, twice the bytes in
    # flight of a one-stage tile, so they win; of two such, the wider chunk.
    fewer = Resources(shared=FITS.shared, registers=200, spills=0, scratch=0)
    held = [
        (tile(8, stages=1), FITS),
        (tile(8, stages=1, v_chunk=64), fewer),
        (tile(8, stages=1, v_chunk=128), fewer),
    ]
    config, _ = best_config(held, GFX950, 8, 1, 256, [2048, 4096], 2)
    assert config.V_CHUNK == 128


def test_no_fitting_tile_is_an_error():
    nothing = Resources(shared=200_000, registers=128, spills=0, scratch=0)
    with pytest.raises(ValueError, match="no config fits gfx950 for H8 L1"):
        best_config([(tile(8), nothing)], GFX950, 8, 1, 1, [2048], 2)
