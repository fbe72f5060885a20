"""Paged caches in FlashMLA's / vLLM's convention, served by translation.

    q             [bs, L, H, 576]                 bf16/fp16
    kv_cache      [num_blocks, page, 1, 576]      like q, or fp8 e4m3 (with k_scale/v_scale);
                                                  V is the first 512 columns
    block_table   [bs, max_blocks] int32          page p of sequence b is block block_table[b, p]
    cache_seqlens [bs] int32                      tokens of sequence b, its L drafts included:
                                                  they are its last L positions
    o             [bs, L, H, 512]

Draft i of sequence b sees positions ``< cache_seqlens[b] - L + i + 1``
(bottom-right causal). Every position's score is ``sm_scale * k_scale *
q . c`` and its value ``v_scale * c[:512]``, drafts included: they live in
the same cache.

How: one small Triton kernel (translate.py, grid chunks x bs) rewrites
the call into the token-indexed form of ``verify_mla_fwd`` inside the
per-device workspace, on the device (no host sync, graph-safe):

    kv_indptr   [bs+1]            prefix-summed prefix lengths cache_seqlens - L
    kv_indices  [<= bs*max_tokens] slot block_table[b, p // page] * page + p % page
                                  of every prefix position p
    k_extend    [bs*L, 1, 576]    the drafts' rows, gathered into q's dtype
                                  (fp8 -> bf16/fp16 is exact)
    v_extend    [bs*L, 1, 512]    k_extend's view

then computes ``verify_mla_fwd``'s call (``api.run_prepared``, its host work
kept with the paged call's) with the cache viewed as a page-size-1 pool
``[num_blocks * page, 1, 576]`` and V as its ``[..., :512]`` view, so the
same tuned tables, balanced plan and (bf16 or fp8 on the H200) Hopper kernel
serve paged calls. ``max_tokens`` is max_blocks x page, a host-known bound.

Scales: ``k_scale`` is folded into the score scale (sm_scale * k_scale,
for prefix and drafts alike: no loss). ``v_scale`` goes to the kernels
twice, as the cache's value scale and as ``v_extend_scale``, which they
apply to the drafts' P V in fp32: no scaled value is rounded before the
output. (Drafts' rows scaled and rounded to q's dtype put an output past
the tests' tolerance: RESULTS.md.) ``v_scale`` must be nonzero.

On Hopper, bf16 calls on pages of 64 or 128 tokens at batch 1-512, any
number of query rows a sequence (heads x drafts), run a native paged kernel
instead (``seesaw_serves``, kernel_seesaw.py): the translation then writes the
indptrs alone, the seesaw kernel reads the pages and the drafts' rows where
the cache holds them (v_scale scales its output, in fp32), and stage 2
merges its partials as the Hopper kernel's. The seesaw kernel is the
translation's programmatic dependent launch: its CTAs take their SMs and
set up while the translation runs, and wait for it before they read the
indptrs.

A step's metadata (``paged_metadata``): the indptrs and indices depend on
the block table and the lengths alone, which every layer of a step shares.
Made once a step and passed to each layer's call, they leave the layer's
translation the drafts' rows alone, and the seesaw kernel no translation
at all: it launches first and reads the metadata's indptrs. Made for the
calls' heads, it also holds each seesaw CTA's share, planned once
(kernel_seesaw.launch_plan), which the calls read instead of planning.

Cost of the translation over a native paged kernel: one more launch (bs x min(16,
cdiv(max_tokens, 1024)) small programs), 4 bytes written and 4 read per prefix token for
kv_indices (0.7% of a bf16 token's 1152 bytes, 1.4% of fp8's 576), and the
drafts' rows: L x 576 cache elements read, 1152 bytes written and read
again per sequence.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from . import api, hopper, launcher, plan, prepared, seesaw_merge, translate
from .api import _as_scale, _expect
from .device import is_cuda_sm90, sm_count
from .kernel import INTERPRETED, LOG2E, MERGE_WARPS, launch_merge_shares
from .problem import (
    KV_DTYPES,
    MAX_BATCH_SIZE,
    MAX_DRAFT_LEN,
    MAX_HEADS,
    MAX_POOL_SLOTS,
    MIN_BATCH_SIZE,
    MIN_DRAFT_LEN,
    MIN_HEADS,
    Q_DTYPES,
    QK_HEAD_DIM,
    V_HEAD_DIM,
    check_range,
)
from .workspace import capturing, get_workspace, seesaw_grid, seesaw_partial_rows

PAGE_SIZES = (1, 16, 32, 64, 128)


# --- the entry point ---------------------------------------------------------------


def verify_mla_paged(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
    metadata: PagedMetadata | None = None,
) -> torch.Tensor:
    """MLA target-verify attention over a paged cache, in FlashMLA's convention.

    For every sequence b with ``n = cache_seqlens[b]`` tokens, the last L of
    which are its drafts, draft i (query ``q[b, i]``, all H heads) attends
    to positions ``0 .. n - L + i`` (bottom-right causal): position p is row
    ``kv_cache[block_table[b, p // page], p % page, 0]``; scores are
    ``sm_scale * k_scale * q . row`` (``sm_scale`` defaults to 1/sqrt(576)),
    values ``v_scale * row[:512]``. Returns ``out`` [bs, L, H, 512] in q's
    dtype (allocated unless given).

    Shapes: q [bs, L, H, 576] bf16/fp16 (any head stride; the batch and
    draft dims must merge into one, as in a contiguous q); kv_cache
    [num_blocks, page, 1, 576] in q's dtype, or fp8 e4m3 with Python-float
    scales; page 1, 16, 32, 64 or 128; block_table [bs, max_blocks] int32;
    cache_seqlens [bs] int32. L is 1..16.

    ``metadata``: this step's ``paged_metadata(kv_cache, block_table,
    cache_seqlens, L)``, made once and passed to every layer's call, as
    FlashMLA's scheduling metadata is; each call then skips the part of its
    work that only the block table and the lengths decide. Without it the
    call derives that part itself. It must be made from this call's
    block_table and cache_seqlens as they are now (trusted, like them).

    Graph-safe: no host sync; with ``out`` given and the workspace prepared
    (``prepare_paged_workspace``) nothing allocates. Block-table entries and
    lengths are trusted (``L <= cache_seqlens[b] <= max_blocks * page``,
    entries of the used pages in 0..num_blocks-1); ``set_debug(True)``
    checks them, and that ``metadata`` is theirs, on every call outside
    capture. Raises ValueError, naming the argument, for shapes, dtypes,
    devices or scales that disagree.

    Inside ``torch.compile`` the call goes through the custom op
    ``mla_verify::verify_mla_paged`` (``mla_verify.ops``), ``metadata``
    passed to it as its tensors.
    """
    if torch.compiler.is_compiling():
        given = () if metadata is None else metadata.tensors()
        if out is None:
            return torch.ops.mla_verify.verify_mla_paged(
                q, kv_cache, block_table, cache_seqlens, sm_scale, k_scale, v_scale, *given
            )
        torch.ops.mla_verify.verify_mla_paged_out(
            q, kv_cache, block_table, cache_seqlens, out, sm_scale, k_scale, v_scale, *given
        )
        return out
    return paged_forward(
        q,
        kv_cache,
        block_table,
        cache_seqlens,
        sm_scale=sm_scale,
        k_scale=k_scale,
        v_scale=v_scale,
        out=out,
        metadata=metadata,
    )


def paged_forward(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: torch.Tensor | None = None,
    metadata: PagedMetadata | None = None,
) -> torch.Tensor:
    """``verify_mla_paged`` without the compile dispatch: the custom ops'
    implementation."""
    key = None
    given = metadata.tensors() if isinstance(metadata, PagedMetadata) else (None,) * 3
    if not api._debug:  # the debug mode reads values on every call
        # seesaw_shape is read as a value: the benchmark and tests replace it.
        scalars = (sm_scale, k_scale, v_scale, seesaw_shape, metadata is None)
        key = prepared.signature((q, kv_cache, block_table, cache_seqlens, out, *given), scalars)
    call = prepared.get(key)
    if call is None:
        call = _prepare(
            q, kv_cache, block_table, cache_seqlens, out, sm_scale, k_scale, v_scale, metadata
        )
        prepared.keep(key, call)
    bs, draft_len, num_heads, _ = q.shape
    if api._debug and not capturing(q.device):
        check_paged_values(kv_cache, block_table, cache_seqlens, draft_len)
        if metadata is not None:
            check_metadata_values(metadata, kv_cache, block_table, cache_seqlens)

    if out is None:
        out = q.new_empty(bs, draft_len, num_heads, V_HEAD_DIM)
    views = get_workspace(q.device).paged_views(bs, draft_len, call.max_tokens, q.dtype)
    if metadata is not None:
        views = dataclasses.replace(
            views,
            kv_indices=metadata.kv_indices,
            qo_indptr=metadata.qo_indptr,
            kv_indptr=metadata.kv_indptr,
        )
    # The kernels this signature launched the first time (launcher.Recording);
    # the verify_mla_fwd work below keeps its own.
    with launcher.replayed(call.launches):
        # The translation: all of it; without the indices where the seesaw
        # kernel reads the pages; with metadata the drafts' rows alone, and
        # nothing for the seesaw kernel.
        if metadata is None or call.seesaw is None:
            translate.launch(
                kv_cache,
                block_table,
                cache_seqlens,
                qo_indptr=views.qo_indptr,
                kv_indptr=views.kv_indptr,
                kv_indices=views.kv_indices,
                k_extend=views.k_extend,
                slot_stride=call.slot_stride,
                slots_per_block=call.slots_per_block,
                draft_len=draft_len,
                num_chunks=call.num_chunks,
                indptrs=metadata is None,
                indices=metadata is None and call.seesaw is None,
                drafts=call.seesaw is None,
                launch_dependents=call.seesaw is not None and call.seesaw.dependent,
            )
        if call.seesaw is not None:
            _seesaw_forward(q, kv_cache, block_table, out, views, call, metadata)
            return out
    k_buffer = token_pool(kv_cache)
    tensors = (
        q.view(bs * draft_len, num_heads, QK_HEAD_DIM),
        views.k_extend,
        views.v_extend,
        out.view(bs * draft_len, num_heads, V_HEAD_DIM),
        k_buffer,
        k_buffer[..., :V_HEAD_DIM],
        views.qo_indptr,
        views.kv_indptr,
        views.kv_indices,
        None,
        None,
    )
    # verify_mla_fwd's host work, kept with this call's: the paged
    # signature fixes every tensor's metadata it reads (the workspace views
    # are carved per shape, 16-byte aligned), so its signature is not formed
    # again (the inner signature was about a tenth of a paged call's host time).
    if not call.inner:
        options = api.fwd_options(
            is_causal=True,
            max_len_extend=draft_len,
            v_scale=call.v_scale,
            sm_scale=call.sm_scale * call.k_scale,
            page_size=kv_cache.shape[1],
            v_extend_scale=call.v_scale,
        )
        call.inner.append(api.kept_call(tensors, options))
    wrote = api.run_prepared(call.inner[0], tensors)
    if not wrote:  # validate_paged admits only calls the gate accepts
        raise RuntimeError("mla_verify: verify_mla_fwd refused a validated paged call")
    return out


@dataclass(frozen=True)
class _SeesawLaunch:
    """The seesaw kernel's grid and plan for a call (``_seesaw_forward``)."""

    block_h: int
    ctas: int
    min_share: int
    partial_rows: int
    dependent: bool
    merge_blocks: int
    merge_warps: int
    rows_merge: bool


@dataclass(frozen=True)
class _PagedCall:
    """A paged call's host work (``prepared``): its scales checked, its
    translation's launch, and the seesaw kernel's where that serves it."""

    sm_scale: float
    k_scale: float
    v_scale: float
    max_tokens: int
    num_chunks: int
    slot_stride: int
    slots_per_block: int
    seesaw: _SeesawLaunch | None
    launches: launcher.Recording = field(default_factory=launcher.Recording, compare=False)
    # The translated call's verify_mla_fwd host work, once its first call
    # has done it (api.kept_call).
    inner: list = field(default_factory=list, compare=False)


def _prepare(
    q, kv_cache, block_table, cache_seqlens, out, sm_scale, k_scale, v_scale, metadata
) -> _PagedCall:
    """``paged_forward``'s work before its launches, from metadata alone
    (ValueError for what disagrees)."""
    validate_paged(q, kv_cache, block_table, cache_seqlens, out)
    if metadata is not None:
        check_metadata(metadata, kv_cache, block_table, q.shape[1])
    k_scale = _as_scale(k_scale, "k_scale", positive=True)
    v_scale = _as_scale(v_scale, "v_scale", nonzero=True)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(QK_HEAD_DIM)
    sm_scale = _as_scale(sm_scale, "sm_scale", positive=True)
    max_tokens = block_table.shape[1] * kv_cache.shape[1]
    slot_stride, slots_per_block, _ = pool_layout(kv_cache)
    seesaw = None
    if seesaw_serves(q, kv_cache, block_table):
        seesaw = _seesaw_launch(*q.shape[:3], kv_cache)
    # The translation's programs a sequence: one where it writes the indptrs
    # alone (for the seesaw kernel); else one a draft at least, so that each
    # draft's copy waits on its own two dependent loads (the table's entry,
    # then the row), where one program's loop over the drafts chained them
    # L times (4.9-5.3 us at L = 8 on an H100: RESULTS.md, "Stage 2 from the
    # step's plan"); and where it writes the indices, one a BLOCK_P
    # positions of the table's reach (translate.chunks).
    index_chunks = 1 if metadata else translate.chunks(max_tokens)
    num_chunks = 1 if seesaw else max(q.shape[1], index_chunks)
    return _PagedCall(
        sm_scale, k_scale, v_scale, max_tokens, num_chunks, slot_stride, slots_per_block, seesaw
    )


# --- a step's metadata ------------------------------------------------------------------


@dataclass(frozen=True)
class PagedMetadata:
    """What the paged calls of one step share (``paged_metadata``): the
    token-indexed form's indptrs and indices (``translate.py``), which only
    the block table and the lengths decide, for a cache of this layout."""

    batch_size: int
    draft_len: int
    max_tokens: int  # block_table.shape[1] x page
    page_size: int
    slots_per_block: int
    qo_indptr: torch.Tensor  # [bs+1] int32
    kv_indptr: torch.Tensor  # [bs+1] int32
    kv_indices: torch.Tensor  # [bs * max_tokens] int32, the first kv_indptr[-1] used
    # Where made for num_heads and the seesaw kernel serves such calls: each
    # of its CTAs' shares (kernel_seesaw.launch_plan), and the grid planned
    # (heads a head block, CTAs a head block, the shares' least positions);
    # and each request's pieces for stage 2 after it (seesaw_merge.launch_plan).
    seesaw_plan: torch.Tensor | None = None
    seesaw_grid: tuple[int, int, int] | None = None
    seesaw_merge_plan: torch.Tensor | None = None

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The indptrs and indices: what the custom ops take (mla_verify.ops)."""
        return self.qo_indptr, self.kv_indptr, self.kv_indices

    def plan_for(self, launch: _SeesawLaunch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The seesaw plan and its merge plan, where made for ``launch``'s grid."""
        if self.seesaw_grid != (launch.block_h, launch.ctas, launch.min_share):
            return None
        return self.seesaw_plan, self.seesaw_merge_plan


def paged_metadata(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    draft_len: int,
    *,
    num_heads: int | None = None,
    out: PagedMetadata | None = None,
) -> PagedMetadata:
    """The part of a step's paged calls that the block table and the
    lengths decide, for every layer's ``verify_mla_paged(...,
    metadata=...)``: make it once a step, after block_table and
    cache_seqlens are set, as FlashMLA's ``get_mla_metadata``.

    ``kv_cache``: any layer's cache (its shape and strides alone are read:
    every layer's must share them). ``draft_len``: L, the drafts of every
    sequence. ``num_heads``: the calls' query heads, where known; then,
    where the seesaw kernel serves such calls, each of its CTAs' shares is
    planned here too, and not at the start of every layer's call (not
    inside torch.compile, where the calls plan their own). ``out``:
    a metadata made for the same shapes to write into, in place: nothing
    allocates, so the call can be captured in a CUDA graph beside the
    layers' calls (it keeps the heads it was made for). Raises ValueError,
    naming the argument, for shapes, dtypes or devices that disagree."""
    validate_metadata_args(kv_cache, block_table, cache_seqlens, draft_len)
    if num_heads is not None:
        check_range("num_heads", num_heads, MIN_HEADS, MAX_HEADS)
    if out is None:
        bs, max_tokens = block_table.shape[0], block_table.shape[1] * kv_cache.shape[1]
        indptrs = [block_table.new_empty(bs + 1) for _ in range(2)]
        kv_indices = block_table.new_empty(bs * max_tokens)
        out = metadata_of(kv_cache, block_table, draft_len, *indptrs, kv_indices)
        # The seesaw's shares: not inside torch.compile, whose op writes the
        # indptrs and indices alone (the calls then plan their own).
        planned = num_heads is not None and not torch.compiler.is_compiling()
        if planned and _seesaw_serves_cache(bs, kv_cache, block_table):
            from . import kernel_seesaw  # Gluon: only where the seesaw kernel serves

            launch = _seesaw_launch(bs, draft_len, num_heads, kv_cache)
            plan_numel = kernel_seesaw.plan_numel(launch.ctas)
            out = dataclasses.replace(
                out,
                # Zeroed: the plans' rows are padded, and the pads, which
                # no launch writes, must compare equal in the debug check.
                seesaw_plan=block_table.new_zeros(plan_numel),
                seesaw_grid=(launch.block_h, launch.ctas, launch.min_share),
                seesaw_merge_plan=block_table.new_zeros(seesaw_merge.plan_numel(bs)),
            )
    else:
        check_metadata(out, kv_cache, block_table, draft_len, name="out")
    if torch.compiler.is_compiling():  # the op writes the tensors (mla_verify.ops)
        _expect(
            out.seesaw_plan is None,
            "out",
            "a metadata made without num_heads inside torch.compile",
            "one holding a seesaw plan, which the op would leave unwritten",
        )
        torch.ops.mla_verify.paged_metadata_out(
            kv_cache, block_table, cache_seqlens, draft_len, *out.tensors()
        )
    else:
        write_metadata(out, kv_cache, block_table, cache_seqlens)
    return out


def validate_metadata_args(
    kv_cache: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor, draft_len: int
) -> None:
    """``paged_metadata``'s arguments (and its op's): ValueError naming the
    argument where shapes, dtypes or devices disagree."""
    check_range("draft_len", draft_len, MIN_DRAFT_LEN, MAX_DRAFT_LEN)
    _validate_cache(kv_cache)
    _validate_table(block_table, cache_seqlens, None, draft_len, kv_cache)
    check_range(
        "block_table.shape[0] (batch size)", block_table.shape[0], MIN_BATCH_SIZE, MAX_BATCH_SIZE
    )


def write_metadata(
    metadata: PagedMetadata,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
) -> None:
    """``paged_metadata``'s launch: the translation's indptrs and indices
    into ``metadata``'s tensors (checked beforehand)."""
    slot_stride, slots_per_block, _ = pool_layout(kv_cache)
    translate.launch(
        kv_cache,
        block_table,
        cache_seqlens,
        qo_indptr=metadata.qo_indptr,
        kv_indptr=metadata.kv_indptr,
        kv_indices=metadata.kv_indices,
        k_extend=metadata.kv_indices,  # not written: no drafts are copied
        slot_stride=slot_stride,
        slots_per_block=slots_per_block,
        draft_len=metadata.draft_len,
        num_chunks=translate.chunks(metadata.max_tokens),
        indptrs=True,
        indices=True,
        drafts=False,
    )
    if metadata.seesaw_grid is not None:
        from . import kernel_seesaw

        _, ctas, min_share = metadata.seesaw_grid
        kernel_seesaw.launch_plan(
            metadata.seesaw_plan,
            metadata.qo_indptr,
            metadata.kv_indptr,
            batch_size=metadata.batch_size,
            ctas=ctas,
            min_share=min_share,
        )
        seesaw_merge.launch_plan(
            metadata.seesaw_merge_plan,
            metadata.qo_indptr,
            metadata.kv_indptr,
            batch_size=metadata.batch_size,
            share_ctas=ctas,
            min_share=min_share,
        )


def metadata_of(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    draft_len: int,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> PagedMetadata:
    """A ``PagedMetadata`` of these tensors, for calls on this cache and
    block table (the custom ops pass a metadata as its tensors)."""
    _, slots_per_block, _ = pool_layout(kv_cache)
    page_size = kv_cache.shape[1]
    return PagedMetadata(
        block_table.shape[0],
        draft_len,
        block_table.shape[1] * page_size,
        page_size,
        slots_per_block,
        qo_indptr,
        kv_indptr,
        kv_indices,
    )


def check_metadata(
    metadata: PagedMetadata,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    draft_len: int,
    name: str = "metadata",
) -> None:
    """``metadata`` was made for calls of this shape (no value reads):
    ValueError naming ``name`` otherwise."""
    _expect(
        isinstance(metadata, PagedMetadata),
        name,
        "a PagedMetadata (paged_metadata)",
        type(metadata).__name__,
    )
    _, slots_per_block, _ = pool_layout(kv_cache)
    made_for = {
        "batch_size": block_table.shape[0],
        "draft_len": draft_len,
        "max_tokens": block_table.shape[1] * kv_cache.shape[1],
        "page_size": kv_cache.shape[1],
        "slots_per_block": slots_per_block,
    }
    for field_name, expected in made_for.items():
        actual = getattr(metadata, field_name)
        _expect(actual == expected, f"{name}.{field_name}", f"{expected} (this call's)", actual)
    bs = block_table.shape[0]
    for field_name, numel in (("qo_indptr", bs + 1), ("kv_indptr", bs + 1)):
        t = getattr(metadata, field_name)
        _expect(t.shape == (numel,), f"{name}.{field_name}.shape", (numel,), tuple(t.shape))
    kv_indices = metadata.kv_indices
    expected = (bs * made_for["max_tokens"],)
    _expect(
        kv_indices.shape == expected, f"{name}.kv_indices.shape", expected, tuple(kv_indices.shape)
    )
    for t in metadata.tensors():
        _expect(t.dtype == torch.int32, f"{name} tensors' dtype", torch.int32, t.dtype)
        _expect(t.is_contiguous(), f"{name} tensors", "contiguous", "a strided view")
        _expect(
            t.device == block_table.device,
            f"{name} tensors' device",
            f"{block_table.device} (block_table's)",
            t.device,
        )


def check_metadata_values(
    metadata: PagedMetadata,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
) -> None:
    """Debug mode: ``metadata`` is the translation of this block table and
    these lengths, and its seesaw plans theirs (synchronises)."""
    tensors = ("qo_indptr", "kv_indptr", "kv_indices", "seesaw_plan", "seesaw_merge_plan")
    fresh = dataclasses.replace(
        metadata,
        **{
            name: torch.zeros_like(getattr(metadata, name))  # the plans' pads: paged_metadata's
            for name in tensors
            if getattr(metadata, name) is not None
        },
    )
    paged_metadata(kv_cache, block_table, cache_seqlens, metadata.draft_len, out=fresh)
    used = int(fresh.kv_indptr[-1])
    same = (
        torch.equal(fresh.qo_indptr, metadata.qo_indptr)
        and torch.equal(fresh.kv_indptr, metadata.kv_indptr)
        and torch.equal(fresh.kv_indices[:used], metadata.kv_indices[:used])
        and all(
            getattr(metadata, name) is None
            or torch.equal(getattr(fresh, name), getattr(metadata, name))
            for name in ("seesaw_plan", "seesaw_merge_plan")
        )
    )
    _expect(
        same,
        "metadata",
        "paged_metadata of this call's block_table and cache_seqlens",
        "metadata of other values (made before they changed?)",
    )


# Which bf16 calls on pages of 64 or 128 tokens run the seesaw kernel
# (kernel_seesaw.py): every batch of at most SEESAW_MAX_BATCH sequences,
# the largest measured, whatever their rows (heads x drafts). The translated
# call keeps larger batches, and the calls the seesaw cannot serve (fp8 or
# fp16, other page sizes, rows TMA cannot copy).
# Side by side against the rule it replaced, each given its step's metadata,
# on an H100 at 361ea73 (RESULTS.md, "The seesaw kernel at every shape"),
# on the shapes that rule left on the translated call: 64 rows a sequence
# at batch 2-64 1.05x (1.06-1.18x with 2K contexts, none below 0.995); 32
# and 128 rows at batch 2-4 1.14x (1.05-1.32x); 128 rows at batch 256
# 1.03-1.08x and 256 rows at batch 256-512 1.13-1.24x; 8-64 rows at batch
# 128-512 at parity (0.99-1.04x). The rule had been drawn on older seesaw
# kernels, since made faster (its fixed part and its stage 2).
SEESAW_MAX_BATCH = 512

# The seesaw's least share, in 64-token positions, whatever the tuned entry
# holds (the tuner measures that on the token-indexed kernel): 2 for a
# single sequence, 3 for a batch. On an H100 (RESULTS.md, "The seesaw's
# least share by batch"), 3 ran batches of 4-8 with 2K contexts 5-7%
# faster than 2 and 12-16% faster than 4; a single sequence ran 6% faster
# at 2 than at 3 with 2K contexts, 1-2% with 4K-8K. Where a batch's
# positions fill the grid past the share a CTA, it plays no part.
SEESAW_MIN_SHARE = 3
SEESAW_MIN_SHARE_ONE_SEQUENCE = 2

# Warps of a stage-2 program after the seesaw kernel (``_seesaw_merge_warps``):
# 2 for a batch of sequences of at most 32 query rows, 1 for a single
# sequence of at most 64, else kernel.MERGE_WARPS (4, as after kernel_sm90's
# stage 1). Measured, not derived: on an H100 (RESULTS.md, "Stage 2 after
# the seesaw in fewer warps"), with 2K contexts, 2 warps took 0.92-0.995
# of 4's time on those batch-8 rows and 1 warp 0.85-0.91 on those single
# sequences; on 128 rows or more at batch 8 they took up to 1.15 and 1.31
# of it. A narrower program holds its tile in fewer, wider threads, about
# as many registers in all (6,144 at 4 warps, 5,120 at 2, 5,760 at 1 for
# H16 L1 B8's tile, sm90), so none fits beside a seesaw CTA (4,096 left);
# at 2 warps 12 fit an idle SM where 10 did.
SEESAW_MERGE_WARPS = 2
SEESAW_MERGE_MAX_ROWS = 32
SEESAW_MERGE_WARPS_ONE_SEQUENCE = 1
SEESAW_MERGE_MAX_ROWS_ONE_SEQUENCE = 64

# Stage 2 from a step's plan over each request's rows, of several heads a
# program (seesaw_merge.launch_rows), for batches of 2 to
# ROWS_MERGE_MAX_BATCH sequences of ROWS_MERGE_MIN_ROWS query rows or more,
# ROWS_MERGE_MAX_STEP_ROWS in all at most (batch x rows). On an H100
# (RESULTS.md, "Stage 2 over each request's rows"), against one program a
# head: 16-32 rows at batch 8 1.01-1.07x with 2K contexts and 1.00-1.02x
# with 16K, at batch 2-4 0.99-1.03x; 8 rows lost up to 6% at batch 2-4
# (more pieces than a load holds), and batches of 16-64 lost 1-3%. Since
# the seesaw serves every row count ("Stage 2 over each request's rows at 64
# and 128 rows"): 64 and 128 rows at batch 2 1.04-1.19x with 16K-64K
# contexts (0.996-1.07x with 2K), 64 rows at batch 4 1.02-1.08x; 128 rows
# at batch 4 and 64 at batch 8, 512 rows in all, 0.96-1.03x: they keep
# seesaw_merge.launch.
ROWS_MERGE_MAX_BATCH = 8
ROWS_MERGE_MIN_ROWS = 16
ROWS_MERGE_MAX_STEP_ROWS = 256


def seesaw_shape(batch_size: int) -> bool:
    """The rule's part that reads the shape alone: a batch of
    ``batch_size`` sequences, whatever their query rows (heads x drafts:
    measured ahead at each, see SEESAW_MAX_BATCH). The benchmark and tests
    replace this function to force either path."""
    return batch_size <= SEESAW_MAX_BATCH


def seesaw_serves(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor) -> bool:
    """Whether the seesaw kernel (kernel_seesaw.py) computes this paged
    call: its shape admitted by ``seesaw_shape``, on a compiled Hopper
    device, bf16 q and cache, pages of a multiple of 64 tokens, rows TMA can
    copy, a block table int32 offsets reach. Metadata only."""
    return (
        _seesaw_serves_cache(q.shape[0], kv_cache, block_table)
        and q.dtype == torch.bfloat16
        and hopper.copy_aligned(q)
    )


def _seesaw_serves_cache(
    batch_size: int, kv_cache: torch.Tensor, block_table: torch.Tensor
) -> bool:
    """``seesaw_serves``' part that q does not decide: whether the seesaw
    kernel would compute calls of ``batch_size`` sequences on this cache and
    block table, given a bf16 q whose rows TMA can copy (what
    ``paged_metadata`` plans for)."""
    return (
        seesaw_shape(batch_size)
        and block_table.numel() < 2**31  # the kernel offsets into it in int32
        and hopper.available()
        and not INTERPRETED
        and kv_cache.dtype == torch.bfloat16
        and is_cuda_sm90(kv_cache.device)
        and hopper.tiles_in_pages(kv_cache.shape[1])
        and hopper.copy_aligned(token_pool(kv_cache))
    )


def _seesaw_launch(
    batch_size: int, draft_len: int, num_heads: int, kv_cache: torch.Tensor
) -> _SeesawLaunch:
    sms = sm_count(kv_cache.device)
    block_h, ctas = seesaw_grid(num_heads, draft_len, sms)
    return _SeesawLaunch(
        block_h,
        ctas,
        SEESAW_MIN_SHARE_ONE_SEQUENCE if batch_size == 1 else SEESAW_MIN_SHARE,
        seesaw_partial_rows(num_heads, draft_len, sms),  # what prepare_paged_workspace sizes
        plan.dependent_launch(kv_cache.device),
        plan.merge_column_blocks(batch_size, num_heads, draft_len, ctas),
        _seesaw_merge_warps(batch_size, num_heads * draft_len),
        _rows_merge(batch_size, num_heads * draft_len),
    )


def _rows_merge(batch_size: int, rows: int) -> bool:
    """Whether stage 2 from a step's plan runs over each request's rows
    (seesaw_merge.launch_rows) for a batch of ``batch_size`` sequences of
    ``rows`` query rows each."""
    return (
        1 < batch_size <= ROWS_MERGE_MAX_BATCH
        and rows >= ROWS_MERGE_MIN_ROWS
        and batch_size * rows <= ROWS_MERGE_MAX_STEP_ROWS
    )


def _seesaw_merge_warps(batch_size: int, rows: int) -> int:
    """Warps of a stage-2 program after the seesaw kernel, for a batch of
    ``batch_size`` sequences of ``rows`` query rows each."""
    if batch_size == 1:
        few = rows <= SEESAW_MERGE_MAX_ROWS_ONE_SEQUENCE
        return SEESAW_MERGE_WARPS_ONE_SEQUENCE if few else MERGE_WARPS
    return SEESAW_MERGE_WARPS if rows <= SEESAW_MERGE_MAX_ROWS else MERGE_WARPS


def _seesaw_forward(q, kv_cache, block_table, out, views, call: _PagedCall, metadata):
    """Both stages of a paged call on the seesaw kernel; ``views`` hold the
    indptrs: the translation's just launched, or the step's ``metadata``'s
    (written by an earlier launch), with each CTA's share and each
    request's pieces where it planned them for this grid."""
    from . import kernel_seesaw

    bs, draft_len, num_heads, _ = q.shape
    launch = call.seesaw
    part_o, part_lse = get_workspace(q.device).views(launch.partial_rows, V_HEAD_DIM)
    o = out.view(bs * draft_len, num_heads, V_HEAD_DIM)
    planned = None if metadata is None else metadata.plan_for(launch)
    shares_plan, pieces_plan = planned or (None, None)
    kernel_seesaw.launch(
        q.view(bs * draft_len, num_heads, QK_HEAD_DIM),
        token_pool(kv_cache)[:, 0],
        block_table,
        o,
        views.qo_indptr,
        views.kv_indptr,
        part_o,
        part_lse,
        page_size=kv_cache.shape[1],
        slots_per_block=call.slots_per_block,
        batch_size=bs,
        draft_len=draft_len,
        block_h=launch.block_h,
        ctas=launch.ctas,
        min_share=launch.min_share,
        score_scale=call.sm_scale * call.k_scale * LOG2E,
        v_scale=call.v_scale,
        wait_prior=launch.dependent,
        launch_dependents=launch.dependent,
        plan=shares_plan,
    )
    if pieces_plan is not None:  # stage 2 reads each request's pieces from the plan
        planned_merge = dict(batch_size=bs, draft_len=draft_len, dependent=launch.dependent)
        if launch.rows_merge:
            merge = seesaw_merge.launch_rows
            planned_merge.update(share_ctas=launch.ctas)
        else:
            merge = seesaw_merge.launch
            planned_merge.update(column_blocks=launch.merge_blocks, warps=launch.merge_warps)
        merge(o, pieces_plan, part_o, part_lse, **planned_merge)
        return
    launch_merge_shares(
        o,
        views.qo_indptr,
        views.kv_indptr,
        part_o,
        part_lse,
        batch_size=bs,
        draft_len=draft_len,
        block_h=launch.block_h,
        share_ctas=launch.ctas,
        min_share=launch.min_share,
        column_blocks=launch.merge_blocks,
        dependent=launch.dependent,
        ragged=False,
        warps=launch.merge_warps,
    )


def pool_layout(kv_cache: torch.Tensor) -> tuple[int, int, int]:
    """(slot stride, slots per block, slots) of the cache seen as a
    page-size-1 pool: token rows ``slot stride`` elements apart, block n's
    page beginning at slot n * slots-per-block (n * page for a contiguous
    cache). Strides of size-1 dims mean nothing, so page 1 takes the block
    stride as the row stride."""
    num_blocks, page_size = kv_cache.shape[0], kv_cache.shape[1]
    if page_size == 1:
        return kv_cache.stride(0), 1, num_blocks
    slot_stride = kv_cache.stride(1)
    slots_per_block = kv_cache.stride(0) // slot_stride if num_blocks > 1 else page_size
    return slot_stride, slots_per_block, (num_blocks - 1) * slots_per_block + page_size


def token_pool(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache as a page-size-1 pool [slots, 1, 576], a view (nothing is
    copied): slot n * slots-per-block + t is token t of block n."""
    slot_stride, _, slots = pool_layout(kv_cache)
    return kv_cache.as_strided((slots, 1, QK_HEAD_DIM), (slot_stride, QK_HEAD_DIM, 1))


def validate_paged(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor | None,
) -> None:
    """Shapes, dtypes, strides and devices of a paged call (no value reads);
    ValueError naming the argument, the expected and the actual value."""
    tensors = {"q": q, "kv_cache": kv_cache, "block_table": block_table}
    tensors["cache_seqlens"] = cache_seqlens
    if out is not None:
        tensors["out"] = out
    for name, t in tensors.items():
        _expect(isinstance(t, torch.Tensor), name, "a tensor", type(t).__name__)
    _expect(q.dim() == 4, "q.shape", "[bs, L, H, 576]", tuple(q.shape))
    bs, draft_len, num_heads, head_dim = q.shape
    check_range("q.shape[0] (batch size)", bs, MIN_BATCH_SIZE, MAX_BATCH_SIZE)
    check_range("q.shape[1] (draft length L)", draft_len, MIN_DRAFT_LEN, MAX_DRAFT_LEN)
    check_range("q.shape[2] (heads)", num_heads, MIN_HEADS, MAX_HEADS)
    _expect(head_dim == QK_HEAD_DIM, "q.shape[3]", QK_HEAD_DIM, head_dim)
    _expect(q.dtype in Q_DTYPES, "q.dtype", "torch.bfloat16 or torch.float16", q.dtype)
    _expect(q.stride(-1) == 1, "q.stride(-1)", "1", q.stride(-1))
    _expect(
        bs == 1 or draft_len == 1 or q.stride(0) == draft_len * q.stride(1),
        "q.stride(0)",
        f"{draft_len} * q.stride(1) = {draft_len * q.stride(1)} (batch and draft dims merged, "
        "as in q.contiguous())",
        q.stride(0),
    )
    _validate_cache(kv_cache)
    _expect(
        kv_cache.dtype not in Q_DTYPES or kv_cache.dtype == q.dtype,
        "kv_cache.dtype",
        f"{q.dtype} (q's) or an fp8 dtype",
        kv_cache.dtype,
    )
    _validate_table(block_table, cache_seqlens, bs, draft_len, kv_cache)
    if out is not None:
        expected = (bs, draft_len, num_heads, V_HEAD_DIM)
        _expect(tuple(out.shape) == expected, "out.shape", expected, tuple(out.shape))
        _expect(out.dtype == q.dtype, "out.dtype", f"{q.dtype} (q's)", out.dtype)
        _expect(out.stride(-1) == 1, "out.stride(-1)", "1", out.stride(-1))
        _expect(
            bs == 1 or draft_len == 1 or out.stride(0) == draft_len * out.stride(1),
            "out.stride(0)",
            f"{draft_len} * out.stride(1) = {draft_len * out.stride(1)} (batch and draft dims "
            "merged, as in a contiguous out)",
            out.stride(0),
        )
    for name, t in tensors.items():
        _expect(t.device == q.device, f"{name}.device", f"{q.device} (q's)", t.device)


def _validate_cache(kv_cache: torch.Tensor) -> None:
    """The cache's shape, dtype and strides (validate_paged)."""
    _expect(isinstance(kv_cache, torch.Tensor), "kv_cache", "a tensor", type(kv_cache).__name__)
    _expect(
        kv_cache.dim() == 4, "kv_cache.shape", "[num_blocks, page, 1, 576]", tuple(kv_cache.shape)
    )
    num_blocks, page_size, kv_heads, kv_dim = kv_cache.shape
    _expect(num_blocks >= 1, "kv_cache.shape[0]", "at least one block", num_blocks)
    _expect(page_size in PAGE_SIZES, "kv_cache.shape[1] (page size)", PAGE_SIZES, page_size)
    _expect(kv_heads == 1, "kv_cache.shape[2] (KV heads)", 1, kv_heads)
    _expect(kv_dim == QK_HEAD_DIM, "kv_cache.shape[3]", QK_HEAD_DIM, kv_dim)
    _expect(kv_cache.dtype in KV_DTYPES, "kv_cache.dtype", f"one of {KV_DTYPES}", kv_cache.dtype)
    _expect(kv_cache.stride(-1) == 1, "kv_cache.stride(-1)", "1", kv_cache.stride(-1))
    blk, tok = kv_cache.stride(0), kv_cache.stride(1)
    if page_size == 1:
        rows_ok = num_blocks == 1 or blk >= QK_HEAD_DIM
    else:
        rows_ok = tok >= QK_HEAD_DIM and (
            num_blocks == 1 or (blk % tok == 0 and blk >= page_size * tok)
        )
    _expect(
        rows_ok,
        "kv_cache.stride()",
        "token rows >= 576 elements apart, pages a whole number of rows apart, not overlapping",
        kv_cache.stride(),
    )
    slots = pool_layout(kv_cache)[2]
    _expect(slots <= MAX_POOL_SLOTS, "kv_cache", f"at most {MAX_POOL_SLOTS} token rows", slots)


def _validate_table(
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    bs: int | None,
    draft_len: int,
    kv_cache: torch.Tensor,
) -> None:
    """The block table's and the lengths' shapes, dtypes, strides and
    devices, for ``bs`` sequences (q's batch; None: the block table's own)
    of ``draft_len`` drafts in ``kv_cache``."""
    for name, t in (("block_table", block_table), ("cache_seqlens", cache_seqlens)):
        _expect(isinstance(t, torch.Tensor), name, "a tensor", type(t).__name__)
    page_size = kv_cache.shape[1]
    _expect(
        block_table.dim() == 2, "block_table.shape", "[bs, max_blocks]", tuple(block_table.shape)
    )
    if bs is None:
        bs = block_table.shape[0]
    _expect(
        block_table.shape[0] == bs,
        "block_table.shape[0]",
        f"{bs} (q's batch)",
        block_table.shape[0],
    )
    _expect(
        block_table.shape[1] * page_size >= draft_len,
        "block_table.shape[1]",
        f"room for the {draft_len} drafts (>= {-(-draft_len // page_size)} pages)",
        block_table.shape[1],
    )
    _expect(block_table.dtype == torch.int32, "block_table.dtype", torch.int32, block_table.dtype)
    _expect(
        block_table.stride(1) == 1 or block_table.shape[1] == 1,
        "block_table.stride(1)",
        "1",
        block_table.stride(1),
    )
    _expect(
        tuple(cache_seqlens.shape) == (bs,),
        "cache_seqlens.shape",
        (bs,),
        tuple(cache_seqlens.shape),
    )
    _expect(
        cache_seqlens.dtype == torch.int32, "cache_seqlens.dtype", torch.int32, cache_seqlens.dtype
    )
    _expect(
        cache_seqlens.stride(0) == 1 or bs == 1,
        "cache_seqlens.stride(0)",
        "1",
        cache_seqlens.stride(0),
    )
    for name, t in (("block_table", block_table), ("cache_seqlens", cache_seqlens)):
        _expect(
            t.device == kv_cache.device,
            f"{name}.device",
            f"{kv_cache.device} (kv_cache's)",
            t.device,
        )


def check_paged_values(
    kv_cache: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor, draft_len: int
) -> None:
    """Debug mode: the trusted values (synchronises). Lengths in
    L..max_blocks*page; the entries of every used page in 0..num_blocks-1."""
    num_blocks, page_size = kv_cache.shape[0], kv_cache.shape[1]
    max_tokens = block_table.shape[1] * page_size
    lens = cache_seqlens.long()
    lo, hi = int(lens.min()), int(lens.max())
    _expect(
        lo >= draft_len and hi <= max_tokens,
        "cache_seqlens",
        f"values in {draft_len}..{max_tokens} (L .. block_table.shape[1] * page size)",
        f"[{lo}, {hi}]",
    )
    pages = -(-lens // page_size)  # [bs]
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    used = cols[None, :] < pages[:, None]
    entries = block_table.long()[used]
    lo, hi = int(entries.min()), int(entries.max())
    _expect(
        lo >= 0 and hi < num_blocks,
        "block_table",
        f"entries of the used pages in 0..{num_blocks - 1}",
        f"[{lo}, {hi}]",
    )
