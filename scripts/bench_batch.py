"""A shape's tensors: the rotation sets of one KV pool that every contender
reads, FlashInfer's page lists and the paged caches of the same values,
and the device memory they take."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from bench_shapes import ELEM, KV_CACHE_DTYPES, ShapeSpec, draft_counts

from mla_verify.problem import kv_columns
from mla_verify.testing import Q_DIM, VerifyBatch, make_batch, make_pool

ACT_DTYPE = torch.bfloat16  # q, the drafts, the output, and the KV cache unless fp8
FLASHMLA_PAGE = 64  # tokens a page of FlashMLA's dense-decode cache


@dataclass
class Batch:
    """The tensors of one shape: ``sets[r]`` is the batch of rotation set r,
    which differ only in their prefix slots (``kv_indices``) in one shared
    pool. ``fi_kv_indices[r]`` is set r's prefix plus the request's L draft
    slots (which hold k_extend) for FlashInfer's paged cache (plain shapes
    only). ``paged[r]`` is set r's values in a paged cache of
    ``spec.page_size`` (``paged_kv_with_drafts``: kv_cache, block_table,
    cache_seqlens), on -page rows only."""

    spec: ShapeSpec
    prefix_lens: list[int]
    sets: list[VerifyBatch]
    fi_kv_indptr: torch.Tensor | None  # [bs+1] int32, prefix + L per request
    fi_kv_indices: list[torch.Tensor]  # per rotation set, [sum(prefix) + bs*L] int32
    fi_kv_lens: torch.Tensor | None  # [bs] int32
    paged: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @property
    def rotations(self) -> int:
        return len(self.sets)

    @property
    def q(self) -> torch.Tensor:  # [sum(E_b), H, Dqk]
        return self.sets[0].q

    @property
    def k_buffer(self) -> torch.Tensor:  # [slots, 1, Dqk], shared by every set
        return self.sets[0].k_buffer

    @property
    def qo_indptr(self) -> torch.Tensor:
        return self.sets[0].qo_indptr

    @property
    def sm_scale(self) -> float:
        return self.sets[0].sm_scale

    @property
    def pool_bytes(self) -> int:
        """The KV pools' bytes: K's, and V's where it is a cache of its own."""
        k, v = self.k_buffer, self.sets[0].v_buffer
        own_v = v.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()
        return sum(t.numel() * t.element_size() for t in ((k, v) if own_v else (k,)))


def plan_pool(
    prefix_lens: Sequence[int],
    draft_len: int,
    *,
    l2_bytes: int,
    pool_min_bytes: int,
    max_rotations: int,
    kv_bytes: int = ELEM,
    width: int = Q_DIM,
) -> tuple[int, int]:
    """(rotation sets, pool slots): enough disjoint slot sets that one cycle
    through them reads about 4x the L2, and a pool larger than the used slots
    and than ``pool_min_bytes``. ``width``: elements of a pool row (Dqk)."""
    per_set = sum(prefix_lens) + len(prefix_lens) * draft_len
    set_bytes = per_set * width * kv_bytes
    rotations = max(1, min(max_rotations, math.ceil(4 * l2_bytes / set_bytes)))
    needed = rotations * per_set
    slots = max(math.ceil(pool_min_bytes / (width * kv_bytes)), math.ceil(1.25 * needed))
    return rotations, slots


def cache_pages(prefix_lens: Sequence[int], draft_len: int, page_size: int = FLASHMLA_PAGE) -> int:
    """Pages of a paged cache for one rotation set: prefix + drafts, per request."""
    return sum(-(-(p + draft_len) // page_size) for p in prefix_lens)


def estimate_bytes(
    spec: ShapeSpec,
    prefix_lens: Sequence[int],
    slots: int,
    rotations: int,
    *,
    flashmla: bool = False,
) -> int:
    """Device bytes the shape's tensors take (pool, q/o copies, indices, a
    custom mask, and the paged copies of the KV: FlashMLA's 64-token pages
    where it runs, the shape's own pages on -page rows, shared at page 64)."""
    dqk, dv = spec.head_dims
    tokens = spec.batch_size * spec.draft_len
    per_set = sum(prefix_lens) + tokens
    page_sizes = {spec.page_size} - {0}
    if flashmla and spec.plain and spec.page_size in (0, FLASHMLA_PAGE):
        page_sizes.add(FLASHMLA_PAGE)
    paged = 0
    for page in page_sizes:
        pages = cache_pages(prefix_lens, spec.draft_len, page)
        most = -(-(max(prefix_lens) + spec.draft_len) // page)
        paged += rotations * (pages * page * Q_DIM * spec.kv_bytes + spec.batch_size * most * 4)
    mask = spec.draft_len * (sum(prefix_lens) + tokens) if spec.mask != "causal" else 0
    return (
        slots * kv_columns(spec.head_dims) * spec.kv_bytes
        + slots * 8  # the slot permutation
        + 2 * rotations * per_set * 4  # our indices + FlashInfer's
        + paged
        + mask
        + tokens * spec.num_heads * (dqk * ELEM + 5 * dv * 4)  # q, outputs, fp32 reference
    )


def paged_indices_with_drafts(
    prefix_slots: torch.Tensor,
    draft_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    draft_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Page lists in which request b's prefix pages are followed by its L
    draft pages: (indptr [bs+1], indices [sum(prefix) + bs*L]), int32."""
    device = prefix_slots.device
    lens = prefix_lens.to(device=device, dtype=torch.int64)
    bs = lens.numel()
    total = lens + draft_len
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    kv_indptr[1:] = torch.cumsum(lens, 0)
    fi_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    fi_indptr[1:] = torch.cumsum(total, 0)
    n = int(fi_indptr[-1])
    req = torch.repeat_interleave(torch.arange(bs, device=device), total)
    local = torch.arange(n, device=device) - fi_indptr[req]
    is_prefix = local < lens[req]
    pre_idx = (kv_indptr[req] + local).clamp(0, max(prefix_slots.numel() - 1, 0))
    draft_idx = (req * draft_len + local - lens[req]).clamp(0, draft_slots.numel() - 1)
    pre = prefix_slots[pre_idx] if prefix_slots.numel() else draft_slots[draft_idx]
    indices = torch.where(is_prefix, pre, draft_slots[draft_idx])
    return fi_indptr.to(torch.int32), indices.to(torch.int32)


def paged_kv_with_drafts(
    k_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    k_extend: torch.Tensor,
    draft_len: int,
    *,
    page_size: int = FLASHMLA_PAGE,
    scatter: torch.Generator | None = None,
    chunk_rows: int = 1 << 18,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same K values in FlashMLA's dense-decode layout.

    Request b's sequence is its prefix rows ``k_buffer[kv_indices[kv_indptr[b]:
    kv_indptr[b+1]]]`` followed by its L drafts' K ``k_extend[b*L:(b+1)*L]``,
    cut into pages of ``page_size`` tokens; the drafts are the sequence's last
    L positions, so a bottom-right causal mask is the verify mask. Returns
    ``kv_cache`` [pages, page_size, 1, 576] (rows past a sequence's end are
    NaN, so reading them shows), ``block_table`` [bs, most pages a request]
    int32 (unused entries 0) and ``cache_seqlens`` [bs] int32 = prefix + L.
    With ``scatter``, pages lie in a random order of the cache, as in a real
    pool; without it, in request order. bf16/fp16 caches.
    """
    if k_buffer.element_size() != 2:
        raise ValueError(f"k_buffer: expected a bf16 or fp16 cache, got {k_buffer.dtype}")
    device = k_buffer.device
    indptr = kv_indptr.to(device=device, dtype=torch.int64)
    lens = indptr[1:] - indptr[:-1]
    bs = lens.numel()
    seqlens = lens + draft_len
    pages = (seqlens + page_size - 1) // page_size
    first_page = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    first_page[1:] = torch.cumsum(pages, 0)
    total_pages, most_pages = int(first_page[-1]), int(pages.max())
    if scatter is None:
        order = torch.arange(total_pages, device=device)
    else:
        order = torch.randperm(total_pages, generator=scatter, device=device)

    j = torch.arange(most_pages, device=device)
    logical = (first_page[:-1, None] + j).clamp(max=total_pages - 1)
    block_table = torch.where(j < pages[:, None], order[logical], 0).to(torch.int32)

    kv_cache = torch.full(
        (total_pages, page_size, 1, Q_DIM), float("nan"), dtype=k_buffer.dtype, device=device
    )
    rows = kv_cache.view(total_pages * page_size, Q_DIM)

    def row_of(req: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return order[first_page[req] + pos // page_size] * page_size + pos % page_size

    # The prefixes, in chunks: a real-size prefix is GBs.
    prefix_req = torch.repeat_interleave(torch.arange(bs, device=device), lens)
    indices = kv_indices.to(device=device, dtype=torch.int64)
    for start in range(0, indices.numel(), chunk_rows):
        req = prefix_req[start : start + chunk_rows]
        token = torch.arange(start, start + req.numel(), device=device)
        rows[row_of(req, token - indptr[req])] = k_buffer[indices[token], 0]
    # The drafts: request b's draft i at position prefix_b + i.
    draft = torch.arange(bs * draft_len, device=device)
    req = draft // draft_len
    rows[row_of(req, lens[req] + draft % draft_len)] = k_extend[draft, 0].to(k_buffer.dtype)
    return kv_cache, block_table, seqlens.to(torch.int32)


def kv_pool(
    slots: int, width: int, kv_dtype: torch.dtype, device: torch.device, seed: int
) -> torch.Tensor:
    """A random [slots, 1, width] pool: ``make_pool``'s for MLA's 576, the
    same values' law in a pool of the model's own width otherwise (256/256
    and 128/128: K's, and V's of its own)."""
    if width == Q_DIM:
        return make_pool(slots, kv_dtype, device, seed=seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    pool = torch.empty(slots, 1, width, dtype=kv_dtype, device=device)
    for start in range(0, slots, 1 << 18):
        chunk = pool[start : start + (1 << 18)]
        chunk.copy_((torch.rand(chunk.shape, generator=gen, device=device) * 4 - 2).to(kv_dtype))
    return pool


def build_batch(
    spec: ShapeSpec,
    prefix_lens: list[int],
    *,
    rotations: int,
    slots: int,
    device: torch.device,
    seed: int,
    counts: Sequence[int] | None = None,
) -> Batch:
    """Random non-zero data (``mla_verify.testing``) in one pool: each
    rotation set's prefixes and drafts at slots of one random permutation,
    disjoint between sets. v_extend holds k_extend's first Dv columns in a
    tensor of its own (as SGLang passes it) and V is a view of the pool's K
    (MLA), so every contender reads the same values; 256/256 and 128/128
    take V from a pool of its own at the same slots, as SGLang passes it.
    Plain shapes: the drafts' slots hold k_extend, for FlashInfer. Tree shapes: one SGLang tree mask
    (``make_batch(mask="tree")``, every prefix bit set), shared by the sets.
    Paged shapes: each set also copied into a cache of ``spec.page_size``
    pages, prefix then drafts, pages scattered. ``counts``: the requests'
    draft counts instead of the shape's (``draft_counts``)."""
    bs, L = spec.batch_size, spec.draft_len
    if counts is None and spec.ragged:
        counts = draft_counts(spec)
    prefix = sum(prefix_lens)
    per_set = prefix + bs * L
    kv_dtype = KV_CACHE_DTYPES[spec.kv_dtype].torch_dtype
    pool = kv_pool(slots, spec.head_dims[0], kv_dtype, device, seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)
    perm = torch.randperm(slots, generator=gen, device=device)[: rotations * per_set]
    perm = perm.view(rotations, per_set)
    first = make_batch(
        spec.num_heads,
        L,
        prefix_lens,
        dtype=ACT_DTYPE,
        kv_dtype=kv_dtype,
        device=device,
        pool=pool,
        v_extend_from_k=True,
        seed=seed + 2,
        kv_slots=perm[0, :prefix],
        head_dims=spec.head_dims,
        draft_counts=None if counts is None else list(counts),
        mask=None if spec.mask == "causal" else "tree",
        skip_prefix_custom_mask=spec.mask != "treefull",
    )
    first = dataclasses.replace(first, v_extend=first.v_extend.contiguous())
    if not spec.mla:
        v_pool = kv_pool(slots, spec.head_dims[1], kv_dtype, device, seed + 4)
        first = dataclasses.replace(first, v_buffer=v_pool)
    lens = torch.tensor(prefix_lens, dtype=torch.int64, device=device)
    index_dtype = torch.int64 if spec.int64_indices else torch.int32
    sets = [
        dataclasses.replace(first, kv_indices=perm[r, :prefix].to(index_dtype))
        for r in range(rotations)
    ]
    batch = Batch(spec, list(prefix_lens), sets, None, [], None)
    if spec.plain and not spec.page_size:
        for r in range(rotations):
            draft_slots = perm[r, prefix:]
            pool[draft_slots] = first.k_extend.to(kv_dtype)  # the drafts, as FlashInfer sees them
            batch.fi_kv_indptr, fi_idx = paged_indices_with_drafts(
                perm[r, :prefix], draft_slots, lens, L
            )
            batch.fi_kv_indices.append(fi_idx)
        batch.fi_kv_lens = (lens + L).to(torch.int32)
    if spec.page_size:
        scatter = torch.Generator(device=device)
        scatter.manual_seed(seed + 3)
        batch.paged = [
            paged_kv_with_drafts(
                vb.k_buffer,
                vb.kv_indptr,
                vb.kv_indices,
                vb.k_extend,
                L,
                page_size=spec.page_size,
                scatter=scatter,
            )
            for vb in sets
        ]
    return batch
