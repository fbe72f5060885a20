"""The tuner's search space: the stage-1 tiles, split counts, share floors
and AMD compiler options that ``python -m mla_verify.tune`` times.

Only the tuner (and the tests that hold every candidate to the reference)
import this module; the runtime never does. Candidates are pruned here only
where the answer is known without compiling; on AMD the tuner also drops
every tile that overflows LDS or spills registers when compiled ahead of
time (``aot.fits``).
"""

from __future__ import annotations

import math

from . import hopper
from .config import (
    HOPPER_KERNELS,
    MAX_ROWS,
    VerifyConfig,
    default_num_kv_splits,
    hopper_config,
    hopper_schedules,
    rows_per_program,
    units_for_chunks,
)
from .device import SHARED_MEMORY, arch_sm_count, is_amd_arch
from .problem import MLA_HEAD_DIMS, kv_columns

# Rows per program the AMD search tries: up to 128 (BLOCK_H x L), where the
# compile check decides what fits, since no hardware tells us.
AMD_ROWS = (16, 32, 64, 128)
NVIDIA_ROWS = (16, 32, 64)

# Share floors the tuner tries on top of the kernel's default (None, 4),
# one each side: the best floor of small batches ranged over 1-4 on the
# H200, and 8 won a few buckets (tuning/README.md).
MIN_SHARE_CANDIDATES = (2, 8)

# Value-column chunks (VerifyConfig.V_CHUNK) tried on tiles of fewer than 64
# rows, beside the kernel's rule (all columns at once there). In the sm90
# table's search (H200, 2026-12-05) chunks took 61 of the 114 Triton
# buckets: chunks of 128 48 (MLA: H8-H32 at L1 and L2, H64 L1), of 64 13
# (MLA: H8 L4, whose bucket at batch 32 then ran 1.37x faster) (RESULTS.md).
# On AMD the whole 512 columns spill on many small tiles that fit in chunks
# (32 rows on 4 waves: 9 of 18 fit gfx950 whole, 15 in chunks of 128); the
# compile check drops what still spills.
SMALL_TILE_V_CHUNKS = (None, 128, 64)

# AMD compiler options tried on the fastest tiles, beside Triton's own
# choice (None): occupancy hint, MFMA shape (16 or 32 rows), and operand
# packing. Triton resets kpack to 1 on gfx950 (with a warning), so only
# older CDNA tries 2.
WAVES_PER_EU = (None, 1, 2)
MATRIX_INSTR_NONKDIM = (None, 16, 32)
KPACK = (None, 2)
NO_KPACK_ARCHS = ("gfx950",)


def tile_candidates(
    num_heads: int,
    draft_len: int,
    arch: str,
    kv_dtype: str = "bf16",
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
    *,
    kernel: str | None = None,
) -> list[VerifyConfig]:
    """Stage-1 tile shapes the tuner tries (NUM_KV_SPLITS left at 1; the
    tuner searches splits separately).

    ``kernel=None``: the arch's own kernel. On sm90, where the Hopper
    kernel runs (``hopper.supports``: MLA, 256/256 and 128/128, with bf16
    or fp8 e4m3 KV), its schedules: columns, and score/value (bf16; fp8
    for MLA). For
    MLA those alone (Triton tiles won none of its buckets on sm90 against
    them); for the other head dims the Triton kernel's tiles too, which won
    9 of the 27 fp8 256/256 buckets on the H200 (H4 at batch 4-256, H8 at
    batch 32-64) and 3 of the 27 bf16 ones (H4 batch 64, H8 batch 32-64).
    Elsewhere the Triton kernel's tiles.
    ``kernel="triton"``: the Triton kernel's tiles on any arch, the portable
    path the tuner keeps beside the arch's winner."""
    if kernel not in (None, "triton"):
        raise ValueError(f"kernel: expected one of (None, 'triton'), got {kernel!r}")
    out: list[VerifyConfig] = []
    if kernel is None and arch == "sm90":
        out = [
            hopper_config(num_heads, draft_len, 1, schedule).with_splits(1)
            for schedule in hopper_schedules(draft_len, kv_dtype, head_dims)
        ]
        if out and hopper.available() and tuple(head_dims) == MLA_HEAD_DIMS:
            return out
    return out + triton_tiles(num_heads, draft_len, arch, head_dims)


def triton_tiles(
    num_heads: int, draft_len: int, arch: str, head_dims: tuple[int, int] = MLA_HEAD_DIMS
) -> list[VerifyConfig]:
    """The Triton kernel's tiles: BLOCK_H x L rows, BLOCK_N, warps, stages.
    Pruned where registers are known to run out: a [rows, v] fp32
    accumulator over more than 128 words a thread spills on any GPU. On
    NVIDIA also a KV ring that leaves a known arch's shared memory less than
    7 KB; on AMD, LDS and spills are left to the compile check, which knows
    each arch's limits. A tile of fewer than 64 rows is tried with value
    chunks too (``SMALL_TILE_V_CHUNKS``)."""
    amd = is_amd_arch(arch)
    wave = 64 if amd else 32
    row_targets = AMD_ROWS if amd else NVIDIA_ROWS
    block_ns = (16, 32, 64) if amd else (32, 64)
    stages = (1, 2) if amd else (1, 2, 3)
    # A stage's KV tile: MLA's K (V its view); K and V, each a cache of its
    # own, in ordinary attention.
    _, v = head_dims
    ring_cols = kv_columns(head_dims)
    block_hs = sorted({max(1, min(num_heads, r // draft_len)) for r in row_targets})
    out = []
    for block_h in block_hs:
        rows = rows_per_program(block_h, draft_len)
        if rows > max(row_targets):
            continue
        chunks = (
            (None,) if rows >= 64 else tuple(c for c in SMALL_TILE_V_CHUNKS if c is None or c < v)
        )
        for block_n in block_ns:
            for num_warps in (4, 8):
                if rows * v // (wave * num_warps) > 128:
                    continue
                for num_stages in stages:
                    # The KV ring: num_stages tiles of BLOCK_N x ring_cols bf16,
                    # within a known arch's shared memory less 7 KB (220 KB
                    # on sm90). What else a tile holds, and an arch we know
                    # nothing of, the launch finds out: the tuner skips a
                    # tile that does not launch.
                    ring = num_stages * block_n * ring_cols * 2
                    limit = SHARED_MEMORY.get(arch)
                    if not amd and limit is not None and ring > limit - 7 * 1024:
                        continue
                    out.extend(
                        VerifyConfig(
                            BLOCK_H=block_h,
                            BLOCK_N=block_n,
                            NUM_KV_SPLITS=1,
                            num_warps=num_warps,
                            num_stages=num_stages,
                            V_CHUNK=v_chunk,
                        )
                        for v_chunk in chunks
                    )
    return out


def amd_option_candidates(arch: str) -> list[dict[str, int | None]]:
    """AMD compiler options worth timing on a tile (``VerifyConfig`` field
    values); the first is Triton's own choice for all three, the only one
    on other vendors."""
    if not is_amd_arch(arch):
        return [{}]
    kpacks = (None,) if arch in NO_KPACK_ARCHS else KPACK
    return [
        {"waves_per_eu": w, "matrix_instr_nonkdim": k, "kpack": p}
        for w in WAVES_PER_EU
        for k in MATRIX_INSTR_NONKDIM
        for p in kpacks
    ]


def split_candidates(
    num_heads: int, batch_size: int, block_h: int, arch: str, kernel: str = "triton"
) -> list[int]:
    """NUM_KV_SPLITS worth timing: chunks for about 0.5 to 4 waves of the grid.
    One value for the Hopper kernel on sm90, which plans its own balanced
    shares and ignores the field (the value stays for a Triton fallback)."""
    if _plans_shares(arch, kernel):
        return [default_num_kv_splits(num_heads, batch_size, block_h, MAX_ROWS, arch)]
    sms = arch_sm_count(arch)
    programs = batch_size * math.ceil(num_heads / block_h)
    cands = {1}
    for waves in (0.5, 1, 2, 3, 4):
        cands.add(units_for_chunks(round(sms * waves / programs)))
    return sorted(cands)


def min_share_candidates(arch: str, kernel: str) -> list[int | None]:
    """MIN_SHARE values worth timing: the default alone, except for the
    Hopper kernel on sm90, whose small batches run on more, shorter shares
    with a lower floor (more CTAs, more partials to merge) or on fewer,
    longer ones with a higher floor."""
    if _plans_shares(arch, kernel):
        return [None, *MIN_SHARE_CANDIDATES]
    return [None]


def _plans_shares(arch: str, kernel: str) -> bool:
    """Whether ``kernel`` on ``arch`` runs the Hopper kernel, which plans
    its own shares (NUM_KV_SPLITS plays no part, MIN_SHARE does)."""
    return kernel in HOPPER_KERNELS and arch == "sm90" and hopper.available()
