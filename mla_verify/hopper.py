"""What the host needs to know about the Hopper (Gluon) kernel of
kernel_sm90.py: its fixed tile, its launch options, the calls it computes
and the geometry of its shares. Importable without Gluon.
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

import triton

from . import assembler
from .problem import D_NOPE, MLA_HEAD_DIMS

ROWS = 64  # query rows per CTA (BLOCK_H heads x L drafts): one wgmma M per warpgroup
TOKENS = 64  # prefix tokens per ring stage
STAGES = 2  # q 72 KB + 2 x 72 KB ring fill the 227 KB of shared memory
CONSUMER_WARPS = 8  # the columns schedule's consumer partition
WARPGROUP = 4  # warps of one warpgroup (the score/value partitions)
PRODUCER_WARPS = 4
HALF_V = D_NOPE // 2  # output columns per consumer warpgroup
# Positions a share holds at least, where a config names none (a runtime
# argument: the tuner searches it). One wave of shares of a tile or two each
# left a small batch a merge of over 100 partials a request.
DEFAULT_MIN_SHARE = 4
# Positions a request's drafts weigh in the shares of a ragged batch: their
# tile plus a segment's fixed cost (query staging, first tile, output store:
# about 9 us, against 2.4 us a prefix tile), so a CTA that packs many short
# requests gets fewer positions. A uniform batch counts one: its cuts fall
# at request boundaries or split every request alike.
DRAFT_POSITIONS = 5
# (head block, request) pairs the plan of a launch reads at once, in its
# registers: 128 requests of up to 32 head blocks.
PLAN_ELEMENTS = 4096
# Requests a ragged call's order (kernel_sm90._order_requests) reads a
# step, a (draft count, request) tile: every CTA orders the batch at its
# start, and a step of 512 requests cost it 6.8 us on the H200 (the scan
# along them), one of 128 1.4 us.
ORDER_REQUESTS = 128
# Registers: 12 warps x 168 fill the register file. The producer keeps 88
# (two tiles' slot indices; 56 spilled them), the rest goes to the consumers
# (setmaxnreg); with score/value the value warpgroup holds half the output
# (128 words a thread) in 176, leaving the score warpgroup 240.
MAX_REGS = 168
PRODUCER_REGS = 88
VALUE_REGS = 176

KV_DTYPES = ("bf16", "fp8_e4m3")
# Ordinary attention with one shared KV head (q/k = v; V a cache of its own
# or K itself): both schedules, as for MLA.
SHARED_KV_HEAD_DIMS = ((256, 256), (128, 128))

# The constants that shape the kernel, hashed with its jitted functions into
# its family's code_hash.KERNEL_HASHES["gluon_sm90"] (and code_hash.KERNEL_HASH).
SHAPE = (
    ROWS,
    TOKENS,
    STAGES,
    CONSUMER_WARPS,
    PRODUCER_WARPS,
    PRODUCER_REGS,
    DEFAULT_MIN_SHARE,
    MAX_REGS,
    WARPGROUP,
    VALUE_REGS,
    HALF_V,
    DRAFT_POSITIONS,
    PLAN_ELEMENTS,
    ORDER_REQUESTS,
)


def lowers_fp8(triton_version: str) -> bool:
    """Whether this Triton builds the kernel for fp8 KV. Gluon 3.7 (3.7.0
    and 3.7.1) does not: a warp partition gets its constexpr arguments as
    values, so the producer's bf16-only branch (the drafts' rows copied
    into the ring) is built for the fp8 ring too, and 3.7 refuses that
    cp.async ("cp.async does not support transfers smaller than 4 bytes")
    where 3.6, 3.8 and 3.9 lower it and drop it."""
    return triton_version.split(".")[:2] != ["3", "7"]


FP8_LOWERS = lowers_fp8(triton.__version__)  # else the Triton kernel takes fp8 KV


@functools.cache
def gluon_kernel(
    head_dims: tuple[int, int] = MLA_HEAD_DIMS, ragged: bool = False, paged: bool = False
) -> ModuleType | None:
    """The kernel module for ``head_dims`` (MLA's: ``kernel_sm90`` itself),
    ``ragged`` calls (some request with fewer than L drafts) and ``paged``
    pools (``loads_pages``), or None where this Triton lacks Gluon's Hopper
    ops (then the Triton kernel runs every call). Other variants get
    kernel_sm90's source run as a module of its own with ``HEAD_DIMS``,
    ``RAGGED`` and ``PAGED`` set, since its tile shapes and those choices
    are module constants (a constant in every warp partition)."""
    try:
        from . import kernel_sm90
    except ImportError:
        return None
    head_dims = tuple(head_dims)
    if head_dims == MLA_HEAD_DIMS and not ragged and not paged:
        assembler.install(kernel_sm90._prefix_kernel_sm90)
        return kernel_sm90
    name = f"{kernel_sm90.__name__}_{head_dims[0]}x{head_dims[1]}"
    name += ("_ragged" if ragged else "") + ("_paged" if paged else "")
    spec = importlib.util.spec_from_file_location(name, kernel_sm90.__file__)
    module = importlib.util.module_from_spec(spec)
    module.HEAD_DIMS = head_dims
    module.RAGGED = ragged
    module.PAGED = paged
    spec.loader.exec_module(module)
    assembler.install(module._prefix_kernel_sm90)
    return module


def copy_aligned(t) -> bool:
    """Whether the kernel can copy rows of the tensor ``t`` 16 bytes at a
    time (cp.async, TMA): a 16-byte aligned start, and strides (but the
    last, 1) that are multiples of 16 elements, which is what Triton
    specialises on. It does not compile for other inputs (rows padded to
    580 elements, say); the Triton kernel takes those."""
    return t.data_ptr() % 16 == 0 and all(stride % 16 == 0 for stride in t.stride()[:-1])


def tiles_in_pages(page_size: int) -> bool:
    """Whether every full prefix tile of a paged cache lies in one page:
    pages of a multiple of TOKENS tokens."""
    return page_size % TOKENS == 0


def loads_pages(page_size: int, k_buffer) -> bool:
    """Whether the kernel loads the full prefix tiles of a paged MLA cache
    whole, by TMA (the PAGED module), where ``k_buffer`` is the cache seen
    as a page-size-1 pool: its tiles lie in pages (``tiles_in_pages``) and
    it has rows it can copy (``copy_aligned``, which TMA's 16-byte rule
    needs too)."""
    return tiles_in_pages(page_size) and copy_aligned(k_buffer)


def available() -> bool:
    return gluon_kernel() is not None


def block_heads(num_heads: int, draft_len: int) -> int:
    """Heads per CTA: as many as fill the 64 query rows."""
    return max(1, min(num_heads, ROWS // draft_len))


def score_value_kv_dtypes(head_dims: tuple[int, int] = MLA_HEAD_DIMS) -> tuple[str, ...]:
    """The KV dtypes the score/value schedule takes: MLA's bf16 and fp8
    (widened by its two warpgroups into one bf16 tile), the other head
    dims' bf16 (their fp8 runs the columns schedule: kernel_sm90's
    docstring)."""
    return KV_DTYPES if tuple(head_dims) == MLA_HEAD_DIMS else ("bf16",)


def supports(
    draft_len: int,
    kv_dtype_name: str,
    v_from_k: bool,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
    score_value: bool = True,
) -> bool:
    """Calls the Hopper kernel computes (where Gluon is available), bf16 or
    fp8 KV on the columns schedule (fp8 not with triton 3.7:
    ``FP8_LOWERS``), those of ``score_value_kv_dtypes`` on score/value:
    absorbed MLA with V a view of K; ordinary attention of
    SHARED_KV_HEAD_DIMS (V a view of K or a cache of its own). The Triton
    kernel takes the rest."""
    if draft_len > ROWS or (kv_dtype_name != "bf16" and not FP8_LOWERS):
        return False
    kv_dtypes = score_value_kv_dtypes(head_dims) if score_value else KV_DTYPES
    if tuple(head_dims) == MLA_HEAD_DIMS:
        return kv_dtype_name in kv_dtypes and v_from_k
    return tuple(head_dims) in SHARED_KV_HEAD_DIMS and kv_dtype_name in kv_dtypes


def launch_options(score_value: bool) -> dict[str, int | str]:
    """num_warps (the default partition's), the register cap of a launch,
    and the assembler's mark where it is not Triton's own (assembler.py)."""
    warps = WARPGROUP if score_value else CONSUMER_WARPS
    return {"num_warps": warps, "maxnreg": MAX_REGS, **assembler.compile_options()}


def head_blocks(num_heads: int, block_h: int) -> int:
    """Head blocks of BLOCK_H heads: the tiles of a request with L drafts
    (one of E < L drafts packs its H E rows densely and fills fewer)."""
    return (num_heads + block_h - 1) // block_h


def plan_width(blocks: int) -> int:
    """The head blocks the kernels' plan reads at once: a power of two, 2
    at least."""
    return max(2, 1 << (blocks - 1).bit_length())


def plan_requests(blocks: int, batch_block: int) -> int:
    """Requests the plan reads a step for ``blocks`` head blocks at once:
    ``batch_block``, fewer where the (head block, request) tile would pass
    PLAN_ELEMENTS (hundreds of heads in small blocks)."""
    return max(32, min(batch_block, PLAN_ELEMENTS // plan_width(blocks)))


def ctas_per_head_block(sm_count: int, num_heads: int, block_h: int) -> int:
    """CTAs per head block: one wave of CTAs (one per SM) over the head
    blocks."""
    return max(1, sm_count // head_blocks(num_heads, block_h))


def order_rows(ctas: int, num_heads: int, block_h: int, batch_size: int) -> int:
    """Rows of the partials' buffer past the partial rows where each CTA
    of a ragged call keeps its order of the requests: ``batch_size`` int32
    words a CTA, in rows of 128 words at least (the narrowest V)."""
    words = ctas * head_blocks(num_heads, block_h) * batch_size
    return -(-words // 128)


def partial_rows(ctas: int, num_heads: int, draft_len: int, block_h: int) -> int:
    """Partial rows of a launch with ``ctas`` CTAs per head block: two
    slots a CTA (its first segment's and its last's), each of one tile's
    BLOCK_H x L rows."""
    return 2 * ctas * head_blocks(num_heads, block_h) * block_h * draft_len
