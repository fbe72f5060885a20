"""Stage 1 for Hopper (sm90) in Gluon: the same function as
``kernel._prefix_kernel``, with explicit tensor-core layouts and a
warp-specialised gather. Host facts (tile, registers, shares) are in hopper.py.

Tensors are kernel.py's; V is a view of K (MLA; other head dims below), KV
bf16 or fp8 e4m3, q bf16.
Like kernel.py it reads each request's draft count from qo_indptr (rows past
it masked) and, with a custom mask, the draft block's bits in place of the
causal mask, and each prefix tile's bits where they are read.

Why a second kernel: plain Triton gives both warpgroups the whole score tile
and overlaps nothing, which stalls it near a third of the matmul rate.

Each CTA holds 64 query rows (BLOCK_H heads x L drafts). A producer (4 warps)
gathers 64 prefix tokens at a time with cp.async into a two-stage shared
ring, loading the next tile's slot indices a tile ahead. Two warpgroups
consume, in one of two schedules:

    columns      one 8-warp partition: S = Q K^T split by score columns,
                 online softmax, P through shared memory, O += P V with V the
                 same latent tile (MLA), half the output columns a
                 warpgroup. Runs fp8.
    score/value  the score warpgroup computes the whole score tile, the
                 softmax and columns 0-255, and hands P (into the tile's
                 spent rope rows) and the rescale factors to the value
                 warpgroup, which adds P V for columns 256-511 while the
                 score warpgroup moves on. bf16 KV, and fp8 for MLA.

The grid is persistent: each head block gets one wave of CTAs, and the
batch's positions (each request's prefix tiles, then its drafts) are cut on
the device into that many equal ranges (``_share_count``; plan.share_plan
models it on the host). A CTA runs its range request by request; a request
it holds whole is written out, the first and last of its range may be parts,
written as partials that stage 2 merges.

Ragged drafts (a module of its own, RAGGED; the host picks it where q has
fewer than bs x L rows): a request of E < L drafts packs its H E rows
densely, BLOCK_H L a tile (a head's drafts may straddle two tiles), so it
has rows in fewer head blocks; where some request has none in some head
block, every head block cuts shares of one length
(``_head_block_plan``; plan.head_block_plan models it). The requests take
their positions most drafts first (each CTA writes that order into the
workspace: _order_requests), so each head block's requests come first, in
the same order, in every head block: the CTAs of the head blocks that read
one prefix tile read it at about the same time, and the L2 serves all but
the first read (1.05-1.12x on the ragged rows of RESULTS.md).
Calls whose requests all have L drafts compile to code that knows L.

fp8 KV: wgmma takes fp8 only as K-major operands, and V is not K-major in
P V, so each tile is widened to bf16 in shared memory (the consumers' cost).
Columns widens a tile with all 8 warps before its scores. Score/value (MLA)
keeps one bf16 tile beside the fp8 ring and P in a buffer of its own (the
fp8 ring's rope rows cannot hold it): each warpgroup widens its half of the
latent columns (the value warpgroup the rope columns too) once its last
P V is done, and frees its half of the fp8 stage; the scores start on the
score warpgroup's half and finish once the value warpgroup signals its
own (wide_bar). Both load the drafts' rows (bf16) into the tile themselves.

Paged caches (a module of its own, PAGED; verify_mla_paged with pages of 64
or 128 tokens): the pool's slots run page by page, so a full prefix tile
lies in one page, and the producer loads it whole by TMA from its first
token's slot; a prefix's partial last tile is gathered as above (1.02-1.08x
the gathers on the paged rows of RESULTS.md).

Ordinary attention with one shared KV head (q/k = v = 256 or 128, no rope,
V a cache of its own): the same kernel, run as a module of its own for
those head dims (``hopper.gluon_kernel``), on either schedule (fp8 KV on
columns). The producer gathers each tile's V rows into a third ring at the
K rows' slots, the drafts' V beside their K; score/value's rope rows carry
only P. With fp8 KV the columns schedule widens K's and V's rows.

Gluon does not run under Triton's interpreter: CI compiles this kernel ahead
of time and the GPU tests check it against the reference.
"""

from __future__ import annotations

import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import constexpr_function

from . import fp8, hopper, launcher, problem
from .config import COMPILE_OPTIONS

# Triton 3.6 names (the H200's) and their later renames (CI's Triton): a
# barrier among the calling partition's warps, and a cp.async gather.
_warps_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

# The kernels read module constants as constexpr objects (Triton's rule for
# globals); their values and meaning live in hopper.py.
ROWS = gl.constexpr(hopper.ROWS)
TOKENS = gl.constexpr(hopper.TOKENS)
STAGES = gl.constexpr(hopper.STAGES)
CONSUMER_WARPS = gl.constexpr(hopper.CONSUMER_WARPS)
WARPGROUP = gl.constexpr(hopper.WARPGROUP)
PRODUCER_WARPS = gl.constexpr(hopper.PRODUCER_WARPS)
DRAFT_POSITIONS = gl.constexpr(hopper.DRAFT_POSITIONS)
PRODUCER_REGS = gl.constexpr(hopper.PRODUCER_REGS)
VALUE_REGS = gl.constexpr(hopper.VALUE_REGS)
E4M3_TO_BF16_PTX = gl.constexpr(fp8.E4M3_TO_BF16_PTX)

# The head dims this module's kernel computes: absorbed MLA as imported;
# hopper.gluon_kernel(head_dims) runs this source again as a module of its
# own for ordinary attention with one shared KV head (q/k = v, no rope, V a
# cache of its own), with HEAD_DIMS set before it runs. Tile shapes must be
# constants, and a module constant is one in every warp partition, where
# constexpr arguments arrive as runtime values.
HEAD_DIMS = globals().get("HEAD_DIMS", problem.MLA_HEAD_DIMS)
_mla = tuple(HEAD_DIMS) == problem.MLA_HEAD_DIMS
MLA = gl.constexpr(_mla)
# The K columns scored against q's (MLA: the latent ones; its rope columns
# are D_ROPE more), and V's.
D_NOPE = gl.constexpr(problem.D_NOPE if _mla else HEAD_DIMS[0])
D_ROPE = gl.constexpr(problem.D_ROPE if _mla else 0)
D_V = gl.constexpr(HEAD_DIMS[1])
HALF_V = gl.constexpr(HEAD_DIMS[1] // 2)  # output columns a consumer warpgroup
# Whether this module's kernel takes ragged drafts (hopper.gluon_kernel(
# head_dims, ragged)): a request of E < L drafts then packs its rows into
# fewer tiles, and the plan reads the draft counts. A module constant, so
# that calls whose requests all have L drafts compile to code that knows L
# in every partition (a worker partition gets constexpr arguments as
# runtime values).
RAGGED = gl.constexpr(globals().get("RAGGED", False))
# Whether this module's kernel reads a paged cache of 64 or more tokens a
# page (hopper.gluon_kernel(..., paged=True); MLA only): kv_indices then
# hold the slots of its pages' rows, each full prefix tile lies in one
# page, and the producer loads it whole by TMA, from the slot of its first
# token. The last, partial tile of a prefix is gathered as the page-size-1
# pool's are: its rows past the prefix end are zero-filled, not read.
PAGED = gl.constexpr(globals().get("PAGED", False))
# Columns of the second ring and of q's second buffer: MLA's rope rows.
# Score/value hands P over in the ring's (64 x 64, TOKENS wide), so other
# head dims keep the ring for that; their q buffer of it goes unused.
RING_ROPE = gl.constexpr(problem.D_ROPE)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _launch_dependents():
    # PTX griddepcontrol.launch_dependents (Gluon has no wrapper); the
    # dummy output is what inline asm needs to be emitted.
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0",
        "=r",
        [],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def _min_rows(head_block, num_heads, tile_rows):
    # The fewest drafts of a request with rows in head_block (a scalar or
    # a vector of them): a request of E <= L drafts packs its H E rows
    # densely, tile_rows = BLOCK_H L a tile (a head's drafts may straddle
    # two tiles), so a ragged batch's short requests fill fewer tiles
    # (plan.head_block_plan). Head block k > 0 holds rows of it where
    # k tile_rows < H E, that is E > k tile_rows // H.
    return gl.where(head_block == 0, 0, head_block * tile_rows // num_heads + 1)


@gluon.jit
def _divmod_rows(row, num_rows):
    # row // E and row % E for a ragged request's E = num_rows drafts
    # (1 where E = 0), through E's float reciprocal: a division by a
    # runtime integer is a chain of some 20 dependent instructions, and
    # the query staging, the stores and the draft masks take one a row.
    # Exact with a reciprocal 2 ulp off: the product's error, under
    # (row + 1/2) / E 1.5 2^-23, stays below its distance 1 / (2 E) to an
    # integer while row < 2^21 (here row < H L + 64, a few thousand).
    rows = gl.maximum(num_rows, 1)
    quotient = ((row.to(gl.float32) + 0.5) * (1.0 / rows.to(gl.float32))).to(gl.int32)
    return quotient, row - quotient * rows


@gluon.jit
def _row_coords(
    head_block,
    num_heads,
    num_rows,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    layout: gl.constexpr,
):
    # Row m of head block k's tile is (head h, draft i) with
    # h E + i = k BLOCK_H L + m: E = L, or with RAGGED the request's
    # num_rows drafts, its rows packed densely (_min_rows); a head block
    # past the request's rows masks every row.
    tile_rows: gl.constexpr = BLOCK_H * DRAFT_LEN
    offs_m = gl.arange(0, ROWS, layout=layout)
    if RAGGED:
        offs_h, offs_i = _divmod_rows(head_block * tile_rows + offs_m, num_rows)
    else:
        offs_h = head_block * BLOCK_H + offs_m // DRAFT_LEN
        offs_i = offs_m % DRAFT_LEN
    mask_m = (offs_m < tile_rows) & (offs_h < num_heads) & (offs_i < num_rows)
    return offs_h, offs_i, mask_m


@gluon.jit
def _tile_coords(
    head_block,
    num_heads,
    num_rows,
    col0,
    WIDTH: gl.constexpr,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    layout: gl.constexpr,
):
    # _row_coords for a 2-D tile in `layout`, and its columns col0 ..
    # col0 + WIDTH - 1.
    offs_h, offs_i, mask_m = _row_coords(
        head_block, num_heads, num_rows, BLOCK_H, DRAFT_LEN, gl.SliceLayout(1, layout)
    )
    cols = col0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    return offs_h, offs_i, mask_m, cols


@constexpr_function
def _copy_layout(dtype, width, warps):
    # A cp.async layout for rows `width` elements wide: 16-byte copies
    # (8 bf16 or 16 fp8 elements), a warp across as much of a row as it
    # covers.
    vec = 128 // dtype.primitive_bitwidth
    per_row = min(32, width // vec)
    return gl.BlockedLayout([1, vec], [32 // per_row, per_row], [warps, 1], [1, 0])


@gluon.jit
def _copy_q(
    dst,
    q_args,
    request,
    head_block,
    num_heads,
    col0,
    WIDTH: gl.constexpr,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    WARPS: gl.constexpr,
):
    # Query columns col0 .. col0 + WIDTH - 1 of a segment's rows into dst
    # by cp.async; rows past the request or the heads are zero-filled.
    Q, stride_q_tok, stride_q_head = q_args
    layout: gl.constexpr = _copy_layout(Q.dtype.element_ty, WIDTH, WARPS)
    q_first, num_rows, _, _, _ = request
    offs_h, offs_i, mask_m, cols = _tile_coords(
        head_block, num_heads, num_rows, col0, WIDTH, BLOCK_H, DRAFT_LEN, layout
    )
    rows = (q_first + offs_i).to(gl.int64) * stride_q_tok + offs_h * stride_q_head
    _cp_async(dst, Q + rows[:, None] + cols[None, :], mask=mask_m[:, None])


@gluon.jit
def _tokens(first, layout: gl.constexpr):
    # Tokens first .. first + 63, one per row of a tile laid out as layout.
    return first + gl.arange(0, TOKENS, layout=gl.SliceLayout(1, layout))


@gluon.jit
def _slots(KV_INDICES, first, end, layout: gl.constexpr):
    # The pool slots of prefix tokens first .. first + 63 (0 past end),
    # in int32 whatever the index dtype: the producer holds two tiles'
    # slots in its 88 registers, and int64 ones spilled (20-25% slower).
    # A pool has fewer than 2^31 rows (the gate checks).
    offs = _tokens(first, layout)
    return gl.load(KV_INDICES + offs, mask=offs < end, other=0).to(gl.int32)


@gluon.jit
def _gather(dst, BASE, rows, mask, stride_row, col0, WIDTH: gl.constexpr, layout: gl.constexpr):
    # One cp.async per buffer: 64 latent rows (scattered), columns
    # col0 .. col0 + WIDTH; masked rows are zero-filled.
    cols = col0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    ptrs = BASE + rows.to(gl.int64)[:, None] * stride_row + cols[None, :]
    _cp_async(dst, ptrs, mask=mask[:, None])


@gluon.jit
def _gather_tile(
    nope, rope, BASE, nope_rows, rope_rows, first, end, stride_row, WITH_ROPE: gl.constexpr
):
    # Tokens first .. end - 1 of one tile, at rows nope_rows / rope_rows
    # of BASE (laid out as _copy_layout).
    nope_layout: gl.constexpr = _copy_layout(BASE.dtype.element_ty, D_NOPE, PRODUCER_WARPS)
    mask = _tokens(first, nope_layout) < end
    _gather(nope, BASE, nope_rows, mask, stride_row, 0, D_NOPE, nope_layout)
    if WITH_ROPE and D_ROPE > 0:
        rope_layout: gl.constexpr = _copy_layout(BASE.dtype.element_ty, D_ROPE, PRODUCER_WARPS)
        mask = _tokens(first, rope_layout) < end
        _gather(rope, BASE, rope_rows, mask, stride_row, D_NOPE, D_ROPE, rope_layout)


@gluon.jit
def _page_slot(KV_INDICES, first, end):
    # PAGED: the slot of the first token of the tile at `first`, where
    # that tile is full (then its page's rows from there on are the
    # tile); 0 where it is not (it is gathered).
    return gl.load(KV_INDICES + first, mask=first + TOKENS <= end, other=0).to(gl.int32)


@gluon.jit
def _load_page_tile(nope, rope, pages, slot, bar):
    # PAGED: a full tile, TOKENS rows of one page from `slot` on, in bulk
    # (TMA). The expect is one of the ready barrier's PRODUCER_WARPS * 32
    # arrivals and sets the bytes to wait for; one arrive makes the rest.
    nope_desc, rope_desc = pages
    mbarrier.expect(bar, TOKENS * (D_NOPE + D_ROPE) * nope.dtype.primitive_bitwidth // 8)
    _tma_load(nope_desc, [slot, 0], bar, nope)
    _tma_load(rope_desc, [slot, 0], bar, rope)
    mbarrier.arrive(bar, count=PRODUCER_WARPS * 32 - 1)


@gluon.jit
def _gather_drafts(nope, rope, BASE, request, stride_tok, WITH_ROPE: gl.constexpr):
    # The drafts' own rows of k_extend / v_extend.
    q_first, num_rows, _, _, _ = request
    nope_layout: gl.constexpr = _copy_layout(BASE.dtype.element_ty, D_NOPE, PRODUCER_WARPS)
    rope_layout: gl.constexpr = _copy_layout(BASE.dtype.element_ty, RING_ROPE, PRODUCER_WARPS)
    _gather_tile(
        nope,
        rope,
        BASE,
        _tokens(q_first, nope_layout),
        _tokens(q_first, rope_layout),
        q_first,
        q_first + num_rows,
        stride_tok,
        WITH_ROPE,
    )


@gluon.jit
def _gather_values(dst, V_BUF, rows, first, end, stride_row):
    # A tile's V rows from a V cache of its own (ordinary attention), at
    # the K gather's rows (laid out as _copy_layout for D_V columns).
    layout: gl.constexpr = _copy_layout(V_BUF.dtype.element_ty, D_V, PRODUCER_WARPS)
    _gather(dst, V_BUF, rows, _tokens(first, layout) < end, stride_row, 0, D_V, layout)


@gluon.jit
def _positions(
    share_block,
    start,
    batch_size,
    drafts,
    BLOCK_B: gl.constexpr,
    layout: gl.constexpr,
):
    # Positions of the requests at places start .. start + BLOCK_B - 1 of
    # the head block (_request_positions): in index order, or with RAGGED
    # the requests ORDER lists there.
    KV_INDPTR, QO_INDPTR, min_rows, ORDER, _ = share_block
    offs = start + gl.arange(0, BLOCK_B, layout=layout)
    mask = offs < batch_size
    if RAGGED:
        offs = gl.load(ORDER + offs, mask=mask, other=0).to(gl.int32)
    return _request_positions(KV_INDPTR, QO_INDPTR, offs, mask, min_rows, drafts)


@gluon.jit
def _share(share_block, batch_size, drafts, s0, s1, BLOCK_B: gl.constexpr, layout: gl.constexpr):
    # A CTA's share, positions s0 .. s1 - 1 of the head block: the first
    # request with work in it (its drafts' first position at s0 or later),
    # the one that holds position s1 - 1, and where the first one's
    # positions begin. b1 < b0: the range holds drafts' later positions
    # alone, and nothing to do. Requests with no heads in the head block
    # hold no positions: neither b0 nor b1 is one.
    b0 = 0
    base0 = 0
    b1 = 0
    done = 0
    for start in range(0, batch_size, BLOCK_B):
        positions = _positions(share_block, start, batch_size, drafts, BLOCK_B, layout)
        ends = done + gl.associative_scan(positions, 0, _add)
        before = ends - drafts < s0
        b0 += gl.sum(before.to(gl.int32), 0)
        base0 += gl.sum(gl.where(before, positions, 0), 0)
        b1 += gl.sum((ends < s1).to(gl.int32), 0)
        done += gl.sum(positions, 0)
    return (share_block, b0, b1, base0, s0, s1, drafts)


@gluon.jit
def _request_positions(KV_INDPTR, QO_INDPTR, offs, mask, min_rows, drafts):
    # Positions of requests offs (0 where not mask, and for a request
    # with fewer than min_rows drafts: no rows in the head block): one
    # per prefix tile, and `drafts` for the drafts.
    lens = gl.load(KV_INDPTR + offs + 1, mask=mask, other=0) - gl.load(
        KV_INDPTR + offs, mask=mask, other=0
    )
    if RAGGED:
        rows = gl.load(QO_INDPTR + offs + 1, mask=mask, other=0) - gl.load(
            QO_INDPTR + offs, mask=mask, other=0
        )
        mask &= rows.to(gl.int32) >= min_rows
    return gl.where(mask, (lens.to(gl.int32) + TOKENS - 1) // TOKENS + drafts, 0)


@gluon.jit
def _draft_counts(
    QO_INDPTR,
    start,
    batch_size,
    BLOCK_B: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    layout: gl.constexpr,
):
    # Draft counts of requests start .. start + BLOCK_B - 1 (L past the
    # batch).
    offs = start + gl.arange(0, BLOCK_B, layout=layout)
    mask = offs < batch_size
    rows = gl.load(QO_INDPTR + offs + 1, mask=mask, other=0) - gl.load(
        QO_INDPTR + offs, mask=mask, other=0
    )
    return gl.where(mask, rows.to(gl.int32), DRAFT_LEN)


@constexpr_function
def _count_classes(draft_len):
    # Draft counts 0 .. draft_len, a power of two of them.
    return 1 << int(draft_len).bit_length()


@constexpr_function
def _order_chunk(classes):
    # Requests _order_requests reads a step (hopper.ORDER_REQUESTS, fewer
    # where the tile would pass PLAN_ELEMENTS).
    return min(hopper.ORDER_REQUESTS, hopper.PLAN_ELEMENTS // int(classes))


@gluon.jit
def _order_requests(
    QO_INDPTR,
    ORDER,
    batch_size,
    DRAFT_LEN: gl.constexpr,
    WARPS: gl.constexpr,
):
    # ORDER[i] = the request at place i of plan.ragged_order, most drafts
    # first, then by index: request b's place is the number of requests
    # with more drafts plus that of the requests before b with as many.
    # One pass counts the requests with more drafts than each count, one
    # places the requests (a count of -1 past the batch matches none). Sums
    # carried as tiles, reduced in the loop: triton 3.6 fails to lower a
    # loop that carries a reduction's result vector.
    CLASSES: gl.constexpr = _count_classes(DRAFT_LEN)
    CHUNK: gl.constexpr = _order_chunk(CLASSES)
    layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, WARPS], [1, 0])
    request_layout: gl.constexpr = gl.SliceLayout(0, layout)
    classes = gl.arange(0, CLASSES, layout=gl.SliceLayout(1, layout))
    # Requests with more than e drafts, for each count e.
    more = gl.zeros([CLASSES, CHUNK], gl.int32, layout=layout)
    for start in range(0, batch_size, CHUNK):
        rows = _draft_counts(QO_INDPTR, start, batch_size, CHUNK, -1, request_layout)
        more += (rows[None, :] > classes[:, None]).to(gl.int32)
    more = gl.sum(more, 1)
    seen = gl.zeros([CLASSES, CHUNK], gl.int32, layout=layout)
    for start in range(0, batch_size, CHUNK):
        offs = start + gl.arange(0, CHUNK, layout=request_layout)
        rows = _draft_counts(QO_INDPTR, start, batch_size, CHUNK, -1, request_layout)
        same = (rows[None, :] == classes[:, None]).to(gl.int32)
        before = gl.associative_scan(same, 1, _add) - same + gl.sum(seen, 1)[:, None]
        place = gl.sum(same * (more[:, None] + before), 0)
        gl.store(ORDER + place, offs, mask=offs < batch_size)
        seen += same


@gluon.jit
def _share_len(positions, first_positions, grid_ctas, head_blocks, batch_size, min_share):
    # The aligned plan's share length (kernel._share_len, the same rule;
    # plan.head_block_plan): the least that fits every head block's shares
    # in the grid, at least min_share, and no shorter than the cap of
    # 1 + 4 sqrt(P) shares a request (_share_count) allows the first head
    # block, which holds every request.
    spare = gl.maximum(grid_ctas - head_blocks, 1)
    fit = gl.where(grid_ctas > head_blocks, (positions + spare - 1) // spare, first_positions)
    cap = (4.0 * gl.sqrt_rn(first_positions.to(gl.float32) * batch_size)).to(gl.int32)
    cap += batch_size
    return gl.maximum(gl.maximum(fit, min_share), (first_positions + cap - 1) // cap)


@gluon.jit
def _head_block_plan(
    share_block,
    batch_size,
    grid_cta,
    grid_ctas,
    head_blocks,
    drafts,
    min_share,
    BLOCK_B: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    WARPS: gl.constexpr,
):
    # The aligned plan (plan.head_block_plan models it), where some
    # request has no heads in some head block: every head block cuts
    # shares of one length (_share_len), share c its positions c S ..
    # (c + 1) S - 1, and takes as many CTAs as it has shares, one head
    # block after another. Its positions: its requests' prefix tiles plus
    # `drafts` each, in ORDER (most drafts first), so that a request's
    # tile t is at one position in every head block that holds it, and
    # the CTAs reading it do so at about the same time (the L2 serves the
    # later reads). Returns grid CTA grid_cta's head block, that head
    # block's first CTA, CTA count and positions, and the share length.
    # One pass over the batch for every head block at once (HEAD_BLOCKS
    # >= head_blocks, a power of two); no scan nor layout change (either
    # left the consumers' loop spilling: 1.2x slower).
    KV_INDPTR, QO_INDPTR, num_heads, tile_rows = share_block
    layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, WARPS], [1, 0])
    block_layout: gl.constexpr = gl.SliceLayout(1, layout)
    request_layout: gl.constexpr = gl.SliceLayout(0, layout)
    blocks = gl.arange(0, HEAD_BLOCKS, layout=block_layout)
    min_rows = _min_rows(blocks, num_heads, tile_rows)
    # Sums carried as a tile, reduced after the loop: triton 3.6 fails to
    # lower a loop that carries a slice of a tile's layout.
    total = gl.zeros([HEAD_BLOCKS, BLOCK_B], gl.int32, layout=layout)
    for start in range(0, batch_size, BLOCK_B):
        offs = start + gl.arange(0, BLOCK_B, layout=request_layout)
        mask = offs < batch_size
        lens = gl.load(KV_INDPTR + offs + 1, mask=mask, other=0) - gl.load(
            KV_INDPTR + offs, mask=mask, other=0
        )
        rows = gl.load(QO_INDPTR + offs + 1, mask=mask, other=0) - gl.load(
            QO_INDPTR + offs, mask=mask, other=0
        )
        inside = (
            (rows.to(gl.int32)[None, :] >= min_rows[:, None])
            & (blocks < head_blocks)[:, None]
            & mask[None, :]
        )
        tiles = (lens.to(gl.int32) + TOKENS - 1) // TOKENS
        total += gl.where(inside, (tiles + drafts)[None, :], 0)
    total = gl.sum(total, 1)
    first_positions = gl.sum(gl.where(blocks == 0, total, 0), 0)
    share_len = _share_len(
        gl.sum(total, 0), first_positions, grid_ctas, head_blocks, batch_size, min_share
    )
    used = (total + share_len - 1) // share_len
    # Head block k begins at the CTAs the ones before use; grid_cta works
    # for the last that begins at or before it (past every share: idle).
    mine = 0
    for k in gl.static_range(1, HEAD_BLOCKS):
        first = gl.sum(gl.where(blocks < k, used, 0), 0)
        mine += ((first <= grid_cta) & (k < head_blocks)).to(gl.int32)
    here = blocks == mine
    return (
        mine,
        gl.sum(gl.where(blocks < mine, used, 0), 0),
        gl.sum(gl.where(here, used, 0), 0),
        gl.sum(gl.where(here, total, 0), 0),
        share_len,
    )


@gluon.jit
def _share_count(grid_ctas, total, uniform, batch_size, min_share):
    # The batch's shares (module docstring): one a CTA, of min_share
    # positions at least; where every request holds as many positions
    # (`uniform`), a multiple or a divisor of the batch size that costs
    # at most a sixteenth of them, so that no share holds part of a
    # request. kernel._share_count is the same rule for stage 2.
    ctas = gl.minimum(grid_ctas, (total + min_share - 1) // min_share)
    # No more than 1 + 4 sqrt(P) shares a request of P positions, on
    # average: beyond that, a merge of more partials costs more than
    # shorter shares save (floor 2 is 1.27x floor 4 on
    # one 2K request, 0.93x on one 16K request).
    work = total.to(gl.float32) * batch_size
    ctas = gl.minimum(ctas, (4.0 * gl.sqrt_rn(work)).to(gl.int32) + batch_size)
    aligned = ctas
    if uniform:
        if ctas >= batch_size:
            aligned = ctas - ctas % batch_size
        else:
            group = (batch_size + ctas - 1) // ctas
            if batch_size % group == 0:
                aligned = batch_size // group
    if aligned * 16 >= ctas * 15:
        ctas = aligned
    return ctas


@gluon.jit
def _segment(share, b, base):
    # Request b's part of this CTA's share (positions base .. of the
    # batch are b's): its prefix tokens lo .. hi - 1, whether the
    # drafts' first position is in it, whether it is the whole request,
    # the request (first query row, draft count, prefix length, index,
    # and the draft its tile's row 0 holds: _drafts_of_rows), and where
    # the next request's positions begin. A request with no rows in the
    # head block holds no positions: an empty segment, all of whose rows
    # are masked.
    share_block, _, _, _, s0, s1, drafts = share
    KV_INDPTR, QO_INDPTR, min_rows, ORDER, first_row = share_block
    if RAGGED:  # b counts requests in ORDER
        b = gl.load(ORDER + b).to(gl.int32)
    kv_start = gl.load(KV_INDPTR + b)
    kv_len = (gl.load(KV_INDPTR + b + 1) - kv_start).to(gl.int32)
    # Ragged drafts: the counts are read here, on the device (q holds
    # every request's rows back to back).
    q_first = gl.load(QO_INDPTR + b)
    num_rows = (gl.load(QO_INDPTR + b + 1) - q_first).to(gl.int32)
    tiles = (kv_len + TOKENS - 1) // TOKENS
    phase = 0
    if RAGGED:
        present = num_rows >= min_rows
        tiles = gl.where(present, tiles, 0)
        drafts = gl.where(present, drafts, 0)
        phase = first_row % gl.maximum(num_rows, 1)
    j_lo = gl.maximum(s0 - base, 0)
    j_hi = gl.minimum(tiles + drafts, s1 - base)
    hi = gl.minimum(j_hi * TOKENS, kv_len)
    lo = gl.minimum(j_lo * TOKENS, hi)
    with_drafts = (j_lo <= tiles) & (j_hi > tiles)
    whole = (j_lo == 0) & with_drafts
    request = (q_first, num_rows, kv_len, b, phase)
    return kv_start, lo, hi, with_drafts, whole, request, base + tiles + drafts


@gluon.jit
def _dest(out_args, b, b0, whole, request):
    # Where a segment's results go (_store_out, _store_lse): the output
    # for a whole request, else the CTA's slot for its first segment
    # (2 cta) or its last (2 cta + 1); any other is whole.
    O, stride_o_tok, stride_o_head, PART_O, PART_LSE, cta, head_block, num_heads = out_args
    slot = 2 * cta + (b != b0).to(gl.int32)
    return (
        whole,
        O,
        stride_o_tok,
        stride_o_head,
        PART_O,
        PART_LSE,
        request,
        slot,
        head_block,
        num_heads,
    )


@gluon.jit
def _issue_q(
    q_nope,
    q_rope,
    q_args,
    request,
    out_args,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    WARPS: gl.constexpr,
):
    # A segment's query rows into shared memory by cp.async, issued by
    # the warps that read them once all of them are done with the
    # previous segment's (its last scores): they land while the rest of
    # that segment runs, not on the critical path (_await_q waits).
    # Loaded through registers once the previous segment was stored,
    # they left the ring stalled for three round trips a request.
    _, _, _, _, _, _, head_block, num_heads = out_args
    _warps_barrier()
    # One copy a buffer: copies into column slices of one buffer add a
    # CTA barrier between them.
    _copy_q(q_nope, q_args, request, head_block, num_heads, 0, D_NOPE, BLOCK_H, DRAFT_LEN, WARPS)
    if D_ROPE > 0:
        _copy_q(
            q_rope,
            q_args,
            request,
            head_block,
            num_heads,
            D_NOPE,
            D_ROPE,
            BLOCK_H,
            DRAFT_LEN,
            WARPS,
        )
    async_copy.commit_group()


@gluon.jit
def _await_q():
    # The query rows _issue_q sent have landed, for wgmma (async proxy)
    # to read, in every warp of the partition.
    async_copy.wait_group(0)
    fence_async_shared()
    _warps_barrier()


@gluon.jit
def _stage_next(
    next_segment,
    b,
    b1,
    q_nope,
    q_rope,
    q_args,
    out_args,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    WARPS: gl.constexpr,
):
    # After request b's last scores (b0 - 1: before the first): the next
    # request's query rows, if the share holds one.
    if b < b1:
        _issue_q(q_nope, q_rope, q_args, next_segment[5], out_args, BLOCK_H, DRAFT_LEN, WARPS)


# The helpers below branch on V_EXT_FROM_K with `if`, never in Python:
# a worker partition receives its constexpr arguments as runtime values.
@gluon.jit
def _after_drafts(t, V_EXT_FROM_K: gl.constexpr):
    # The ring position after a request's drafts at tile t: their K
    # tile, then their V tile unless it is a view of K.
    if V_EXT_FROM_K:
        t += 1
    else:
        t += 2
    return t


@gluon.jit
def _release_drafts(empty, t, V_EXT_FROM_K: gl.constexpr):
    # The drafts' ring tiles (from tile t) are free.
    mbarrier.arrive(empty.index(t % STAGES), count=1)
    if not V_EXT_FROM_K:
        mbarrier.arrive(empty.index((t + 1) % STAGES), count=1)


@gluon.jit
def _produce_drafts(
    ext,
    kv_nope_ring,
    kv_rope_ring,
    v_ring,
    ready,
    empty,
    t,
    request,
    V_EXT_FROM_K: gl.constexpr,
):
    # Tile t: the drafts' K; then their V unless it is K's view. With a V
    # ring (not MLA), their V rows go beside K's in tile t (the host then
    # passes V_EXT_FROM_K: the drafts take one tile).
    K_EXT, V_EXT, stride_ke_tok, stride_ve_tok = ext
    stage = t % STAGES
    mbarrier.wait(empty.index(stage), ((t // STAGES) & 1) ^ 1)
    _gather_drafts(
        kv_nope_ring.index(stage),
        kv_rope_ring.index(stage),
        K_EXT,
        request,
        stride_ke_tok,
        True,
    )
    if not MLA:
        q_first, num_rows, _, _, _ = request
        v_layout: gl.constexpr = _copy_layout(V_EXT.dtype.element_ty, D_V, PRODUCER_WARPS)
        rows = _tokens(q_first, v_layout)
        _gather_values(v_ring.index(stage), V_EXT, rows, q_first, q_first + num_rows, stride_ve_tok)
    async_copy.mbarrier_arrive(ready.index(stage), increment_count=False)
    if not V_EXT_FROM_K:
        stage = (t + 1) % STAGES
        mbarrier.wait(empty.index(stage), (((t + 1) // STAGES) & 1) ^ 1)
        _gather_drafts(
            kv_nope_ring.index(stage),
            kv_rope_ring.index(stage),
            V_EXT,
            request,
            stride_ve_tok,
            False,
        )
        async_copy.mbarrier_arrive(ready.index(stage), increment_count=False)


@gluon.jit
def _produce(
    share,
    K_BUF,
    V_BUF,
    KV_INDICES,
    stride_k_slot,
    stride_v_slot,
    ext,
    kv_nope_ring,
    kv_rope_ring,
    v_ring,
    ready,
    empty,
    pages,
    V_EXT_FROM_K: gl.constexpr,
):
    # The ring runs on across the share's segments: while the consumers
    # finish one request, the next one's first tiles arrive. Without rope
    # columns (not MLA) the rope rows are the K rows' slots (never used)
    # and V's rows are gathered into the V ring at the same slots.
    # A warp partition gets its arguments as values, constexprs too: read
    # from the pool's type, KV_FP8 stays a constant, and the bf16-only
    # branch below is not built for an fp8 ring (Gluon 3.7 cannot lower it).
    KV_FP8: gl.constexpr = K_BUF.dtype.element_ty == gl.float8e4nv
    nope_layout: gl.constexpr = _copy_layout(K_BUF.dtype.element_ty, D_NOPE, PRODUCER_WARPS)
    rope_layout: gl.constexpr = _copy_layout(K_BUF.dtype.element_ty, RING_ROPE, PRODUCER_WARPS)
    _, b0, b1, base, _, _, _ = share
    t0 = 0  # ring tiles of the earlier segments
    for b in range(b0, b1 + 1):
        kv_start, lo, hi, with_drafts, whole, request, base = _segment(share, b, base)
        end = kv_start + hi
        if PAGED:
            page_slot = _page_slot(KV_INDICES, kv_start + lo, end)
        else:
            nope_rows = _slots(KV_INDICES, kv_start + lo, end, nope_layout)
            if D_ROPE > 0:  # noqa: SIM108 (constexpr: one branch is compiled)
                rope_rows = _slots(KV_INDICES, kv_start + lo, end, rope_layout)
            else:
                rope_rows = nope_rows
        prefix_tiles = (hi - lo + TOKENS - 1) // TOKENS
        for t in range(prefix_tiles):
            tile = t0 + t
            stage = tile % STAGES
            first = kv_start + lo + t * TOKENS
            # The next tile's slots, loaded before the wait: their latency
            # hides behind it and this tile's copies. Loaded after the wait,
            # they kept the ring from refilling in time (3-14% slower).
            if PAGED:
                next_page_slot = _page_slot(KV_INDICES, first + TOKENS, end)
            else:
                next_nope_rows = _slots(KV_INDICES, first + TOKENS, end, nope_layout)
                if D_ROPE > 0:  # noqa: SIM108 (constexpr: one branch is compiled)
                    next_rope_rows = _slots(KV_INDICES, first + TOKENS, end, rope_layout)
                else:
                    next_rope_rows = next_nope_rows
            # A fresh mbarrier counts as having completed phase 1: the first
            # pass over the ring does not wait.
            mbarrier.wait(empty.index(stage), ((tile // STAGES) & 1) ^ 1)
            if PAGED:
                if first + TOKENS <= end:
                    _load_page_tile(
                        kv_nope_ring.index(stage),
                        kv_rope_ring.index(stage),
                        pages,
                        page_slot,
                        ready.index(stage),
                    )
                else:
                    _gather_tile(
                        kv_nope_ring.index(stage),
                        kv_rope_ring.index(stage),
                        K_BUF,
                        _slots(KV_INDICES, first, end, nope_layout),
                        _slots(KV_INDICES, first, end, rope_layout),
                        first,
                        end,
                        stride_k_slot,
                        True,
                    )
                    async_copy.mbarrier_arrive(ready.index(stage), increment_count=False)
                page_slot = next_page_slot
            else:
                _gather_tile(
                    kv_nope_ring.index(stage),
                    kv_rope_ring.index(stage),
                    K_BUF,
                    nope_rows,
                    rope_rows,
                    first,
                    end,
                    stride_k_slot,
                    True,
                )
                if not MLA:
                    _gather_values(v_ring.index(stage), V_BUF, nope_rows, first, end, stride_v_slot)
                nope_rows = next_nope_rows
                rope_rows = next_rope_rows
                # Each producer thread arrives once its own copies have landed.
                async_copy.mbarrier_arrive(ready.index(stage), increment_count=False)
        t0 += prefix_tiles

        # The drafts are bf16: with fp8 KV the consumers load them
        # (_consume_loaded_drafts), and this code is not compiled for the
        # fp8 ring.
        if not KV_FP8:  # noqa: SIM102 (constexpr: not compiled for fp8)
            if with_drafts:
                _produce_drafts(
                    ext,
                    kv_nope_ring,
                    kv_rope_ring,
                    v_ring,
                    ready,
                    empty,
                    t0,
                    request,
                    V_EXT_FROM_K,
                )
                t0 = _after_drafts(t0, V_EXT_FROM_K)


@gluon.jit
def _scores(q_nope, q_rope, kv_nope, kv_rope, zero_s):
    # The caller has fenced the tile's writes (generic proxy) for wgmma
    # (async proxy).
    # One chain of wgmma, waited once.
    qk = warpgroup_mma(q_nope, kv_nope.permute((1, 0)), zero_s, use_acc=False, is_async=True)
    if D_ROPE > 0:
        qk = warpgroup_mma(q_rope, kv_rope.permute((1, 0)), qk, is_async=True)
    return warpgroup_mma_wait(0, deps=[qk])


@gluon.jit
def _tile_scores(q_nope, q_rope, kv_nope_ring, kv_rope_ring, ready, t, zero_s):
    # Waits for tile t of the ring, then its scores.
    stage = t % STAGES
    mbarrier.wait(ready.index(stage), (t // STAGES) & 1)
    fence_async_shared()  # the gathers wrote through the generic proxy
    return _scores(q_nope, q_rope, kv_nope_ring.index(stage), kv_rope_ring.index(stage), zero_s)


@gluon.jit
def _online_softmax(qk, scale, m_i, MASKED: gl.constexpr):
    # One tile of raw scores (-inf where masked) and their log2-domain
    # scale: P, the factor that rescales the earlier tiles' sums and
    # outputs, and the new running max (scaled). The scale goes into
    # one fma with the max (scale > 0, so it commutes with the max).
    # MASKED: a mask may hide every key a row has seen so far; such a
    # row keeps max -inf and shifts by 0, not NaN.
    m_new = gl.maximum(m_i, gl.max(qk, 1) * scale)
    shift = m_new
    if MASKED:
        shift = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(qk * scale - shift[:, None])
    return p, gl.exp2(m_i - shift), m_new


@gluon.jit
def _mask_tail(qk, first, hi):
    # Keys first .. first + 63 of a prefix tile: those at or past hi are
    # masked (-inf). Only a segment's last tile can have any, so the
    # others skip the select.
    if first + TOKENS > hi:
        layout: gl.constexpr = qk.type.layout
        keys = first + gl.arange(0, TOKENS, layout=gl.SliceLayout(0, layout))
        qk = gl.where((keys < hi)[None, :], qk, float("-inf"))
    return qk


@gluon.jit
def _drafts_of_rows(request, DRAFT_LEN: gl.constexpr, layout: gl.constexpr):
    # The draft each tile row holds (_row_coords: row m of head block k is
    # draft (k BLOCK_H L + m) % E of its head; the request's phase is the
    # draft of row 0).
    _, num_rows, _, _, phase = request
    offs_m = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    if RAGGED:
        _, offs_i = _divmod_rows(phase + offs_m, num_rows)
    else:
        offs_i = offs_m % DRAFT_LEN
    return offs_i


@gluon.jit
def _mask_rows(masks, request, DRAFT_LEN: gl.constexpr, layout: gl.constexpr):
    # Where each tile row's mask bits begin (kernel.py's layout): row
    # (h, i) of request b reads MASK[mask_indptr[b] + i * (P_b + E_b) + j],
    # its P_b prefix keys first, then its E_b drafts.
    _, MASK_INDPTR = masks
    _, num_rows, kv_len, b, _ = request
    offs_i = _drafts_of_rows(request, DRAFT_LEN, layout)
    return gl.load(MASK_INDPTR + b).to(gl.int64) + offs_i.to(gl.int64) * (kv_len + num_rows)


@gluon.jit
def _mask_bits(masks, rows, request, key0, key_end, DRAFT_LEN: gl.constexpr, layout: gl.constexpr):
    # The mask bits of keys key0 .. key0 + 63 (those before key_end) of
    # every tile row, from its start `rows` (_mask_rows); 0 elsewhere.
    MASK, _ = masks
    _, num_rows, _, _, _ = request
    offs_i = _drafts_of_rows(request, DRAFT_LEN, layout)
    keys = key0 + gl.arange(0, TOKENS, layout=gl.SliceLayout(0, layout))
    seen = (offs_i < num_rows)[:, None] & (keys < key_end)[None, :]
    return gl.load(MASK + rows[:, None] + keys[None, :], mask=seen, other=0)


@gluon.jit
def _mask_drafts(qk, masks, request, DRAFT_LEN: gl.constexpr, DRAFT_MASK: gl.constexpr):
    # The drafts' tile: row (h, i) sees drafts 0..i, or those its mask
    # bits show (DRAFT_MASK).
    layout: gl.constexpr = qk.type.layout
    _, num_rows, kv_len, _, _ = request
    if DRAFT_MASK:
        rows = _mask_rows(masks, request, DRAFT_LEN, layout) + kv_len
        visible = _mask_bits(masks, rows, request, 0, num_rows, DRAFT_LEN, layout) != 0
    else:
        draft_of_row = _drafts_of_rows(request, DRAFT_LEN, layout)
        draft = gl.arange(0, TOKENS, layout=gl.SliceLayout(0, layout))
        visible = draft[None, :] <= draft_of_row[:, None]
    return gl.where(visible, qk, float("-inf"))


@gluon.jit
def _row_sums(l_i, MASKED: gl.constexpr):
    # The divisor of each row's output: a row a mask hid every key from
    # has sum 0 and output 0 (and lse -inf).
    if MASKED:
        l_i = gl.where(l_i > 0.0, l_i, 1.0)
    return l_i


@gluon.jit
def _softmax_step(qk, scale, m_i, l_elem, acc, o_rows: gl.constexpr, MASKED: gl.constexpr):
    # Columns: returns P and the rescaled state.
    p, alpha, m_i = _online_softmax(qk, scale, m_i, MASKED)
    l_elem = l_elem * alpha[:, None] + p
    acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
    return p, m_i, l_elem, acc


@gluon.jit
def _add_pv(p, p_smem, v, acc):
    # Both warpgroups' halves of P, then O += P V for all 64 keys.
    p_smem.store(p.to(gl.bfloat16))
    fence_async_shared()
    _warps_barrier()
    acc = warpgroup_mma(p_smem, v, acc)
    # Every consumer warp is done with the stage (and with P).
    _warps_barrier()
    return acc


@gluon.jit
def fp8_to_bf16(x):
    # e4m3 -> bf16 with integer ops, four values a step (fp8.py); the cvt
    # route (e4m3 -> f16 -> bf16) runs on the slow conversion pipe.
    return gl.inline_asm_elementwise(
        E4M3_TO_BF16_PTX,
        "=r,=r,r",
        [x.to(gl.uint8, bitcast=True)],
        dtype=gl.bfloat16,
        is_pure=True,
        pack=4,
    )


@gluon.jit
def _widen(fp8_nope, fp8_second, nope, second):
    # fp8 tile -> bf16 tile, shared by both warpgroups: K's scored
    # columns, and the rope columns (MLA) or the V rows (other head
    # dims) in `second`. A warp moves 8
    # rows x 32 columns a step: its 16-byte stores cover all banks of the
    # 128-byte swizzle. Whole-tile loads and stores: with slices of these
    # buffers Triton puts a CTA barrier between each slice's load and
    # store (8-11% slower end to end, measured).
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [CONSUMER_WARPS, 1], [1, 0])
    nope.store(fp8_to_bf16(fp8_nope.load(layout)))
    second.store(fp8_to_bf16(fp8_second.load(layout)))
    # Both warpgroups' rows, visible to wgmma (the async proxy).
    fence_async_shared()
    _warps_barrier()


# Score/value with fp8 KV loads a request's draft rows (bf16) into the
# widened tile DRAFT_PIECE columns at a time: a warpgroup's whole half at
# once would hold 64 registers a thread, more than the value warpgroup
# has beside its half of the output.
DRAFT_PIECE = gl.constexpr(64)


@gluon.jit
def _widen_columns(src, dst):
    # Score/value, fp8 KV: one warpgroup widens its columns of an fp8
    # ring stage (src) into the bf16 tile (dst), all of them in one load,
    # so that every shared-memory read is in flight at once: in pieces
    # of 64 columns, with a barrier between pieces, the read latency
    # showed four times a tile (score/value took 0.90x the columns
    # schedule's time on fp8 rows that way, 0.82x this way). The caller
    # fences and waits for its warps before the tile is read.
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [WARPGROUP, 1], [1, 0])
    dst.store(fp8_to_bf16(src.load(layout)))


@gluon.jit
def _widened_scores(q_nope, q_rope, wide, wide_bar, fill, zero_s):
    # Score/value, fp8 KV: S = Q K^T over the bf16 tile, first its latent
    # columns 0 .. HALF_V - 1 (the score warpgroup widened them), then,
    # once the value warpgroup has widened the rest (wide_bar, fill-th
    # completion), the others and the rope columns.
    wide_nope, wide_rope, _ = wide
    left = wide_nope.slice(0, HALF_V, dim=1).permute((1, 0))
    right = wide_nope.slice(HALF_V, HALF_V, dim=1).permute((1, 0))
    q_left = q_nope.slice(0, HALF_V, dim=1)
    q_right = q_nope.slice(HALF_V, HALF_V, dim=1)
    qk = warpgroup_mma(q_left, left, zero_s, use_acc=False, is_async=True)
    mbarrier.wait(wide_bar, fill & 1)
    qk = warpgroup_mma(q_right, right, qk, is_async=True)
    qk = warpgroup_mma(q_rope, wide_rope.permute((1, 0)), qk, is_async=True)
    return warpgroup_mma_wait(0, deps=[qk])


@gluon.jit
def _consume_drafts(
    q_nope,
    q_rope,
    kv_nope_ring,
    kv_rope_ring,
    v_ring,
    p_smem,
    ready,
    empty,
    t,
    masks,
    request,
    draft_scale,
    m_i,
    l_elem,
    acc,
    zero_s,
    DRAFT_LEN: gl.constexpr,
    V_EXT_FROM_K: gl.constexpr,
    DRAFT_MASK: gl.constexpr,
):
    # Tile t holds the drafts' K (and tile t + 1 their V, unless V is a
    # view of K). Row (h, i) sees drafts 0..i (or as its mask says),
    # scored without k_scale.
    o_rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    qk = _tile_scores(q_nope, q_rope, kv_nope_ring, kv_rope_ring, ready, t, zero_s)
    qk = _mask_drafts(qk, masks, request, DRAFT_LEN, DRAFT_MASK)
    p, m_i, l_elem, acc = _softmax_step(qk, draft_scale, m_i, l_elem, acc, o_rows, DRAFT_MASK)
    v_tile = _draft_values(kv_nope_ring, v_ring, ready, t, V_EXT_FROM_K)
    acc = _add_pv(p, p_smem, v_tile, acc)
    _release_drafts(empty, t, V_EXT_FROM_K)
    return m_i, l_elem, acc


@gluon.jit
def _load_draft_rows(dst, BASE, request, stride_tok, col0, WARPS: gl.constexpr = CONSUMER_WARPS):
    # The request's draft rows of k_extend / v_extend, columns col0
    # onwards, into dst (the rows past them zero).
    q_first, num_rows, _, _, _ = request
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    rows = gl.arange(0, TOKENS, layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, dst.shape[1], layout=gl.SliceLayout(0, layout))
    ptrs = BASE + (q_first + rows).to(gl.int64)[:, None] * stride_tok + cols[None, :]
    dst.store(gl.load(ptrs, mask=(rows < num_rows)[:, None], other=0.0))


@gluon.jit
def _load_draft_pieces(
    dst, BASE, request, stride_tok, col0, PIECE: gl.constexpr, WARPS: gl.constexpr
):
    # _load_draft_rows for dst's columns (col0 onwards in BASE's rows),
    # PIECE at a time: a whole row of MLA's 512 at once holds twice the
    # registers of half of it.
    for piece in gl.static_range(dst.shape[1] // PIECE):
        _load_draft_rows(
            dst.slice(piece * PIECE, PIECE, dim=1),
            BASE,
            request,
            stride_tok,
            col0 + piece * PIECE,
            WARPS,
        )


@gluon.jit
def _load_draft_halves(dst, BASE, request, stride_tok):
    # Columns: dst's columns HALF_V at a time, by both warpgroups.
    _load_draft_pieces(dst, BASE, request, stride_tok, 0, HALF_V, CONSUMER_WARPS)


@gluon.jit
def _consume_loaded_drafts(
    q_nope,
    q_rope,
    ext,
    wide,
    p_smem,
    masks,
    request,
    draft_scale,
    m_i,
    l_elem,
    acc,
    zero_s,
    DRAFT_LEN: gl.constexpr,
    V_EXT_FROM_K: gl.constexpr,
    DRAFT_MASK: gl.constexpr,
):
    # fp8 KV: the ring holds fp8 rows, so the consumers load the drafts
    # (bf16) into the widened tile themselves. The last prefix tile's
    # P V is done (_add_pv's last barrier): the tile is free.
    K_EXT, V_EXT, stride_ke_tok, stride_ve_tok = ext
    wide_nope, wide_rope, wide_v = wide
    o_rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    _load_draft_halves(wide_nope, K_EXT, request, stride_ke_tok)
    if D_ROPE > 0:
        _load_draft_rows(wide_rope, K_EXT, request, stride_ke_tok, D_NOPE)
    if not MLA:
        # V's tile is a buffer of its own: loaded with K's.
        _load_draft_halves(wide_v, V_EXT, request, stride_ve_tok)
    fence_async_shared()
    _warps_barrier()
    qk = _scores(q_nope, q_rope, wide_nope, wide_rope, zero_s)
    qk = _mask_drafts(qk, masks, request, DRAFT_LEN, DRAFT_MASK)
    p, m_i, l_elem, acc = _softmax_step(qk, draft_scale, m_i, l_elem, acc, o_rows, DRAFT_MASK)
    if MLA:  # noqa: SIM102 (constexpr first: a worker's V_EXT_FROM_K is a runtime value)
        if not V_EXT_FROM_K:
            _warps_barrier()  # both warpgroups' scores have read K's rows
            _load_draft_halves(wide_nope, V_EXT, request, stride_ve_tok)
    # _add_pv fences and waits for every warp's stores before its P V.
    return m_i, l_elem, _add_pv(p, p_smem, wide_v, acc)


@gluon.jit
def _consume(
    share,
    q_args,
    ext,
    q_nope,
    q_rope,
    kv_nope_ring,
    kv_rope_ring,
    v_ring,
    wide,
    p_smem,
    ready,
    empty,
    scales,
    out_args,
    masks,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    V_EXT_FROM_K: gl.constexpr,
    KV_FP8: gl.constexpr,
    PREFIX_MASK: gl.constexpr,
    DRAFT_MASK: gl.constexpr,
):
    # Warpgroup g computes score columns 32g .. 32g + 31 and output
    # columns g HALF_V .. (g + 1) HALF_V - 1 of all 64 rows.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, HALF_V, 16]
    )
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    zero_s = gl.zeros([ROWS, TOKENS], gl.float32, layout=s_layout)
    score_scale, draft_scale, prefix_v_scale, draft_v_scale = scales
    wide_nope, wide_rope, wide_v = wide  # read with fp8 KV only
    _, b0, b1, base, _, _, _ = share
    # b1 < b0: nothing to do (_prefix_kernel_sm90), and no request to read.
    segment = _segment(share, gl.minimum(b0, b1), base)
    _stage_next(
        segment, b0 - 1, b1, q_nope, q_rope, q_args, out_args, BLOCK_H, DRAFT_LEN, CONSUMER_WARPS
    )
    t0 = 0  # ring tiles of the earlier segments
    for b in range(b0, b1 + 1):
        kv_start, lo, hi, with_drafts, whole, request, base = segment
        # The next request's segment, read a request ahead (b1's own
        # again on the last).
        segment = _segment(share, gl.minimum(b + 1, b1), base)
        _await_q()
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=s_rows)
        # Row sums kept per element and reduced once at the end: one
        # cross-warpgroup reduction per tile instead of two.
        l_elem = gl.zeros([ROWS, TOKENS], gl.float32, layout=s_layout)
        acc = gl.zeros([ROWS, D_V], gl.float32, layout=o_layout)
        if PREFIX_MASK:
            mask_rows = _mask_rows(masks, request, DRAFT_LEN, s_layout)
        prefix_tiles = (hi - lo + TOKENS - 1) // TOKENS
        for t in range(prefix_tiles):
            tile = t0 + t
            stage = tile % STAGES
            if PREFIX_MASK:
                # Loaded before the wait, which hides their latency.
                bits = _mask_bits(
                    masks, mask_rows, request, lo + t * TOKENS, hi, DRAFT_LEN, s_layout
                )
            mbarrier.wait(ready.index(stage), (tile // STAGES) & 1)
            if KV_FP8:
                # The previous tile's P V is done (_add_pv's last barrier):
                # the bf16 tile is free, and the fp8 stage is free once read.
                kv_nope = wide_nope
                kv_rope = wide_rope
                v_tile = wide_v
                if MLA:
                    _widen(kv_nope_ring.index(stage), kv_rope_ring.index(stage), kv_nope, kv_rope)
                else:
                    _widen(kv_nope_ring.index(stage), v_ring.index(stage), kv_nope, v_tile)
                mbarrier.arrive(empty.index(stage), count=1)
            else:
                kv_nope = kv_nope_ring.index(stage)
                kv_rope = kv_rope_ring.index(stage)
                v_tile = v_ring.index(stage)
                fence_async_shared()  # the gathers wrote through the generic proxy
            qk = _scores(q_nope, q_rope, kv_nope, kv_rope, zero_s)
            qk = _mask_tail(qk, lo + t * TOKENS, hi)
            if PREFIX_MASK:
                qk = gl.where(bits != 0, qk, float("-inf"))
            p, m_i, l_elem, acc = _softmax_step(
                qk, score_scale, m_i, l_elem, acc, o_rows, PREFIX_MASK
            )
            acc = _add_pv(p, p_smem, v_tile, acc)
            if not KV_FP8:
                mbarrier.arrive(empty.index(stage), count=1)
        t0 += prefix_tiles
        # The prefix's values times v_scale / v_extend_scale here, every
        # value times v_extend_scale in the normalisation: the drafts'
        # values count v_extend_scale times, in fp32 (launch_prefix).
        acc = acc * prefix_v_scale

        if with_drafts:
            if KV_FP8:
                m_i, l_elem, acc = _consume_loaded_drafts(
                    q_nope,
                    q_rope,
                    ext,
                    wide,
                    p_smem,
                    masks,
                    request,
                    draft_scale,
                    m_i,
                    l_elem,
                    acc,
                    zero_s,
                    DRAFT_LEN,
                    V_EXT_FROM_K,
                    DRAFT_MASK,
                )
            else:
                m_i, l_elem, acc = _consume_drafts(
                    q_nope,
                    q_rope,
                    kv_nope_ring,
                    kv_rope_ring,
                    v_ring,
                    p_smem,
                    ready,
                    empty,
                    t0,
                    masks,
                    request,
                    draft_scale,
                    m_i,
                    l_elem,
                    acc,
                    zero_s,
                    DRAFT_LEN,
                    V_EXT_FROM_K,
                    DRAFT_MASK,
                )
                t0 = _after_drafts(t0, V_EXT_FROM_K)
        _stage_next(
            segment, b, b1, q_nope, q_rope, q_args, out_args, BLOCK_H, DRAFT_LEN, CONSUMER_WARPS
        )

        l_i = _row_sums(gl.sum(l_elem, 1), PREFIX_MASK or DRAFT_MASK)
        dest = _dest(out_args, b, b0, whole, request)
        l_out = gl.convert_layout(l_i / draft_v_scale, o_rows)
        _store_out(acc / l_out[:, None], 0, dest, BLOCK_H, DRAFT_LEN)
        _store_lse(m_i, l_i, dest, BLOCK_H, DRAFT_LEN)


@gluon.jit
def _hand_over(qk, scale, m_i, l_i, p_dst, stage, xchg, p_bar, MASKED: gl.constexpr):
    # Score/value: one tile's softmax. P goes into p_dst (bf16 KV: the
    # tile's rope rows, spent: only the score warpgroup read them, for
    # the scores now done) and the factor that rescales the earlier
    # tiles into xchg, for the value warpgroup.
    p, alpha, m_i = _online_softmax(qk, scale, m_i, MASKED)
    p_dst.store(p.to(gl.bfloat16))
    xchg.index(stage).store(alpha)
    fence_async_shared()
    _warps_barrier()  # all of the warpgroup's stores before the arrive
    mbarrier.arrive(p_bar.index(stage), count=1)
    return alpha, m_i, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _consume_scores(
    share,
    q_args,
    ext,
    q_nope,
    q_rope,
    kv_nope_ring,
    kv_rope_ring,
    v_ring,
    wide,
    xchg,
    bars,
    scales,
    out_args,
    masks,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    V_EXT_FROM_K: gl.constexpr,
    KV_FP8: gl.constexpr,
    PREFIX_MASK: gl.constexpr,
    DRAFT_MASK: gl.constexpr,
):
    # The score warpgroup: S = Q K^T for all 64 rows and keys of a tile,
    # the online softmax, and the first half of the output columns. With
    # fp8 KV (MLA) it widens that half's latent columns of each tile into
    # the bf16 tile (`wide`) and hands P over in a buffer of its own.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPGROUP, 1], instr_shape=[16, 64, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPGROUP, 1], instr_shape=[16, HALF_V, 16]
    )
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    zero_s = gl.zeros([ROWS, TOKENS], gl.float32, layout=s_layout)
    ready, empty, p_bar, sums_bar, sums_free, wide_bar = bars
    score_scale, draft_scale, prefix_v_scale, draft_v_scale = scales
    K_EXT, V_EXT, stride_ke_tok, stride_ve_tok = ext
    wide_nope, _, p_smem = wide
    wide_left = wide_nope.slice(0, HALF_V, dim=1)
    _, b0, b1, base, _, _, _ = share
    # b1 < b0: nothing to do (_prefix_kernel_sm90), and no request to read.
    segment = _segment(share, gl.minimum(b0, b1), base)
    _stage_next(
        segment, b0 - 1, b1, q_nope, q_rope, q_args, out_args, BLOCK_H, DRAFT_LEN, WARPGROUP
    )
    t0 = 0  # ring tiles of the earlier segments
    # P handed over in the earlier segments: with bf16 KV one a ring tile
    # (t0), with fp8 one a prefix tile and one for the drafts, which the
    # ring does not hold.
    h0 = 0
    for b in range(b0, b1 + 1):
        kv_start, lo, hi, with_drafts, whole, request, base = segment
        # The next request's segment, read a request ahead (b1's own
        # again on the last).
        segment = _segment(share, gl.minimum(b + 1, b1), base)
        _await_q()
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=s_rows)
        l_i = gl.zeros([ROWS], gl.float32, layout=s_rows)
        acc = gl.zeros([ROWS, HALF_V], gl.float32, layout=o_layout)
        if PREFIX_MASK:
            mask_rows = _mask_rows(masks, request, DRAFT_LEN, s_layout)
        prefix_tiles = (hi - lo + TOKENS - 1) // TOKENS
        for t in range(prefix_tiles):
            tile = t0 + t
            stage = tile % STAGES
            if PREFIX_MASK:
                # Loaded before the tile's wait, which hides their latency.
                bits = _mask_bits(
                    masks, mask_rows, request, lo + t * TOKENS, hi, DRAFT_LEN, s_layout
                )
            if KV_FP8:
                handed = h0 + t
                mbarrier.wait(ready.index(stage), (tile // STAGES) & 1)
                # This warpgroup's last P V is done (synchronous): the
                # tile's left half is free.
                _widen_columns(kv_nope_ring.index(stage).slice(0, HALF_V, dim=1), wide_left)
                fence_async_shared()
                _warps_barrier()
                mbarrier.arrive(empty.index(stage), count=1)
                qk = _widened_scores(q_nope, q_rope, wide, wide_bar, handed, zero_s)
                p_dst = p_smem
                v_half = wide_left
            else:
                handed = tile
                qk = _tile_scores(q_nope, q_rope, kv_nope_ring, kv_rope_ring, ready, tile, zero_s)
                p_dst = kv_rope_ring.index(stage)
                v_half = v_ring.index(stage).slice(0, HALF_V, dim=1)
            qk = _mask_tail(qk, lo + t * TOKENS, hi)
            if PREFIX_MASK:
                qk = gl.where(bits != 0, qk, float("-inf"))
            alpha, m_i, l_i = _hand_over(
                qk, score_scale, m_i, l_i, p_dst, handed % STAGES, xchg, p_bar, PREFIX_MASK
            )
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            # This tile's P V, and its stage freed, before waiting for the
            # next tile: issued behind the next tile's scores instead, the
            # stage was freed only once that tile had landed, and the ring
            # ran one tile deep (1.5-10% slower).
            acc = warpgroup_mma(p_dst, v_half, acc)
            if not KV_FP8:
                mbarrier.arrive(empty.index(stage), count=1)
        t0 += prefix_tiles
        h0 += prefix_tiles
        # The prefix's values times v_scale / v_extend_scale (as _consume).
        acc = acc * prefix_v_scale

        if with_drafts:
            # The drafts' K (and V unless it is a view of K): with bf16 KV
            # ring tile t0 (and t0 + 1); with fp8 KV loaded into the bf16
            # tile by both warpgroups. Row (h, i) sees drafts 0..i (or as
            # its mask says), scored without k_scale.
            if KV_FP8:
                handed = h0
                _load_draft_pieces(
                    wide_left, K_EXT, request, stride_ke_tok, 0, DRAFT_PIECE, WARPGROUP
                )
                fence_async_shared()
                _warps_barrier()
                qk = _widened_scores(q_nope, q_rope, wide, wide_bar, handed, zero_s)
                p_dst = p_smem
            else:
                handed = t0
                qk = _tile_scores(q_nope, q_rope, kv_nope_ring, kv_rope_ring, ready, t0, zero_s)
                p_dst = kv_rope_ring.index(t0 % STAGES)
            _stage_next(
                segment, b, b1, q_nope, q_rope, q_args, out_args, BLOCK_H, DRAFT_LEN, WARPGROUP
            )
            qk = _mask_drafts(qk, masks, request, DRAFT_LEN, DRAFT_MASK)
            alpha, m_i, l_i = _hand_over(
                qk, draft_scale, m_i, l_i, p_dst, handed % STAGES, xchg, p_bar, DRAFT_MASK
            )
            acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            if KV_FP8:
                if not V_EXT_FROM_K:
                    # The scores have read K's rows: V's take their place.
                    _load_draft_pieces(
                        wide_left, V_EXT, request, stride_ve_tok, 0, DRAFT_PIECE, WARPGROUP
                    )
                    fence_async_shared()
                    _warps_barrier()
                acc = warpgroup_mma(p_dst, wide_left, acc)
                h0 += 1
            else:
                v_tile = _draft_values(kv_nope_ring, v_ring, ready, t0, V_EXT_FROM_K)
                acc = warpgroup_mma(p_dst, v_tile.slice(0, HALF_V, dim=1), acc)
                mbarrier.arrive(empty.index(t0 % STAGES), count=1)
                if not V_EXT_FROM_K:
                    # V's tile carries no P; an arrive keeps that stage's
                    # p_bar phases in step with the ring (nobody waits on it).
                    stage = (t0 + 1) % STAGES
                    mbarrier.arrive(p_bar.index(stage), count=1)
                    mbarrier.arrive(empty.index(stage), count=1)
                t0 = _after_drafts(t0, V_EXT_FROM_K)
                h0 = t0
        else:
            _stage_next(
                segment, b, b1, q_nope, q_rope, q_args, out_args, BLOCK_H, DRAFT_LEN, WARPGROUP
            )

        # The row sums, for the value warpgroup's normalisation, once it
        # has read the previous segment's.
        l_i = _row_sums(l_i, PREFIX_MASK or DRAFT_MASK)
        mbarrier.wait(sums_free, ((b - b0) & 1) ^ 1)
        xchg.index(STAGES).store(l_i)
        _warps_barrier()
        mbarrier.arrive(sums_bar, count=1)
        dest = _dest(out_args, b, b0, whole, request)
        out = acc / gl.convert_layout(l_i / draft_v_scale, o_rows)[:, None]
        _store_out(out, 0, dest, BLOCK_H, DRAFT_LEN, WIDE=True)
        _store_lse(m_i, l_i, dest, BLOCK_H, DRAFT_LEN)


@gluon.jit
def _draft_values(kv_nope_ring, v_ring, ready, n, V_EXT_FROM_K: gl.constexpr):
    # The drafts' V: with a V ring (not MLA) its tile n, beside their K;
    # else tile n's latent rows when V is a view of K, or tile n + 1.
    if not MLA:
        v_tile = v_ring.index(n % STAGES)
    elif V_EXT_FROM_K:
        v_tile = kv_nope_ring.index(n % STAGES)
    else:
        mbarrier.wait(ready.index((n + 1) % STAGES), ((n + 1) // STAGES) & 1)
        fence_async_shared()
        v_tile = kv_nope_ring.index((n + 1) % STAGES)
    return v_tile


@gluon.jit
def _widen_right(kv_nope_ring, kv_rope_ring, ready, empty, tile, wide, wide_bar):
    # Score/value, fp8 KV: the value warpgroup widens ring tile `tile`'s
    # latent columns HALF_V onwards and its rope columns into the bf16
    # tile (its last P V is done, and the score warpgroup's last scores,
    # which it waited for), frees the stage and signals wide_bar.
    wide_nope, wide_rope, _ = wide
    stage = tile % STAGES
    mbarrier.wait(ready.index(stage), (tile // STAGES) & 1)
    _widen_columns(
        kv_nope_ring.index(stage).slice(HALF_V, HALF_V, dim=1),
        wide_nope.slice(HALF_V, HALF_V, dim=1),
    )
    _widen_columns(kv_rope_ring.index(stage), wide_rope)
    fence_async_shared()
    _warps_barrier()
    mbarrier.arrive(empty.index(stage), count=1)
    mbarrier.arrive(wide_bar, count=1)


@gluon.jit
def _consume_values(
    share,
    ext,
    kv_nope_ring,
    kv_rope_ring,
    v_ring,
    wide,
    xchg,
    bars,
    v_scales,
    out_args,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    V_EXT_FROM_K: gl.constexpr,
    KV_FP8: gl.constexpr,
):
    # The value warpgroup: the second half of the output columns, one P V
    # for each P the score warpgroup hands over. With fp8 KV (MLA) it
    # widens that half's latent columns and the rope columns of each tile.
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPGROUP, 1], instr_shape=[16, HALF_V, 16]
    )
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    ready, empty, p_bar, sums_bar, sums_free, wide_bar = bars
    K_EXT, V_EXT, stride_ke_tok, stride_ve_tok = ext
    wide_nope, wide_rope, p_smem = wide
    wide_right = wide_nope.slice(HALF_V, HALF_V, dim=1)
    _, b0, b1, base, _, _, _ = share
    t0 = 0  # ring tiles of the earlier segments
    h0 = 0  # P handed over in the earlier segments (_consume_scores)
    for b in range(b0, b1 + 1):
        kv_start, lo, hi, with_drafts, whole, request, base = _segment(share, b, base)
        acc = gl.zeros([ROWS, HALF_V], gl.float32, layout=o_layout)
        prefix_tiles = (hi - lo + TOKENS - 1) // TOKENS
        for t in range(prefix_tiles):
            tile = t0 + t
            if KV_FP8:
                handed = h0 + t
                _widen_right(kv_nope_ring, kv_rope_ring, ready, empty, tile, wide, wide_bar)
                p_src = p_smem
                v_half = wide_right
            else:
                handed = tile
                p_src = kv_rope_ring.index(tile % STAGES)
                v_half = v_ring.index(tile % STAGES).slice(HALF_V, HALF_V, dim=1)
            stage = handed % STAGES
            mbarrier.wait(p_bar.index(stage), (handed // STAGES) & 1)
            acc = acc * xchg.index(stage).load(o_rows)[:, None]
            acc = warpgroup_mma(p_src, v_half, acc)
            if not KV_FP8:
                mbarrier.arrive(empty.index(stage), count=1)
        t0 += prefix_tiles
        h0 += prefix_tiles
        prefix_v_scale, draft_v_scale = v_scales  # as _consume
        acc = acc * prefix_v_scale
        if with_drafts:
            if KV_FP8:
                stage = h0 % STAGES
                _load_draft_pieces(
                    wide_right, K_EXT, request, stride_ke_tok, HALF_V, DRAFT_PIECE, WARPGROUP
                )
                _load_draft_rows(wide_rope, K_EXT, request, stride_ke_tok, D_NOPE, WARPGROUP)
                fence_async_shared()
                _warps_barrier()
                mbarrier.arrive(wide_bar, count=1)
                mbarrier.wait(p_bar.index(stage), (h0 // STAGES) & 1)
                acc = acc * xchg.index(stage).load(o_rows)[:, None]
                if not V_EXT_FROM_K:
                    # The scores have read K's rows: V's take their place.
                    _load_draft_pieces(
                        wide_right, V_EXT, request, stride_ve_tok, HALF_V, DRAFT_PIECE, WARPGROUP
                    )
                    fence_async_shared()
                    _warps_barrier()
                acc = warpgroup_mma(p_smem, wide_right, acc)
                h0 += 1
            else:
                stage = t0 % STAGES
                mbarrier.wait(p_bar.index(stage), (t0 // STAGES) & 1)
                acc = acc * xchg.index(stage).load(o_rows)[:, None]
                v_tile = _draft_values(kv_nope_ring, v_ring, ready, t0, V_EXT_FROM_K)
                acc = warpgroup_mma(
                    kv_rope_ring.index(stage), v_tile.slice(HALF_V, HALF_V, dim=1), acc
                )
                _release_drafts(empty, t0, V_EXT_FROM_K)
                t0 = _after_drafts(t0, V_EXT_FROM_K)
                h0 = t0
        mbarrier.wait(sums_bar, (b - b0) & 1)
        l_i = xchg.index(STAGES).load(o_rows)
        _warps_barrier()  # every warp has read the sums
        mbarrier.arrive(sums_free, count=1)
        dest = _dest(out_args, b, b0, whole, request)
        _store_out(acc / (l_i / draft_v_scale)[:, None], HALF_V, dest, BLOCK_H, DRAFT_LEN)


@constexpr_function
def _row_pieces_layout():
    # The wgmma accumulator's rows and warps for HALF_V columns (64 or
    # more), each thread holding 8 adjacent ones (a quad of lanes 32), not 2.
    regs = [[0, 1], [0, 2], [0, 4], [8, 0]] + [[0, c] for c in (32, 64, 128) if c < HALF_V.value]
    lanes = [[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]]
    warps = [[16, 0], [32, 0]]
    return gl.DistributedLinearLayout(regs, lanes, warps, [], [ROWS.value, HALF_V.value])


@gluon.jit
def _store_out(
    out, col0, dest, BLOCK_H: gl.constexpr, DRAFT_LEN: gl.constexpr, WIDE: gl.constexpr = False
):
    # Output columns col0 onwards of the tile's rows: the output itself
    # when the segment is the whole request (drafts included), else the
    # segment's partial, row (slot, tile row).
    (
        write_output,
        O,
        stride_o_tok,
        stride_o_head,
        PART_O,
        _,
        request,
        slot,
        head_block,
        num_heads,
    ) = dest
    out_args = (O, stride_o_tok, stride_o_head, request, head_block, num_heads)
    if write_output:
        if WIDE:
            # 16-byte stores, not 4-byte ones, after a regrouping through
            # shared scratch; it pays where a CTA packs many whole
            # requests. Not in the value warpgroup: with 176 registers
            # it spilled.
            wide = gl.convert_layout(out.to(gl.bfloat16), _row_pieces_layout())
            _store_output(wide, col0, out_args, BLOCK_H, DRAFT_LEN)
        else:
            _store_output(out.to(gl.bfloat16), col0, out_args, BLOCK_H, DRAFT_LEN)
    else:
        layout: gl.constexpr = out.type.layout
        offs_h, offs_i, mask_m, offs_d = _tile_coords(
            head_block, num_heads, request[1], col0, out.shape[1], BLOCK_H, DRAFT_LEN, layout
        )
        rows_layout: gl.constexpr = gl.SliceLayout(1, layout)
        part_row = _partial_rows(slot, offs_h, offs_i, num_heads, BLOCK_H, DRAFT_LEN, rows_layout)
        gl.store(PART_O + part_row[:, None] * D_V + offs_d[None, :], out, mask=mask_m[:, None])


@gluon.jit
def _partial_rows(
    slot,
    offs_h,
    offs_i,
    num_heads,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    layout: gl.constexpr,
):
    # A segment's partial rows: (slot, head, draft), the slot one of its
    # head block's CTAs'; with RAGGED (slot, tile row), the slot one of the
    # grid's CTAs' (stage 2 finds a head's rows from its draft count).
    if RAGGED:
        rows = gl.arange(0, ROWS, layout=layout)
        part_row = slot * (BLOCK_H * DRAFT_LEN) + rows
    else:
        part_row = (slot * num_heads + offs_h) * DRAFT_LEN + offs_i
    return part_row.to(gl.int64)


@gluon.jit
def _store_output(out, col0, out_args, BLOCK_H: gl.constexpr, DRAFT_LEN: gl.constexpr):
    # The output rows of a whole request, in out's layout.
    O, stride_o_tok, stride_o_head, request, head_block, num_heads = out_args
    q_first, num_rows, _, _, _ = request
    layout: gl.constexpr = out.type.layout
    offs_h, offs_i, mask_m, offs_d = _tile_coords(
        head_block, num_heads, num_rows, col0, out.shape[1], BLOCK_H, DRAFT_LEN, layout
    )
    o_row = (q_first + offs_i).to(gl.int64) * stride_o_tok + offs_h * stride_o_head
    gl.store(O + o_row[:, None] + offs_d[None, :], out, mask=mask_m[:, None])


@gluon.jit
def _store_lse(m_i, l_i, dest, BLOCK_H: gl.constexpr, DRAFT_LEN: gl.constexpr):
    # The segment's log2-sum-exp per row, for stage 2's merge (none
    # when it wrote the output itself).
    write_output, _, _, _, _, PART_LSE, request, slot, head_block, num_heads = dest
    if not write_output:
        layout: gl.constexpr = m_i.type.layout
        offs_h, offs_i, mask_m = _row_coords(
            head_block, num_heads, request[1], BLOCK_H, DRAFT_LEN, layout
        )
        row = _partial_rows(slot, offs_h, offs_i, num_heads, BLOCK_H, DRAFT_LEN, layout)
        gl.store(PART_LSE + row, m_i + gl.log2(l_i), mask=mask_m)


@gluon.jit(do_not_specialize=["batch_size", "min_share"])
def _prefix_kernel_sm90(
    Q,
    K_BUF,
    V_BUF,
    K_EXT,
    V_EXT,
    O,
    QO_INDPTR,
    KV_INDPTR,
    KV_INDICES,
    MASK,
    MASK_INDPTR,
    PART_O,
    PART_LSE,
    stride_q_tok,
    stride_q_head,
    stride_k_slot,
    stride_v_slot,
    stride_ke_tok,
    stride_ve_tok,
    stride_o_tok,
    stride_o_head,
    num_heads,
    batch_size,
    min_share,
    score_scale,
    draft_scale,
    prefix_v_scale,
    draft_v_scale,
    PAGE_NOPE,
    PAGE_ROPE,
    DRAFT_LEN: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_B: gl.constexpr,
    HEAD_BLOCKS: gl.constexpr,
    PLAN_REQUESTS: gl.constexpr,
    V_EXT_FROM_K: gl.constexpr,
    SCORE_VALUE: gl.constexpr,
    LAUNCH_DEPENDENTS: gl.constexpr,
    PREFIX_MASK: gl.constexpr,
    DRAFT_MASK: gl.constexpr,
):
    if LAUNCH_DEPENDENTS:
        # Stage 2 may launch from the start (kernel.dependent_launch):
        # with one CTA per SM its programs find room only as this
        # grid's CTAs exit, so they cannot hold one back; each plans on
        # an SM freed early and waits for the whole grid before it
        # reads a partial.
        _launch_dependents()
    KV_FP8: gl.constexpr = K_BUF.dtype.element_ty == gl.float8e4nv
    gl.static_assert(MLA or not (SCORE_VALUE and KV_FP8), "score/value with fp8 KV: MLA only")
    gl.static_assert(MLA or not PAGED, "paged caches: MLA only")
    # Warps of the default partition: the consumers (columns) or the
    # score warpgroup.
    MAIN_WARPS: gl.constexpr = WARPGROUP if SCORE_VALUE else CONSUMER_WARPS
    head_block = gl.program_id(0)
    cta = gl.program_id(1)
    plan_layout: gl.constexpr = gl.BlockedLayout([1], [32], [MAIN_WARPS], [0])
    # The share (module docstring): the head block's positions, cut into
    # equal ranges, one per CTA, of min_share positions at least.
    tile_rows: gl.constexpr = BLOCK_H * DRAFT_LEN
    total = 0
    most = 0
    fewest = DRAFT_LEN
    # Every request's positions, in index order (ORDER is not written yet).
    for start in range(0, batch_size, BLOCK_B):
        offs = start + gl.arange(0, BLOCK_B, layout=plan_layout)
        positions = _request_positions(KV_INDPTR, QO_INDPTR, offs, offs < batch_size, 0, 1)
        total += gl.sum(positions, 0)
        most = gl.maximum(most, gl.max(positions, 0))
        if RAGGED:
            counts = _draft_counts(QO_INDPTR, start, batch_size, BLOCK_B, DRAFT_LEN, plan_layout)
            fewest = gl.minimum(fewest, gl.min(counts, 0))
    # A ragged batch's drafts weigh DRAFT_POSITIONS (int64: no wrap to
    # equal); so do those of a batch whose shares are aligned
    # (_head_block_plan), which cut requests wherever they fall.
    uniform = most.to(gl.int64) * batch_size == total
    # The fewest drafts of a request with rows in the last head block.
    last_rows = _min_rows(gl.num_programs(0) - 1, num_heads, tile_rows)
    if RAGGED:
        uniform &= fewest >= last_rows
    drafts = DRAFT_POSITIONS
    if uniform:
        drafts = 1
    total += (drafts - 1) * batch_size
    slot_cta = cta  # the CTA's partial slots (_partial_rows)
    min_rows = 0  # the fewest drafts of a request with rows in the head block
    share_len = 0  # the aligned plan's share length; 0: equal cuts
    ctas = _share_count(gl.num_programs(1), total, uniform, batch_size, min_share)
    ORDER = QO_INDPTR  # read with RAGGED alone, then set below
    if RAGGED:
        # Where some request has no heads in some head block, the plan is
        # aligned (_head_block_plan); else each head block keeps its row
        # of the grid.
        head_blocks = gl.num_programs(0)
        slot_cta = head_block * gl.num_programs(1) + cta
        # The CTA's order of the requests (_order_requests), batch_size
        # int32 words a CTA past the grid's partial rows (hopper.order_rows).
        partials = 2 * head_blocks * gl.num_programs(1) * tile_rows
        ORDER = (PART_O + partials.to(gl.int64) * D_V).to(
            gl.pointer_type(gl.int32), bitcast=True
        ) + slot_cta.to(gl.int64) * batch_size
        _order_requests(QO_INDPTR, ORDER, batch_size, DRAFT_LEN, MAIN_WARPS)
        _warps_barrier()  # every place stored before any is read
        if fewest < last_rows:
            head_block, first_cta, ctas, total, share_len = _head_block_plan(
                (KV_INDPTR, QO_INDPTR, num_heads, tile_rows),
                batch_size,
                slot_cta,
                head_blocks * gl.num_programs(1),
                head_blocks,
                drafts,
                min_share,
                PLAN_REQUESTS,
                HEAD_BLOCKS,
                MAIN_WARPS,
            )
            cta = slot_cta - first_cta
        min_rows = _min_rows(head_block, num_heads, tile_rows)
    share_block = (KV_INDPTR, QO_INDPTR, min_rows, ORDER, head_block * tile_rows)
    if cta < ctas:
        if share_len > 0:
            s0 = cta * share_len
            s1 = gl.minimum(s0 + share_len, total)
        else:
            s0 = (cta.to(gl.int64) * total // ctas).to(gl.int32)
            s1 = ((cta + 1).to(gl.int64) * total // ctas).to(gl.int32)
        share = _share(share_block, batch_size, drafts, s0, s1, BLOCK_B, plan_layout)
        q_args = (Q, stride_q_tok, stride_q_head)
        ext = (K_EXT, V_EXT, stride_ke_tok, stride_ve_tok)
        scales = (score_scale, draft_scale, prefix_v_scale, draft_v_scale)
        masks = (MASK, MASK_INDPTR)
        out_args = (
            O,
            stride_o_tok,
            stride_o_head,
            PART_O,
            PART_LSE,
            slot_cta,
            head_block,
            num_heads,
        )

        nope_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D_NOPE], gl.bfloat16)
        rope_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for(
            [ROWS, RING_ROPE], gl.bfloat16
        )
        # Each segment's query rows are staged by the warps that read
        # them (_issue_q).
        q_nope = gl.allocate_shared_memory(gl.bfloat16, [ROWS, D_NOPE], nope_smem)
        q_rope = gl.allocate_shared_memory(gl.bfloat16, [ROWS, RING_ROPE], rope_smem)
        # The ring holds KV rows as stored; with fp8 KV (columns), one
        # bf16 tile besides (module docstring).
        kv_dtype: gl.constexpr = K_BUF.dtype.element_ty
        kv_nope_ring = gl.allocate_shared_memory(
            kv_dtype,
            [STAGES, TOKENS, D_NOPE],
            gl.NVMMASharedLayout.get_default_for([TOKENS, D_NOPE], kv_dtype),
        )
        kv_rope_ring = gl.allocate_shared_memory(
            kv_dtype,
            [STAGES, TOKENS, RING_ROPE],
            gl.NVMMASharedLayout.get_default_for([TOKENS, RING_ROPE], kv_dtype),
        )
        if MLA:
            v_ring = kv_nope_ring  # V is the latent columns of K's rows
        else:
            v_ring = gl.allocate_shared_memory(
                kv_dtype,
                [STAGES, TOKENS, D_V],
                gl.NVMMASharedLayout.get_default_for([TOKENS, D_V], kv_dtype),
            )
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for stage in gl.static_range(STAGES):
            mbarrier.init(ready.index(stage), count=PRODUCER_WARPS * 32)
            # Score/value: both warpgroups release each stage.
            mbarrier.init(empty.index(stage), count=2 if SCORE_VALUE else 1)
        produce_args = (
            share,
            K_BUF,
            V_BUF,
            KV_INDICES,
            stride_k_slot,
            stride_v_slot,
            ext,
            kv_nope_ring,
            kv_rope_ring,
            v_ring,
            ready,
            empty,
            (PAGE_NOPE, PAGE_ROPE),
            V_EXT_FROM_K,
        )
        if SCORE_VALUE:
            # Per stage the rescale factors of the P handed over, then
            # the final row sums.
            xchg = gl.allocate_shared_memory(
                gl.float32, [STAGES + 1, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0])
            )
            p_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            sums_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            sums_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            for stage in gl.static_range(STAGES):
                mbarrier.init(p_bar.index(stage), count=1)
            mbarrier.init(sums_bar, count=1)
            mbarrier.init(sums_free, count=1)
            if KV_FP8:
                # One bf16 tile, widened from the fp8 ring by both
                # warpgroups (each its half of the latent columns; the
                # value warpgroup the rope ones, and signals wide_bar),
                # and P's buffer: the fp8 ring's rope rows cannot hold it.
                # q, two fp8 stages, this tile and P: 224 of 227 KB.
                wide_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
                mbarrier.init(wide_bar, count=1)
                wide = (
                    gl.allocate_shared_memory(gl.bfloat16, [TOKENS, D_NOPE], nope_smem),
                    gl.allocate_shared_memory(gl.bfloat16, [TOKENS, RING_ROPE], rope_smem),
                    gl.allocate_shared_memory(gl.bfloat16, [ROWS, TOKENS], rope_smem),
                )
            else:
                wide_bar = sums_bar  # never waited on
                wide = (kv_nope_ring.index(0), kv_rope_ring.index(0), kv_rope_ring.index(0))
            fence_async_shared()
            bars = (ready, empty, p_bar, sums_bar, sums_free, wide_bar)
            gl.warp_specialize(
                [
                    (
                        _consume_scores,
                        (
                            share,
                            q_args,
                            ext,
                            q_nope,
                            q_rope,
                            kv_nope_ring,
                            kv_rope_ring,
                            v_ring,
                            wide,
                            xchg,
                            bars,
                            scales,
                            out_args,
                            masks,
                            BLOCK_H,
                            DRAFT_LEN,
                            V_EXT_FROM_K,
                            KV_FP8,
                            PREFIX_MASK,
                            DRAFT_MASK,
                        ),
                    ),
                    (
                        _consume_values,
                        (
                            share,
                            ext,
                            kv_nope_ring,
                            kv_rope_ring,
                            v_ring,
                            wide,
                            xchg,
                            bars,
                            (prefix_v_scale, draft_v_scale),
                            out_args,
                            BLOCK_H,
                            DRAFT_LEN,
                            V_EXT_FROM_K,
                            KV_FP8,
                        ),
                    ),
                    (_produce, produce_args),
                ],
                [WARPGROUP, PRODUCER_WARPS],
                [VALUE_REGS, PRODUCER_REGS],
            )
        else:
            # The bf16 tile the consumers read with fp8 KV, widened:
            # K's scored columns, its rope columns (MLA; V is the
            # scored ones) or else V's rows. With bf16 KV they read the
            # ring's stages as they are.
            if KV_FP8:
                wide_nope = gl.allocate_shared_memory(gl.bfloat16, [TOKENS, D_NOPE], nope_smem)
                if MLA:
                    wide_rope = gl.allocate_shared_memory(gl.bfloat16, [TOKENS, D_ROPE], rope_smem)
                    wide_v = wide_nope
                else:
                    wide_rope = kv_rope_ring.index(0)  # never read: no rope
                    wide_v = gl.allocate_shared_memory(
                        gl.bfloat16,
                        [TOKENS, D_V],
                        gl.NVMMASharedLayout.get_default_for([TOKENS, D_V], gl.bfloat16),
                    )
                wide = (wide_nope, wide_rope, wide_v)
            else:
                wide = (kv_nope_ring, kv_rope_ring, v_ring)
            p_smem = gl.allocate_shared_memory(gl.bfloat16, [ROWS, TOKENS], rope_smem)
            fence_async_shared()
            gl.warp_specialize(
                [
                    (
                        _consume,
                        (
                            share,
                            q_args,
                            ext,
                            q_nope,
                            q_rope,
                            kv_nope_ring,
                            kv_rope_ring,
                            v_ring,
                            wide,
                            p_smem,
                            ready,
                            empty,
                            scales,
                            out_args,
                            masks,
                            BLOCK_H,
                            DRAFT_LEN,
                            V_EXT_FROM_K,
                            KV_FP8,
                            PREFIX_MASK,
                            DRAFT_MASK,
                        ),
                    ),
                    (_produce, produce_args),
                ],
                [PRODUCER_WARPS],
                [PRODUCER_REGS],
            )


def launch_prefix(
    q,
    k_buffer,
    v_buffer,
    k_extend,
    v_extend,
    o,
    qo_indptr,
    kv_indptr,
    kv_indices,
    part_o,
    part_lse,
    *,
    batch_size: int,
    draft_len: int,
    block_h: int,
    ctas: int,
    min_share: int,
    score_scale: float,
    draft_scale: float,
    v_scale: float,
    v_extend_scale: float,
    v_extend_from_k: bool,
    plan_block: int,
    score_value: bool,
    launch_dependents: bool,
    custom_mask=None,
    mask_indptr=None,
    prefix_mask: bool = False,
) -> None:
    """Stage 1 on sm90 on ``ctas`` CTAs per head block (of ``block_h``
    heads at ``draft_len`` drafts; a ragged batch's head blocks take as
    many as their aligned shares need), shares of at least ``min_share``
    positions (fewer shares on a small batch): writes the output of every request a
    share holds whole, and the partials (prefix values scaled by
    ``v_scale``, the drafts' by ``v_extend_scale``, nonzero, in fp32;
    drafts included) of the others, ``part_o`` / ``part_lse``
    rows ``(slot, head, draft)``, or ``(slot, tile row)`` in the RAGGED
    module (``hopper.partial_rows``). Request b has
    ``qo_indptr[b + 1] - qo_indptr[b]`` drafts, at most ``draft_len``.
    ``custom_mask`` (uint8, kernel.py's layout, with ``mask_indptr``)
    replaces the causal draft block, and its prefix bits are read too where
    ``prefix_mask``. ``score_value`` picks that schedule
    (``hopper.score_value_kv_dtypes``) over columns.
    ``launch_dependents``: stage 2 is a programmatic dependent launch and may
    go out at this grid's start. ``v_buffer``: V's cache, read only by a
    module for other head dims than MLA's (MLA reads V from K's rows). The
    module's RAGGED: some request may have fewer than ``draft_len`` drafts
    (its rows packed, its head blocks' shares aligned; each CTA orders the
    requests by draft count in ``part_o``'s rows past the partial rows,
    ``hopper.order_rows``). The module's PAGED: ``k_buffer`` is a paged
    cache seen as a page-size-1 pool, its pages of a multiple of TOKENS
    tokens, each request's ``kv_indices`` its pages' slots in order
    (``hopper.loads_pages`` says where that can be read by TMA)."""
    if score_value and k_buffer.element_size() != 1 and k_buffer.dtype != q.dtype:
        raise ValueError(
            f"score_value: needs KV in q's dtype {q.dtype} or fp8, got {k_buffer.dtype}"
        )
    draft_mask = custom_mask is not None
    num_heads = q.shape[1]
    head_blocks = hopper.head_blocks(num_heads, block_h)
    pages = _page_descriptors(k_buffer) if PAGED else (None, None)
    launcher.launch(
        _prefix_kernel_sm90,
        (head_blocks, ctas),
        q,
        k_buffer,
        v_buffer,
        k_extend,
        v_extend,
        o,
        qo_indptr,
        kv_indptr,
        kv_indices,
        # Without a mask the kernel takes kv_indptr in its place and never
        # reads it.
        custom_mask if draft_mask else kv_indptr,
        mask_indptr if draft_mask else kv_indptr,
        part_o,
        part_lse,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        v_buffer.stride(0),
        k_extend.stride(0),
        v_extend.stride(0),
        o.stride(0),
        o.stride(1),
        num_heads,
        batch_size,
        min_share,
        score_scale,
        draft_scale,
        v_scale / v_extend_scale,  # exactly v_scale for SGLang's calls (1.0)
        v_extend_scale,
        *pages,
        DRAFT_LEN=draft_len,
        BLOCK_H=block_h,
        BLOCK_B=plan_block,
        HEAD_BLOCKS=hopper.plan_width(head_blocks),
        PLAN_REQUESTS=hopper.plan_requests(head_blocks, plan_block),
        # With a V ring (not MLA) the drafts' V goes beside their K: one tile.
        V_EXT_FROM_K=v_extend_from_k or not _mla,
        SCORE_VALUE=score_value,
        LAUNCH_DEPENDENTS=launch_dependents,
        PREFIX_MASK=draft_mask and prefix_mask,
        DRAFT_MASK=draft_mask,
        **hopper.launch_options(score_value),
        **COMPILE_OPTIONS,
    )


@functools.cache
def page_layouts(kv_dtype) -> tuple[tuple[int, int, gl.NVMMASharedLayout], ...]:
    """The PAGED module's TMA copies of a tile (first column, columns,
    shared layout): K's latent and its rope columns, laid out as the ring
    is, for KV of ``kv_dtype`` (gl.bfloat16 or gl.float8e4nv). Cached:
    each paged launch reads them, and building a layout costs about 20 us
    of host time."""
    return tuple(
        (first, width, gl.NVMMASharedLayout.get_default_for([hopper.TOKENS, width], kv_dtype))
        for first, width in ((0, problem.D_NOPE), (problem.D_NOPE, problem.D_ROPE))
    )


def _page_descriptors(k_buffer):
    """TMA descriptors of a paged pool's K rows, a ring stage's tile of
    each of ``page_layouts``'s column ranges."""
    kv_dtype = gl.float8e4nv if k_buffer.element_size() == 1 else gl.bfloat16
    rows = k_buffer[:, 0]
    return tuple(
        TensorDescriptor.from_tensor(rows[:, first : first + width], [hopper.TOKENS, width], layout)
        for first, width, layout in page_layouts(kv_dtype)
    )
