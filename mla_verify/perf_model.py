"""A first-order model of the Triton kernel on AMD GPUs we cannot measure,
and the config it picks for a bucket. The tuner's offline mode
(``python -m mla_verify.tune --write-reported ARCH``) writes a table from
it; ``tuning/amd.md`` states the model and how to replace its tables by
measured ones.

Nothing here is measured. The model only ranks configs that compile for
the arch without overflowing LDS or spilling registers (``aot``), using
what the compiler reports (LDS and VGPRs a program, hence programs a CU):

    stage 1 = waves x max(memory, matrix) of one wave of resident programs
      memory  every program streams its prefix tokens' KV rows (MLA: the
              576-column latent row, V its view) from HBM (head blocks
              counted apart: an upper bound, as later head blocks may find
              the rows in cache), at the HBM bandwidth scaled by Little's
              law: the bytes in flight (one BLOCK_N tile a pipeline stage a
              program) over HBM_LATENCY_S
      matrix  each program's padded rows x (q/k + v) columns x 2 FLOP a
              token (MLA: 576 + 512), at its CU's share of MFMA_FRACTION of
              the bf16 peak
    stage 2 = the fp32 partials written and read back once at HBM bandwidth

over a uniform batch, the geometric mean over the bucket's contexts. A
tile whose second stage compiled to nothing (the same registers and LDS as
with one: Triton's pipeliner left the loop alone, as on gfx942) counts once,
at one stage: the model credits no stage the compiler did not build. Value
chunks (V_CHUNK) count only through what they hold: a chunked tile whose
estimate ties the kernel's rule's loses to it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .aot import Resources
from .config import VerifyConfig, rows_per_program
from .problem import MLA_HEAD_DIMS, kv_columns
from .search_space import split_candidates

# Loaded HBM latency: Little's law needs this many seconds of bandwidth in
# flight. About 1 us under load on HBM3-class GPUs (an assumption).
HBM_LATENCY_S = 1e-6
# Share of the bf16 matrix peak a Triton attention loop reaches: plain
# Triton reached 275 of 790 TFLOP/s on this op on the H200 (an assumption
# for AMD).
MFMA_FRACTION = 1 / 3


@dataclass(frozen=True)
class GpuModel:
    """The numbers the model knows of one AMD GPU (public specifications)."""

    arch: str
    device: str
    compute_units: int
    lds_bytes: int  # a CU's LDS, also a workgroup's limit
    hbm_bytes_per_s: float
    mfma: str  # the bf16 matrix instruction, M x N x K
    mfma_flops: float  # dense bf16 peak, FLOP/s
    wave_size: int = 64
    simds: int = 4  # a CU's
    vgprs: int = 512  # a SIMD lane's registers (VGPRs and AGPRs)
    max_waves_per_simd: int = 8

    def as_metadata(self) -> dict[str, object]:
        return asdict(self) | {"hbm_latency_s": HBM_LATENCY_S, "mfma_fraction": MFMA_FRACTION}


MODELS: dict[str, GpuModel] = {
    "gfx950": GpuModel(
        arch="gfx950",
        device="AMD Instinct MI355X",
        compute_units=256,
        lds_bytes=160 * 1024,
        hbm_bytes_per_s=8.0e12,
        mfma="16x16x32 bf16",
        mfma_flops=2.5e15,
    ),
    "gfx942": GpuModel(
        arch="gfx942",
        device="AMD Instinct MI300X",
        compute_units=304,
        lds_bytes=64 * 1024,
        hbm_bytes_per_s=5.3e12,
        mfma="16x16x16 bf16",
        mfma_flops=1.3e15,
    ),
}


def programs_per_cu(config: VerifyConfig, resources: Resources, gpu: GpuModel) -> int:
    """Programs one CU holds at once: as many as its LDS and its SIMDs'
    registers allow (a program is ``num_warps`` waves)."""
    by_lds = gpu.lds_bytes // max(1, resources.shared)
    registers = 8 * math.ceil(max(1, resources.registers or gpu.vgprs) / 8)  # granule of 8
    waves_per_simd = min(gpu.max_waves_per_simd, gpu.vgprs // registers)
    by_registers = gpu.simds * waves_per_simd // config.num_warps
    return min(by_lds, by_registers)


def estimate_us(
    config: VerifyConfig,
    resources: Resources,
    gpu: GpuModel,
    num_heads: int,
    draft_len: int,
    batch_size: int,
    context: int,
    kv_bytes: int,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> float:
    """The model's time of one launch on a uniform batch, in microseconds
    (the module docstring says how)."""
    per_cu = programs_per_cu(config, resources, gpu)
    if per_cu < 1:
        return math.inf
    qk, v = head_dims
    kv_cols = kv_columns(head_dims)
    rows = rows_per_program(config.BLOCK_H, draft_len)
    head_blocks = math.ceil(num_heads / config.BLOCK_H)
    chunks = max(1, config.NUM_KV_SPLITS - 1)  # a uniform batch's, per request
    tokens = math.ceil(max(1, context) / chunks / config.BLOCK_N) * config.BLOCK_N
    programs = head_blocks * batch_size * chunks
    resident = gpu.compute_units * per_cu
    waves = math.ceil(programs / resident)
    active = min(programs, resident)

    in_flight = active * config.num_stages * config.BLOCK_N * kv_cols * kv_bytes
    need = gpu.hbm_bytes_per_s * HBM_LATENCY_S
    bandwidth = gpu.hbm_bytes_per_s * min(1.0, in_flight / need)
    memory_s = active * tokens * kv_cols * kv_bytes / bandwidth

    sharing = min(per_cu, math.ceil(active / gpu.compute_units))  # programs on one CU
    cu_flops = gpu.mfma_flops * MFMA_FRACTION / gpu.compute_units
    matrix_s = sharing * 2 * rows * tokens * (qk + v) / cu_flops

    partial_bytes = batch_size * chunks * num_heads * draft_len * (v + 1) * 4
    merge_s = 2 * partial_bytes / gpu.hbm_bytes_per_s
    return (waves * max(memory_s, matrix_s) + merge_s) * 1e6


def best_config(
    tiles: Sequence[tuple[VerifyConfig, Resources]],
    gpu: GpuModel,
    num_heads: int,
    draft_len: int,
    batch_size: int,
    contexts: Sequence[int],
    kv_bytes: int,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> tuple[VerifyConfig, float]:
    """The tile and split count (``search_space.split_candidates``) with the
    lowest estimate, the geometric mean over ``contexts``, and that
    estimate. ``tiles`` are the candidates that fit, with what they hold."""
    scored = []
    for tile, resources in _distinct_kernels(tiles):
        for splits in split_candidates(num_heads, batch_size, tile.BLOCK_H, gpu.arch):
            config = tile.with_splits(splits)
            times = [
                estimate_us(
                    config,
                    resources,
                    gpu,
                    num_heads,
                    draft_len,
                    batch_size,
                    ctx,
                    kv_bytes,
                    head_dims,
                )
                for ctx in contexts
            ]
            if all(math.isfinite(t) for t in times):
                estimate = statistics.geometric_mean(times)
                scored.append((estimate, _chunk_rank(config), repr(config), config))
    if not scored:
        raise ValueError(f"no config fits {gpu.arch} for H{num_heads} L{draft_len}")
    estimate, _, _, config = min(scored)
    return config, estimate


def _distinct_kernels(
    tiles: Sequence[tuple[VerifyConfig, Resources]],
) -> list[tuple[VerifyConfig, Resources]]:
    """``tiles`` less those that compile to the same kernel as the same tile
    with fewer stages (same registers and LDS), which count at the fewest."""
    seen = set()
    out = []
    for tile, resources in sorted(tiles, key=lambda tr: tr[0].num_stages):
        kernel = (dataclasses.replace(tile, num_stages=1), resources.shared, resources.registers)
        if kernel not in seen:
            seen.add(kernel)
            out.append((tile, resources))
    return out


def _chunk_rank(config: VerifyConfig) -> tuple[bool, int]:
    """Ties go to the kernel's rule (V_CHUNK None), then to wider chunks
    (fewer dots): the model credits a chunk only through what it holds."""
    return config.V_CHUNK is not None, -(config.V_CHUNK or 0)
