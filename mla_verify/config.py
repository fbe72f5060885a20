"""Launch configuration of the verify kernel: the frozen config object and
the built-in default heuristic (split by vendor). The tuner's search space
is ``search_space``.

Field names are spelled exactly as the kernel's constexpr / launch arguments,
so ``launch(..., config)`` feeds them straight through.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import triton

from . import hopper
from .device import INTERPRETER_ARCH, arch_shared_memory, arch_sm_count, is_amd_arch
from .problem import MLA_HEAD_DIMS, check_head_dims, check_shape, kv_columns, kv_dtype_name

# Largest rows-per-program tile: a [64, 512] fp32 accumulator already fills
# 8 warps' registers (measured on the H200); 128 rows spills.
MAX_ROWS = 64
# The AMD default's: 16-token tiles of 64 rows on 4 waves spill on gfx942
# and gfx950 (compiled ahead of time, tests/test_aot.py).
AMD_DEFAULT_MAX_ROWS = 32
MAX_KV_SPLITS = 64
# Compile options of every kernel the package launches. FMA contraction is
# what the shipped tables were measured with: Triton's default through 3.9,
# which warns that from 3.10 it is off unless asked for
# (TRITON_DEFAULT_FP_FUSION), so it is asked for.
COMPILE_OPTIONS = {"enable_fp_fusion": True}
# Stage 1's implementations: the Triton kernel (any GPU) and the two
# schedules of the Hopper kernel (kernel_sm90's docstring).
HOPPER_KERNELS = ("gluon_sm90", "gluon_sm90_sv")
KERNELS = ("triton", *HOPPER_KERNELS)
# Value-column chunks the Triton kernel's dots may take (VerifyConfig.V_CHUNK):
# tl.dot needs 16 columns or more, and a chunk divides the power-of-two D_V.
V_CHUNKS = (32, 64, 128, 256)
# Known NVIDIA archs where Triton compiles stage 1's products for tcgen05
# (datacenter Blackwell). The 64-row MLA tile of 64 tokens takes 352816
# bytes of shared memory as triton 3.6, 3.7 and 3.8 build it for sm100
# (213544 as 3.9 does), over its 232448. Of 32 tokens, in the value chunks
# of 128 that the kernel gives 64-row tiles, 262800 on 3.6-3.8 (3.9:
# 144008), still over; in chunks of 256, 229968 (3.9: 143944). Other head
# dims and fewer rows build alike on all four.
TCGEN05_ARCHS = ("sm100",)


def runs_score_value(
    kernel: str, kv_dtype: str, head_dims: tuple[int, int] = MLA_HEAD_DIMS
) -> bool:
    """Whether a config's stage 1 runs the Hopper kernel's score/value
    schedule: where it names it and the KV dtype allows it for these head
    dims (``hopper.score_value_kv_dtypes``); otherwise a "gluon_sm90_sv"
    config runs the columns schedule (same tile and plan)."""
    return kernel == "gluon_sm90_sv" and kv_dtype in hopper.score_value_kv_dtypes(head_dims)


def rows_per_program(block_h: int, draft_len: int) -> int:
    """Query rows one stage-1 program holds: BLOCK_H heads x all drafts,
    padded to a power of two and to the 16-row minimum of ``tl.dot``."""
    return max(16, triton.next_power_of_2(block_h * draft_len))


@dataclass(frozen=True)
class VerifyConfig:
    """One launch of the two-stage kernel.

    BLOCK_H        heads per stage-1 program (all drafts of those heads share
                   one latent tile)
    BLOCK_N        prefix tokens per inner-loop step
    NUM_KV_SPLITS  work units per request: stage 1 runs batch x NUM_KV_SPLITS
                   programs per head block and cuts the batch's prefix tokens,
                   requests end to end, into batch x max(1, NUM_KV_SPLITS - 1)
                   equal shares (on the GPU), one a unit, whatever the
                   lengths; a uniform batch thus gives each request about
                   NUM_KV_SPLITS - 1 units, and the spare slots hold the
                   partials of shares that meet several requests
    num_warps      warps of a stage-1 program
    num_stages     software-pipelining depth of the KV stream
    waves_per_eu, matrix_instr_nonkdim, kpack
                   AMD-only compiler options; None leaves them to Triton
    kernel         stage 1's implementation: "triton" (any GPU), or the
                   Hopper kernel (64 rows, 64-token two-stage ring) with its
                   consumers splitting score columns, "gluon_sm90", or as a
                   score and a value warpgroup, "gluon_sm90_sv" (bf16 KV;
                   other KV dtypes run "gluon_sm90"); calls the Hopper
                   kernel cannot compute run the Triton kernel with the same
                   tile
    MIN_SHARE      Hopper kernel only: positions (prefix tiles, and one
                   per request for its drafts) each CTA's share of the
                   batch holds at least; on a small batch a higher floor
                   runs fewer CTAs and leaves fewer partials to merge, a
                   lower one more. None: the kernel's default (4)
    V_CHUNK        Triton kernel only: value columns each of its dots takes
                   (the rest in further dots, one a chunk). None: the
                   kernel's rule, chunks of 128 in tiles of 64 rows or more
                   and all columns at once below (``value_chunk``)
    """

    BLOCK_H: int
    BLOCK_N: int
    NUM_KV_SPLITS: int
    num_warps: int
    num_stages: int
    waves_per_eu: int | None = None
    matrix_instr_nonkdim: int | None = None
    kpack: int | None = None
    kernel: str = "triton"
    MIN_SHARE: int | None = None
    V_CHUNK: int | None = None

    def __post_init__(self) -> None:
        def check(name: str, ok: bool, expected: str) -> None:
            if not ok:
                raise ValueError(
                    f"VerifyConfig.{name}: expected {expected}, got {getattr(self, name)!r}"
                )

        check("BLOCK_H", isinstance(self.BLOCK_H, int) and self.BLOCK_H >= 1, "an int >= 1")
        check("BLOCK_N", self.BLOCK_N in (16, 32, 64, 128), "one of 16, 32, 64, 128")
        check(
            "NUM_KV_SPLITS",
            isinstance(self.NUM_KV_SPLITS, int) and 1 <= self.NUM_KV_SPLITS <= 1024,
            "an int in 1..1024",
        )
        check("num_warps", self.num_warps in (1, 2, 4, 8, 16), "one of 1, 2, 4, 8, 16")
        check(
            "num_stages",
            isinstance(self.num_stages, int) and 1 <= self.num_stages <= 6,
            "an int in 1..6",
        )
        check("kernel", self.kernel in KERNELS, f"one of {KERNELS}")
        check(
            "MIN_SHARE",
            self.MIN_SHARE is None
            or (
                self.kernel in HOPPER_KERNELS
                and isinstance(self.MIN_SHARE, int)
                and 1 <= self.MIN_SHARE <= 1024
            ),
            f"None, or an int in 1..1024 with kernel in {HOPPER_KERNELS}",
        )
        check(
            "V_CHUNK",
            self.V_CHUNK is None or (self.kernel == "triton" and self.V_CHUNK in V_CHUNKS),
            f"None, or one of {V_CHUNKS} with kernel='triton'",
        )
        if self.kernel in HOPPER_KERNELS:
            # The Hopper kernel's tile is fixed; the fields say so, and they
            # are the Triton fallback's tile too.
            check("BLOCK_N", self.BLOCK_N == 64, f"64 with kernel={self.kernel!r}")
            check("num_warps", self.num_warps == 8, f"8 with kernel={self.kernel!r}")
            check("num_stages", self.num_stages == 2, f"2 with kernel={self.kernel!r}")

    def launch_options(self) -> dict[str, int | bool]:
        """Keyword options for the Triton launch (AMD ones only where set)."""
        opts: dict[str, int | bool] = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        opts |= COMPILE_OPTIONS
        for name in ("waves_per_eu", "matrix_instr_nonkdim", "kpack"):
            value = getattr(self, name)
            if value is not None:
                opts[name] = value
        return opts

    def to_dict(self) -> dict[str, int | str]:
        # Unset AMD options and the default kernel are left out, so tables
        # written before the field existed read back the same.
        return {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if v is not None and not (k == "kernel" and v == "triton")
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VerifyConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"config: unknown fields {sorted(unknown)}")
        return cls(**data)

    def with_splits(self, num_kv_splits: int) -> VerifyConfig:
        return dataclasses.replace(self, NUM_KV_SPLITS=num_kv_splits)

    def with_min_share(self, min_share: int | None) -> VerifyConfig:
        return dataclasses.replace(self, MIN_SHARE=min_share)


def value_chunk(config: VerifyConfig, d_v: int) -> int:
    """The Triton kernel's V_CHUNK constexpr: the config's chunk of value
    columns, at most all ``d_v`` of them; 0 leaves it to the kernel's rule."""
    return min(config.V_CHUNK, d_v) if config.V_CHUNK else 0


def splits_scores(config: VerifyConfig, draft_len: int) -> bool:
    """The Triton kernel's SPLIT_SCORES on Hopper: a tile of 64 rows or more
    with fewer rows than its warps hold at 16 each, where Triton's layout for
    chained dots would have each wgmma warpgroup compute every score."""
    rows = rows_per_program(config.BLOCK_H, draft_len)
    return 64 <= rows < 16 * config.num_warps


def kernel_family(kernel: VerifyConfig | str) -> str:
    """The kernel family of a config (or of a ``kernel`` field's value):
    "triton" or "gluon_sm90" (both Hopper schedules share one kernel). Each
    family's code has a hash of its own (``code_hash.KERNEL_HASHES``), so a
    change to one family's code leaves the other's tuned records current."""
    name = kernel.kernel if isinstance(kernel, VerifyConfig) else kernel
    if name == "triton":
        return "triton"
    if name in HOPPER_KERNELS:
        return "gluon_sm90"
    raise ValueError(f"kernel: expected one of {KERNELS}, got {name!r}")


def units_for_chunks(chunks: int) -> int:
    """NUM_KV_SPLITS that gives a uniform batch ``chunks`` chunks per request."""
    chunks = max(1, min(MAX_KV_SPLITS - 1, chunks))
    return 1 if chunks == 1 else chunks + 1


def default_num_kv_splits(
    num_heads: int, batch_size: int, block_h: int, rows: int, arch: str
) -> int:
    """Units that bring the grid to about one full wave: one CTA per SM for
    64-row tiles (registers pin occupancy at 1), two for smaller tiles."""
    sms = arch_sm_count(arch)
    ctas_per_sm = 1 if rows >= 64 else 2
    head_blocks = math.ceil(num_heads / block_h)
    programs = max(1, batch_size * head_blocks)
    # Rounded down: 1.45 waves cost 31-34% more than one (measured on the H200).
    return units_for_chunks(max(1, sms * ctas_per_sm // programs))


def default_config(
    num_heads: int,
    draft_len: int,
    batch_size: int,
    arch: str,
    kv_dtype: str = "bf16",
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> VerifyConfig:
    """Built-in config: sound on any GPU, used where no table entry applies.

    On sm90, for the calls the Hopper kernel takes (``hopper.supports``,
    with V passed as engines pass it: MLA's a view of K, the others' a cache
    of their own), its score/value schedule (columns for the other head
    dims' fp8 KV), one wave of 64-row CTAs: the Hopper kernel beat the
    tuned Triton kernel on 12 of 13 MLA benchmark shapes, score/value beat
    columns on all 12 bf16 shapes measured (the benchmark notes in git
    history), and on MLA fp8 KV it took 427 of the 432 buckets from the
    columns records it was timed beside (tuning/README.md). Elsewhere the Triton
    kernel's default, ``triton_default_config``.
    """
    num_heads, draft_len, batch_size = check_shape(num_heads, draft_len, batch_size)
    kv_dtype = kv_dtype_name(kv_dtype)
    schedules = hopper_schedules(draft_len, kv_dtype, head_dims) if arch == "sm90" else []
    if schedules:
        return hopper_config(num_heads, draft_len, batch_size, schedules[-1])
    return triton_default_config(num_heads, draft_len, batch_size, arch, kv_dtype, head_dims)


def hopper_schedules(
    draft_len: int, kv_dtype: str, head_dims: tuple[int, int] = MLA_HEAD_DIMS
) -> list[str]:
    """The Hopper kernel's schedules (``HOPPER_KERNELS``, score/value
    last) that run a call on sm90 with V passed as engines pass it: MLA's
    a view of K, the others' a cache of their own (``hopper.supports``). A
    score/value config for KV it does not take (fp8) runs the columns
    schedule: left out, a duplicate. ``kv_dtype``: a dtype name."""
    v_from_k = tuple(head_dims) == MLA_HEAD_DIMS
    found = []
    for schedule in HOPPER_KERNELS:
        score_value = runs_score_value(schedule, kv_dtype, head_dims)
        if schedule == "gluon_sm90_sv" and not score_value:
            continue
        if hopper.supports(draft_len, kv_dtype, v_from_k, head_dims, score_value):
            found.append(schedule)
    return found


def triton_default_config(
    num_heads: int,
    draft_len: int,
    batch_size: int,
    arch: str,
    kv_dtype: str = "bf16",
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> VerifyConfig:
    """The Triton kernel's built-in config on ``arch`` (on sm90 too, where
    it is not the default for MLA): rows per program follow H*L (16 rows
    for small products, 64 for large). On NVIDIA the widest KV tile that
    fits the arch's shared memory (``nvidia_block_n``: 64 tokens on sm80
    and sm90), 8 warps for 64 rows. On AMD 16-token tiles on 4 waves, at
    most 32 rows: a tile that fits LDS and spills no register on gfx942
    and gfx950 (64 rows spill 18-29 scalar registers since 39a927e's loop
    over a share's requests). CI compiles every arch's default ahead of
    time (tests/test_aot.py).
    """
    num_heads, draft_len, batch_size = check_shape(num_heads, draft_len, batch_size)
    kv_dtype_name(kv_dtype)  # validated; the tile is the same for every KV dtype
    most = AMD_DEFAULT_MAX_ROWS if is_amd_arch(arch) else MAX_ROWS
    rows = min(most, max(16, triton.next_power_of_2(num_heads * draft_len)))
    block_h = max(1, min(num_heads, rows // draft_len))
    rows = rows_per_program(block_h, draft_len)
    splits = default_num_kv_splits(num_heads, batch_size, block_h, rows, arch)
    if is_amd_arch(arch):
        return VerifyConfig(
            BLOCK_H=block_h, BLOCK_N=16, NUM_KV_SPLITS=splits, num_warps=4, num_stages=2
        )
    qk, v = check_head_dims(head_dims)
    return VerifyConfig(
        BLOCK_H=block_h,
        BLOCK_N=nvidia_block_n(rows, (qk, v), arch),
        NUM_KV_SPLITS=splits,
        # 8 warps for 64 rows. At 32 rows of MLA 4 warps ran 1.32-1.45x
        # faster than 8 on the H200 (H8L4, H16L2; 2026-12-01).
        num_warps=8 if rows >= 64 else 4,
        num_stages=2,
        # The kernel's chunks of 128 at 64 rows overflow sm100's shared
        # memory as triton 3.6-3.8 build them (TCGEN05_ARCHS).
        V_CHUNK=256 if _tcgen05_mla_tile(rows, (qk, v), arch) else None,
    )


def _tcgen05_mla_tile(rows: int, head_dims: tuple[int, int], arch: str) -> bool:
    # A 64-row MLA tile on a tcgen05 arch: 32 tokens in chunks of 256.
    return arch in TCGEN05_ARCHS and rows >= MAX_ROWS and tuple(head_dims) == MLA_HEAD_DIMS


def nvidia_block_n(rows: int, head_dims: tuple[int, int], arch: str) -> int:
    """The widest KV tile (64, 32 or 16 tokens) whose Triton stage 1 fits
    the shared memory of an NVIDIA ``arch``: 64 on sm80 and sm90, fewer for
    many rows on the 99 KB of sm86, sm89 and sm120, where 64 tokens would
    not launch. Compiled for sm8x and sm12x (mma.sync), the kernel holds
    the q tile, one KV tile and P, 2 (BLOCK_N ring + rows (q/k + BLOCK_N))
    bytes, ring the KV columns (V's too where V is a cache of its own);
    sm90's wgmma kernel holds a second KV stage and fits 227 KB at 64
    tokens. On sm100 64 rows of MLA take 32 tokens (in value chunks of 256,
    ``triton_default_config``): before triton 3.9 their tcgen05 tile of 64
    does not fit (``TCGEN05_ARCHS``).
    tests/test_aot.py compiles the default for every arch."""
    qk, _ = head_dims
    if _tcgen05_mla_tile(rows, head_dims, arch):
        return 32  # with chunks of 256, what every Triton since 3.6 fits (TCGEN05_ARCHS)
    ring = kv_columns(head_dims)
    limit = math.inf if arch == INTERPRETER_ARCH else arch_shared_memory(arch)
    for block_n in (64, 32):
        if 2 * (block_n * ring + rows * (qk + block_n)) <= limit:
            return block_n
    return 16


def hopper_config(
    num_heads: int, draft_len: int, batch_size: int, kernel: str = "gluon_sm90"
) -> VerifyConfig:
    """The sm90 Gluon kernel's tile; ``kernel`` names the schedule. The
    kernel plans its own shares (one wave of CTAs); NUM_KV_SPLITS, for about
    one wave of CTAs, serves the Triton kernel where a call cannot take the
    Hopper one."""
    block_h = hopper.block_heads(num_heads, draft_len)
    return VerifyConfig(
        BLOCK_H=block_h,
        BLOCK_N=64,
        NUM_KV_SPLITS=default_num_kv_splits(num_heads, batch_size, block_h, MAX_ROWS, "sm90"),
        num_warps=8,
        num_stages=2,
        kernel=kernel,
    )


def reported_amd_config(num_heads: int, batch_size: int) -> VerifyConfig:
    """The configuration publicly reported as validated on MI355X (gfx950)
    for the SGLang kernel this one grew from, the baseline to beat: 4 heads
    per program, BLOCK_N 64, 8 warps, one stage, and as many splits per
    request as bring the grid to 512 programs, at most 32 (expressed in our
    NUM_KV_SPLITS, which counts work units: splits + 1 past one). Not our
    AMD default: this kernel spills registers with it on gfx942 and gfx950
    (``aot``)."""
    block_h = min(4, num_heads)
    programs = batch_size * math.ceil(num_heads / block_h)
    chunks = max(1, min(32, 512 // programs))
    return VerifyConfig(
        BLOCK_H=block_h,
        BLOCK_N=64,
        NUM_KV_SPLITS=units_for_chunks(chunks),
        num_warps=8,
        num_stages=1,
    )
