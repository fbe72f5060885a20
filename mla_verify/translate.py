"""The translation of a paged call into the token-indexed form: one small
Triton kernel, grid chunks x bs, on the device (no host sync, graph-safe).

    qo_indptr   [bs+1]             b * L
    kv_indptr   [bs+1]             prefix-summed prefix lengths cache_seqlens - L
    kv_indices  [<= bs*max_tokens] slot block_table[b, p // page] * slots_per_block
                                   + p % page of every prefix position p
    k_extend    [bs*L, 1, 576]     the drafts' rows, gathered into q's dtype
                                   (fp8 -> bf16/fp16 is exact)

Each part is written only where asked (``launch``): a paged call writes all
of them, or the indptrs alone where the seesaw kernel reads the pages
itself; a step's metadata (``paged.paged_metadata``) writes the indptrs and
indices once for every layer, whose calls then copy their drafts alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from . import launcher
from .config import COMPILE_OPTIONS
from .problem import QK_HEAD_DIM, V_HEAD_DIM

# Prefix positions a program writes per step, and at most this many
# programs per sequence (each strides over the sequence's prefix): enough to
# spread a long prefix's indices over the GPU, few enough that a short batch
# in a long block table launches little.
BLOCK_P = 1024
MAX_CHUNKS = 16
BLOCK_B = 1024  # sequences the prefix sum reads per step


@triton.jit
def _prefix_len(seqlen, max_tokens, DRAFT_LEN: tl.constexpr):
    # Clamped to 0 .. max_tokens - L: an out-of-range length (trusted; the
    # debug mode checks it) never makes the kernels read outside the table.
    return tl.minimum(tl.maximum(seqlen, DRAFT_LEN), max_tokens) - DRAFT_LEN


@triton.jit(do_not_specialize=["stride_table", "max_tokens", "num_chunks"])
def _translate_kernel(
    KV_CACHE,
    BLOCK_TABLE,
    CACHE_SEQLENS,
    QO_INDPTR,
    KV_INDPTR,
    KV_INDICES,
    K_EXT,
    stride_cache_block,
    stride_cache_tok,
    slots_per_block,
    stride_table,
    max_tokens,
    num_chunks,
    DRAFT_LEN: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_B: tl.constexpr,
    D_NOPE: tl.constexpr,
    D_ROPE: tl.constexpr,
    INDPTRS: tl.constexpr,
    INDICES: tl.constexpr,
    DRAFTS: tl.constexpr,
    LAUNCH_DEPENDENTS: tl.constexpr,
):
    # Program (chunk, req): chunk-th of num_chunks strided shares of
    # sequence req's prefix positions and drafts.
    if LAUNCH_DEPENDENTS:
        # The seesaw kernel launches at once (a dependent launch): its CTAs
        # find their SMs and set up while this runs, then wait for it.
        gdc_launch_dependents()
    chunk = tl.program_id(0)
    req = tl.program_id(1)
    prefix = _prefix_len(tl.load(CACHE_SEQLENS + req), max_tokens, DRAFT_LEN)
    ptr_table = BLOCK_TABLE + req.to(tl.int64) * stride_table

    if INDPTRS or INDICES:
        # Where this sequence's prefix starts in kv_indices: the lengths before it.
        start = 0
        for first in range(0, req, BLOCK_B):
            offs_b = first + tl.arange(0, BLOCK_B)
            seqlens = tl.load(CACHE_SEQLENS + offs_b, mask=offs_b < req, other=DRAFT_LEN)
            start += tl.sum(_prefix_len(seqlens, max_tokens, DRAFT_LEN))
        if INDPTRS:  # noqa: SIM102 (a constexpr test first, then a runtime one)
            if chunk == 0:
                tl.store(KV_INDPTR + req + 1, start + prefix)
                tl.store(QO_INDPTR + req + 1, (req + 1) * DRAFT_LEN)
                if req == 0:
                    tl.store(KV_INDPTR, 0)
                    tl.store(QO_INDPTR, 0)
        if INDICES:
            for p0 in range(chunk * BLOCK_P, prefix, num_chunks * BLOCK_P):
                offs_p = p0 + tl.arange(0, BLOCK_P)
                mask_p = offs_p < prefix
                block = tl.load(ptr_table + offs_p // PAGE_SIZE, mask=mask_p, other=0)
                slot = block * slots_per_block + offs_p % PAGE_SIZE
                tl.store(KV_INDICES + start + offs_p, slot, mask=mask_p)

    if DRAFTS:
        # Positions prefix .. prefix + L - 1, copied into q's dtype.
        offs_d = tl.arange(0, D_NOPE)
        offs_r = tl.arange(0, D_ROPE)
        for i in range(chunk, DRAFT_LEN, num_chunks):
            pos = prefix + i
            block = tl.load(ptr_table + pos // PAGE_SIZE).to(tl.int64)
            ptr_row = KV_CACHE + block * stride_cache_block + (pos % PAGE_SIZE) * stride_cache_tok
            kv_c = tl.load(ptr_row + offs_d).to(tl.float32)  # [512]
            k_pe = tl.load(ptr_row + D_NOPE + offs_r).to(tl.float32)  # [64]
            row = (req * DRAFT_LEN + i).to(tl.int64)
            ptr_k = K_EXT + row * (D_NOPE + D_ROPE)
            tl.store(ptr_k + offs_d, kv_c.to(K_EXT.dtype.element_ty))
            tl.store(ptr_k + D_NOPE + offs_r, k_pe.to(K_EXT.dtype.element_ty))


def chunks(max_tokens: int) -> int:
    """Programs a sequence where the indices are written: one per BLOCK_P
    positions of the block table's reach, at most MAX_CHUNKS."""
    return max(1, min(triton.cdiv(max_tokens, BLOCK_P), MAX_CHUNKS))


def launch(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    k_extend: torch.Tensor,
    slot_stride: int,
    slots_per_block: int,
    draft_len: int,
    num_chunks: int,
    indptrs: bool,
    indices: bool,
    drafts: bool,
    launch_dependents: bool = False,
) -> None:
    """The parts asked for (module docstring) of the translation of
    ``block_table`` and ``cache_seqlens`` (bs sequences of L = ``draft_len``
    drafts) over ``kv_cache`` (token rows ``slot_stride`` elements apart,
    block n's page from slot n * ``slots_per_block``). A part not asked for
    leaves its tensor unread and unwritten (it may be any int32 tensor, or
    for ``k_extend`` any tensor). ``launch_dependents``: the next kernel, a
    programmatic dependent launch, may launch at once."""
    bs = block_table.shape[0]
    page_size = kv_cache.shape[1]
    launcher.launch(
        _translate_kernel,
        (num_chunks, bs),
        kv_cache,
        block_table,
        cache_seqlens,
        qo_indptr,
        kv_indptr,
        kv_indices,
        k_extend,
        slots_per_block * slot_stride,
        slot_stride,
        slots_per_block,
        block_table.stride(0),
        block_table.shape[1] * page_size,
        num_chunks,
        DRAFT_LEN=draft_len,
        PAGE_SIZE=page_size,
        BLOCK_P=BLOCK_P,
        BLOCK_B=BLOCK_B,
        D_NOPE=V_HEAD_DIM,
        D_ROPE=QK_HEAD_DIM - V_HEAD_DIM,
        INDPTRS=indptrs,
        INDICES=indices,
        DRAFTS=drafts,
        LAUNCH_DEPENDENTS=launch_dependents,
        num_warps=4,
        **COMPILE_OPTIONS,
    )
