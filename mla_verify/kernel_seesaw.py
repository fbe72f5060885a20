"""Stage 1 for paged MLA caches on Hopper (sm90): the seesaw schedule, in
Gluon. The same function as kernel_sm90's PAGED module, read straight from
the pages: no producer warps, no translated indices, the drafts' rows read
where the cache holds them.

Why. Score/value's compute-bound period is its chain: the score
warpgroup's softmax runs with the tensor cores idle, and each stage is held
from its arrival through both P V (RESULTS.md, "Where a compute-bound
tile's time goes"). The seesaw (FlashMLA's published schedule) overlaps one
warpgroup's softmax with the other's products. Its probe
(scripts/probe_seesaw_pages.py) ran stage 1 at 1.07-1.11x the paged
kernel's speed on the H200; this kernel, with the plan, the segments, the
masks and stage 2, runs 0.93-1.13x the translated call (RESULTS.md, "The
seesaw kernel on pages"); with its last pair peeled, its right warpgroup
adding P_A A_R before B's softmax (so that tile A is reloaded by mid-pair),
and its fixed part and stage 2 cut since, it runs ahead of the translated
call at every row count up to batch 512, so paged.seesaw_serves sends it
every bf16 call on pages of 64 or 128 (RESULTS.md, "The seesaw kernel at
every shape").

Each CTA holds 64 query rows (BLOCK_H heads x L drafts) in two
warpgroups of 240 registers. The left holds output columns 0-255, the right
256-511. Tiles of 64 tokens (a page of 64, half a page of 128) come in
pairs, A (ring stage 0) and B (stage 1); m is the running row max:

    left   S_A = Q A^T; m_A = max(m, max S_A); P_A = exp(S_A - m_A)
           (into A's spent rope rows); O_L = O_L e^(m - m_A) + P_A A_L
    right  S_B = Q B^T; takes m_A; issues O_R = O_R e^(m - m_A) + P_A A_R;
           m_B = max(m_A, max S_B); P_B = exp(S_B - m_B) (into B's rope
           rows); O_R = O_R e^(m_A - m_B) + P_B B_R
    left   O_L = O_L e^(m_A - m_B) + P_B B_L

Each stage's three column groups (latent 0-255, latent 256-511, rope) are
reloaded by TMA by the warpgroup whose product last read it, as soon as
that product is done; the scores wait for each group's copy in turn. A
segment of an odd tile count ends on a pair with no B. Each warpgroup
stages its own columns of a segment's query rows (the left 0-255, the
right the rest), and both wait for the other's (Q_READY). A segment's
results leave through the ring, free by then: each warpgroup regroups its
half in one stage, and the left copies the next segment's first tiles in
once the right has read its stage (SPENT).

The plan is kernel_sm90's, to the position (its helpers, imported): one
wave of CTAs a head block, the batch's positions (each sequence's prefix
tiles, then one for its drafts) cut into equal shares. So stage 2
(kernel._merge_shares_kernel) merges these partials unchanged. This
kernel is a programmatic dependent launch (WAIT_PRIOR), placed and set
up while the kernel before it runs, and it waits for that kernel before
it reads anything: paged's translation, which writes the indptrs the
plan reads; or, given a step's metadata (the plan read from it),
whatever the caller launched last, stage 2 of the layer before among
them, which lets it go as its programs start. A segment of sequence b
(its part of the CTA's share: prefix tokens lo .. hi - 1, and its drafts
where the share holds their position) reads the 64-token tiles of the
sequence that meet lo .. hi - 1, and with its drafts every tile up to
the sequence's end n = prefix + L, where the drafts live in the cache.
Draft i sees key p where lo <= p < hi, or with the drafts
p < prefix + 1 + i (bottom-right causal); tiles that reach outside that
window are masked. Rows of the last tile at n or past are not the sequence's: each
warpgroup zeroes them in its half of V before its product (P is 0 there,
but the rows may hold anything, NaN included).

Limits (paged.seesaw_serves): MLA, bf16 q and cache, pages of a multiple
of 64 tokens, token rows TMA can copy, every sequence with L drafts.
Gluon does not run under Triton's interpreter: CI compiles this kernel ahead
of time and the GPU tests check it against the reference.
"""

from __future__ import annotations

import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import constexpr_function

from . import hopper, launcher, problem
from .config import COMPILE_OPTIONS
from .kernel import PLAN_BLOCK, _dependent_options
from .kernel_sm90 import (
    _dest,
    _launch_dependents,
    _partial_rows,
    _request_positions,
    _segment,
    _share,
    _share_count,
    _store_lse,
    _tile_coords,
    _tma_load,
    _warps_barrier,
)

ROWS = gl.constexpr(hopper.ROWS)
TOKENS = gl.constexpr(hopper.TOKENS)
D_NOPE = gl.constexpr(problem.D_NOPE)
D_ROPE = gl.constexpr(problem.D_ROPE)
HALF = gl.constexpr(problem.D_NOPE // 2)  # output columns a warpgroup
GROUPS = gl.constexpr(3)  # column groups a stage: latent left, latent right, rope
WARPGROUP = gl.constexpr(hopper.WARPGROUP)
DRAFT_POSITIONS = gl.constexpr(hopper.DRAFT_POSITIONS)
REGS = gl.constexpr(240)  # each warpgroup's: no producer partition holds any
LAUNCH_OPTIONS = {"num_warps": 4, "maxnreg": REGS.value, **COMPILE_OPTIONS}
# Each warpgroup's layouts: a score tile, its half of the output, and P as
# the register A operand of P V.
S_LAYOUT = gl.constexpr(
    gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
)
O_LAYOUT = gl.constexpr(
    gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
)
P_LAYOUT = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT.value, k_width=2))
S_ROWS = gl.constexpr(gl.SliceLayout(1, S_LAYOUT.value))  # a score tile's row vectors
O_ROWS = gl.constexpr(gl.SliceLayout(1, O_LAYOUT.value))  # an output half's
# Barriers the warpgroups hand over on, one phase a pair (SCALE_A,
# SCALE_B), a B tile (P_B), or a segment (SUMS twice, Q_READY and SPENT
# once).
SCALE_A = gl.constexpr(0)  # m_A, e^(m - m_A) and P_A, from the left
SCALE_B = gl.constexpr(1)  # m_B, e^(m_A - m_B), from the right
P_B = gl.constexpr(2)  # P_B, from the right
SUMS = gl.constexpr(3)  # the right's row sums, then their total
Q_READY = gl.constexpr(4)  # both halves of the segment's query rows
SPENT = gl.constexpr(5)  # the right's output stores have read stage 1 (_store_half)
HANDS = gl.constexpr(6)


# --- loads -----------------------------------------------------------------------


@gluon.jit
def _slot(src, tile):
    # The pool row of the first token of the segment's tile `tile`: pages
    # of 2^page_shift tokens (64 or 128), so a shift and a mask.
    table_row, page_shift, slots_per_block, first, _ = src
    pos = first + tile * TOKENS
    return gl.load(table_row + (pos >> page_shift)) * slots_per_block + (
        pos & ((1 << page_shift) - 1)
    )


@gluon.jit
def _issue(src, slot, tile, group: gl.constexpr, ring, ready):
    # One column group of the segment's tile `tile` (its first token's
    # slot: _slot) into its stage (tile % 2) by TMA: 64 rows of one page.
    nope_ring, rope_ring = ring
    nope_desc, rope_desc = src[4]
    stage = tile % 2
    bar = ready.index(stage * GROUPS + group)
    if group == 2:
        mbarrier.expect(bar, TOKENS * D_ROPE * 2)
        _tma_load(rope_desc, [slot, 0], bar, rope_ring.index(stage))
    else:
        mbarrier.expect(bar, TOKENS * HALF * 2)
        dst = nope_ring.index(stage).slice(group * HALF, HALF, dim=1)
        _tma_load(nope_desc, [slot, group * HALF], bar, dst)


@gluon.jit
def _load_q(
    q_args,
    request,
    head_block,
    num_heads,
    col0,
    WIDTH: gl.constexpr,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
):
    # Query columns col0 .. col0 + WIDTH - 1 of the segment's rows, in
    # registers (rows past the request or the heads zero-filled), one load
    # for all of them: the right's 320 columns were staged 0.7 us sooner
    # than 64 at a time (the seesaw's stamps, H100). The left's 256 were
    # not: at a call's start every CTA loads its queries and first tiles at
    # once, and memory is the limit.
    Q, stride_q_tok, stride_q_head = q_args
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPGROUP, 1], [1, 0])
    offs_h, offs_i, mask_m, cols = _tile_coords(
        head_block, num_heads, request[1], col0, WIDTH, BLOCK_H, DRAFT_LEN, layout
    )
    rows = (request[0] + offs_i).to(gl.int64) * stride_q_tok + offs_h * stride_q_head
    return gl.load(Q + rows[:, None] + cols[None, :], mask=mask_m[:, None], other=0.0)


@gluon.jit
def _q_ready(hand, segment):
    # This warpgroup's query columns are in place, for wgmma (the async
    # proxy) to read; wait for the other's.
    fence_async_shared()
    _warps_barrier()
    mbarrier.arrive(hand.index(Q_READY), count=1)
    mbarrier.wait(hand.index(Q_READY), segment & 1)


# Views of the latent ring [2, 64, 512] bf16 under another type, shape and
# layout: 16 unswizzled int32 blocks [64, 32], a 64-column block of a stage
# each (_zero_rows_from), and a stage's 64 KB as a warpgroup's output half,
# fp32 or bf16 (_regrouped). Triton 3.9 names the view `reinterpret`, 3.6
# `_reinterpret`.
WORDS_SHAPE = gl.constexpr([2 * D_NOPE // 64, TOKENS, 32])
WORDS_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
if hasattr(gl.shared_memory_descriptor, "reinterpret"):

    @gluon.jit
    def _ring_as(nope_ring, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return nope_ring.reinterpret(dtype, shape, layout)

else:

    @gluon.jit
    def _ring_as(nope_ring, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return nope_ring._reinterpret(dtype, shape, layout)


@gluon.jit
def _zero_rows_from(nope_ring, stage, half: gl.constexpr, valid):
    # Rows valid .. 63 of a stage's latent half (0: columns 0-255, 1: the
    # rest) set to 0: positions past the sequence's end, whatever the page
    # holds there. The ring's 128-byte swizzle keeps each 64-column block
    # of a row in that row's own 128 bytes, and blocks lie one after
    # another (8 KB each), so rows are zeroed whole through an unswizzled
    # int32 view, one block at a time in a loop: about a third of the
    # code of the four swizzled blocks unrolled (the kernel 12% smaller),
    # in the peeled pair that each segment runs once.
    blocks: gl.constexpr = D_NOPE // 64
    words = _ring_as(nope_ring, gl.int32, WORDS_SHAPE, WORDS_LAYOUT)
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, TOKENS, layout=gl.SliceLayout(1, layout))
    first = stage * blocks + half * (blocks // 2)
    for k in range(blocks // 2):
        block = words.index(first + k)
        x = block.load(layout)
        block.store(gl.where(rows[:, None] < valid, x, gl.zeros_like(x)))
    fence_async_shared()
    _warps_barrier()


# --- scores ----------------------------------------------------------------------


@gluon.jit
def _scores(q, ring, ready, stage, phase, zero_s):
    # S = Q K^T over a stage's three column groups, each waited for in turn.
    q_nope, q_rope = q
    nope_ring, rope_ring = ring
    kv = nope_ring.index(stage)
    s = zero_s
    for k in gl.static_range(2):
        mbarrier.wait(ready.index(stage * GROUPS + k), phase)
        s = warpgroup_mma(
            q_nope.slice(k * HALF, HALF, dim=1),
            kv.slice(k * HALF, HALF, dim=1).permute((1, 0)),
            s,
            use_acc=k > 0,
            is_async=True,
        )
    mbarrier.wait(ready.index(stage * GROUPS + 2), phase)
    s = warpgroup_mma(q_rope, rope_ring.index(stage).permute((1, 0)), s, is_async=True)
    return warpgroup_mma_wait(0, deps=[s])


@gluon.jit
def _outside_window(window, tile_first):
    # Whether some key of the tile at tile_first is hidden from some row.
    lo, visible_to, _, _ = window
    return (tile_first < lo) | (tile_first + TOKENS > visible_to)


@gluon.jit
def _mask(s, window, tile_first, DRAFT_LEN: gl.constexpr):
    # Keys outside the segment's window to -inf: draft i sees p where
    # lo <= p < visible_to + causal * i.
    lo, visible_to, causal, _ = window
    drafts = gl.arange(0, ROWS, layout=S_ROWS) % DRAFT_LEN
    keys = tile_first + gl.arange(0, TOKENS, layout=gl.SliceLayout(0, S_LAYOUT))
    limit = visible_to + causal * drafts
    seen = (keys[None, :] >= lo) & (keys[None, :] < limit[:, None])
    return gl.where(seen, s, float("-inf"))


@gluon.jit
def _tile_scores(q, ring, ready, stage, phase, zero_s, window, tile_first, DRAFT_LEN: gl.constexpr):
    s = _scores(q, ring, ready, stage, phase, zero_s)
    if _outside_window(window, tile_first):
        s = _mask(s, window, tile_first, DRAFT_LEN)
    return s


@gluon.jit
def _segment_window(share, b, base, pages, DRAFT_LEN: gl.constexpr):
    # Sequence b's segment of the share (kernel_sm90._segment): its first
    # tile's position and tile count, its window (module docstring: lo, visible_to, causal, the
    # sequence's end n), where its tiles come from (_issue), and the rest
    # of _segment's answer.
    kv_start, lo, hi, with_drafts, whole, request, base = _segment(share, b, base)
    BLOCK_TABLE, stride_table, page_shift, slots_per_block, descs = pages
    prefix = request[2]
    seq_end = prefix + DRAFT_LEN
    end = gl.where(with_drafts, seq_end, hi)
    first = lo // TOKENS * TOKENS
    n_tiles = (end - first + TOKENS - 1) // TOKENS
    visible_to = gl.where(with_drafts, prefix + 1, hi)
    window = (lo, visible_to, with_drafts.to(gl.int32), seq_end)
    # int32 (paged.py sends no table of 2^31 entries): no 64-bit stride
    # held across the segment, where registers are short.
    table_row = BLOCK_TABLE + request[3] * stride_table
    src = (table_row, page_shift, slots_per_block, first, descs)
    return first, n_tiles, window, src, whole, request, base


# --- the two warpgroups ----------------------------------------------------------------
#
# Each segment's pairs but the last run in a loop that never meets the
# sequence's end: every pair has a B, and no row needs zeroing. The last
# pair (LAST) is compiled apart, after the loop, with the tail's checks.
# Kept out of the loop, the zeroing's code (half the loop's instructions
# inline) no longer sits between the pair's hot instructions: inline, the
# kernel stalled for instructions ten times as often as the probe
# (RESULTS.md, "The seesaw's last pair, peeled").


@gluon.jit
def _left(both, BLOCK_H: gl.constexpr, DRAFT_LEN: gl.constexpr):
    # Output columns 0-255 and the log2-sum-exp; tile A of each pair.
    share, q_args, out_args, bufs, pages, scale, v_scale, zero = both
    q_nope, q_rope, ring, ready, xchg, hand = bufs
    _, _, _, _, _, _, head_block, num_heads = out_args
    _, b0, b1, base, _, _, _ = share
    pairs_done = 0  # of earlier segments: the hand-overs' phases
    b_done = 0  # B tiles of earlier segments: stage 1's and P_B's phases
    for b in range(b0, b1 + 1):
        first, n_tiles, window, src, whole, request, base = _segment_window(
            share, b, base, pages, DRAFT_LEN
        )
        # The query columns' loads first: issued after the first tiles'
        # copies, they queued behind every CTA's copies and arrived 4.3 us
        # after them (RESULTS.md, "The seesaw's left query columns
        # first"). Stored once the copies are issued.
        q_left = _load_q(q_args, request, head_block, num_heads, 0, HALF, BLOCK_H, DRAFT_LEN)
        # Both stages are free: the right's last products are done (SUMS),
        # and its stores have read stage 1 (SPENT).
        if b > b0:
            mbarrier.wait(hand.index(SPENT), (b - b0 - 1) & 1)
        for t in gl.static_range(2):
            if t < n_tiles:
                slot = _slot(src, t)
                for group in gl.static_range(GROUPS):
                    _issue(src, slot, t, group, ring, ready)
        q_nope.index(0).slice(0, HALF, dim=1).store(q_left)
        _q_ready(hand, b - b0)
        acc = gl.zeros([ROWS, HALF], gl.float32, layout=O_LAYOUT)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=S_ROWS)
        l_i = gl.zeros([ROWS], gl.float32, layout=S_ROWS)
        seg = (first, n_tiles, window, src, pairs_done, b_done, scale, zero)
        pairs = (n_tiles + 1) // 2
        for pair in range(pairs - 1):
            acc, m_i, l_i = _left_pair(acc, m_i, l_i, pair, seg, bufs, False, DRAFT_LEN)
        if pairs > 0:
            acc, m_i, l_i = _left_pair(acc, m_i, l_i, pairs - 1, seg, bufs, True, DRAFT_LEN)
        pairs_done += pairs
        b_done += n_tiles // 2
        # The right's row sums are at the same max: add them.
        mbarrier.wait(hand.index(SUMS), 0)
        l_i = l_i + xchg[4].load(S_ROWS)
        xchg[5].store(l_i)
        _warps_barrier()
        mbarrier.arrive(hand.index(SUMS), count=1)
        dest = _dest(out_args, b, b0, whole, request)
        _store_lse(m_i, l_i, dest, BLOCK_H, DRAFT_LEN)
        out = acc * gl.convert_layout(v_scale / l_i, O_ROWS)[:, None]
        _store_half(out, 0, dest, ring[0], 0, BLOCK_H, DRAFT_LEN)


@gluon.jit
def _left_pair(acc, m_i, l_i, pair, seg, bufs, LAST: gl.constexpr, DRAFT_LEN: gl.constexpr):
    # The left's part of one pair: S_A and its softmax, P_A A_L, then
    # P_B B_L once the right hands over B's max and P_B.
    first, n_tiles, window, src, pairs_done, b_done, scale, zero = seg
    q_nope, q_rope, ring, ready, xchg, hand = bufs
    nope_ring, rope_ring = ring
    seq_end = window[3]
    a = 2 * pair
    # z = 0, but a value of the loop to ptxas: the wgmma descriptors of q
    # and of the stages, hoisted out of the loop where their stage is a
    # constant, spilled 30-40 registers a pair.
    z = pair & zero
    tile_a = first + a * TOKENS
    phase = (pairs_done + pair) & 1
    zero_s = gl.zeros([ROWS, TOKENS], gl.float32, layout=S_LAYOUT)
    s = _tile_scores(
        (q_nope.index(z), q_rope.index(z)),
        ring,
        ready,
        z,
        phase,
        zero_s,
        window,
        tile_a,
        DRAFT_LEN,
    )
    m_a = gl.maximum(m_i, gl.max(s, 1) * scale)
    alpha = gl.exp2(m_i - m_a)
    p = gl.exp2(s * scale - m_a[:, None])
    l_i = l_i * alpha + gl.sum(p, 1)
    p_bf16 = p.to(gl.bfloat16)
    # P_A at A's max into A's spent rope rows, for the right's P_A A_R
    # (wgmma: the async proxy reads it).
    rope_ring.index(z).store(p_bf16)
    xchg[0].store(m_a)
    xchg[1].store(alpha)
    fence_async_shared()
    _warps_barrier()
    mbarrier.arrive(hand.index(SCALE_A), count=1)
    acc = acc * gl.convert_layout(alpha, O_ROWS)[:, None]
    a_left = nope_ring.index(z).slice(0, HALF, dim=1)
    if LAST and tile_a + TOKENS > seq_end:
        _zero_rows_from(nope_ring, z, 0, seq_end - tile_a)
    acc = warpgroup_mma(gl.convert_layout(p_bf16, P_LAYOUT), a_left, acc)
    if not LAST:  # A_L is free, and the segment has a tile a + 2
        _issue(src, _slot(src, a + 2), a + 2, 0, ring, ready)
    mbarrier.wait(hand.index(SCALE_B), phase)
    m_i = xchg[2].load(S_ROWS)
    beta = xchg[3].load(S_ROWS)
    l_i = l_i * beta
    acc = acc * gl.convert_layout(beta, O_ROWS)[:, None]
    if (not LAST) or (a + 1 < n_tiles):
        mbarrier.wait(hand.index(P_B), (b_done + pair) & 1)
        b_left = nope_ring.index(z + 1).slice(0, HALF, dim=1)
        if LAST and tile_a + 2 * TOKENS > seq_end:
            _zero_rows_from(nope_ring, z + 1, 0, seq_end - tile_a - TOKENS)
        acc = warpgroup_mma(rope_ring.index(z + 1), b_left, acc)
        if not LAST and a + 3 < n_tiles:  # B_L and B's rope rows (P_B) are free
            slot = _slot(src, a + 3)
            _issue(src, slot, a + 3, 0, ring, ready)
            _issue(src, slot, a + 3, 2, ring, ready)
    return acc, m_i, l_i


@gluon.jit
def _right(both, BLOCK_H: gl.constexpr, DRAFT_LEN: gl.constexpr):
    # Output columns 256-511; tile B of each pair.
    share, q_args, out_args, bufs, pages, scale, v_scale, zero = both
    q_nope, q_rope, ring, ready, xchg, hand = bufs
    _, _, _, _, _, _, head_block, num_heads = out_args
    _, b0, b1, base, _, _, _ = share
    pairs_done = 0
    b_done = 0
    for b in range(b0, b1 + 1):
        first, n_tiles, window, src, whole, request, base = _segment_window(
            share, b, base, pages, DRAFT_LEN
        )
        q_right = _load_q(q_args, request, head_block, num_heads, HALF, HALF, BLOCK_H, DRAFT_LEN)
        q_pe = _load_q(q_args, request, head_block, num_heads, D_NOPE, D_ROPE, BLOCK_H, DRAFT_LEN)
        q_nope.index(0).slice(HALF, HALF, dim=1).store(q_right)
        q_rope.index(0).store(q_pe)
        _q_ready(hand, b - b0)
        acc = gl.zeros([ROWS, HALF], gl.float32, layout=O_LAYOUT)
        l_i = gl.zeros([ROWS], gl.float32, layout=S_ROWS)
        seg = (first, n_tiles, window, src, pairs_done, b_done, scale, zero)
        pairs = (n_tiles + 1) // 2
        for pair in range(pairs - 1):
            acc, l_i = _right_pair(acc, l_i, pair, seg, bufs, False, DRAFT_LEN)
        if pairs > 0:
            acc, l_i = _right_pair(acc, l_i, pairs - 1, seg, bufs, True, DRAFT_LEN)
        pairs_done += pairs
        b_done += n_tiles // 2
        xchg[4].store(l_i)
        _warps_barrier()
        mbarrier.arrive(hand.index(SUMS), count=1)
        mbarrier.wait(hand.index(SUMS), 1)
        l_i = xchg[5].load(S_ROWS)
        dest = _dest(out_args, b, b0, whole, request)
        out = acc * gl.convert_layout(v_scale / l_i, O_ROWS)[:, None]
        _store_half(out, HALF, dest, ring[0], 1, BLOCK_H, DRAFT_LEN)
        mbarrier.arrive(hand.index(SPENT), count=1)


@gluon.jit
def _right_pair(acc, l_i, pair, seg, bufs, LAST: gl.constexpr, DRAFT_LEN: gl.constexpr):
    # The right's part of one pair: S_B and its softmax at A's max handed
    # over, then P_A A_R and P_B B_R; a last pair with no B adds P_A A_R.
    first, n_tiles, window, src, pairs_done, b_done, scale, zero = seg
    q_nope, q_rope, ring, ready, xchg, hand = bufs
    nope_ring, rope_ring = ring
    a = 2 * pair
    z = pair & zero  # 0 (_left_pair)
    tile_a = first + a * TOKENS
    phase = (pairs_done + pair) & 1
    tiles = (ring, ready, src, a, n_tiles, z, tile_a, window[3])
    if (not LAST) or (a + 1 < n_tiles):
        zero_s = gl.zeros([ROWS, TOKENS], gl.float32, layout=S_LAYOUT)
        s = _tile_scores(
            (q_nope.index(z), q_rope.index(z)),
            ring,
            ready,
            z + 1,
            (b_done + pair) & 1,
            zero_s,
            window,
            tile_a + TOKENS,
            DRAFT_LEN,
        )
        mbarrier.wait(hand.index(SCALE_A), phase)
        m_a = xchg[0].load(S_ROWS)
        alpha = xchg[1].load(S_ROWS)
        # P_A A_R at A's max goes out before B's softmax and runs under it,
        # so that A_R and A's rope rows are reloaded by mid-pair: reloaded
        # after B's softmax, they landed past the next pair's start and
        # held up its scores (the probe's stamps, RESULTS.md "The seesaw's
        # right warpgroup adds P_A A_R before B's softmax").
        acc = acc * gl.convert_layout(alpha, O_ROWS)[:, None]
        acc = _right_issues_a(acc, tiles, LAST)
        m_b = gl.maximum(m_a, gl.max(s, 1) * scale)
        beta = gl.exp2(m_a - m_b)
        p = gl.exp2(s * scale - m_b[:, None])
        xchg[2].store(m_b)
        xchg[3].store(beta)
        _warps_barrier()
        mbarrier.arrive(hand.index(SCALE_B), count=1)
        l_i = l_i * (alpha * beta) + gl.sum(p, 1)
        p_bf16 = p.to(gl.bfloat16)
        rope_ring.index(z + 1).store(p_bf16)  # B's rope rows are spent
        fence_async_shared()
        _warps_barrier()
        mbarrier.arrive(hand.index(P_B), count=1)
        acc = _right_frees_a(acc, tiles, LAST)
        acc = acc * gl.convert_layout(beta, O_ROWS)[:, None]
        acc = _right_adds_b(acc, p_bf16, tiles, LAST)
    else:  # a last pair with no B: m_B = m_A
        mbarrier.wait(hand.index(SCALE_A), phase)
        m_a = xchg[0].load(S_ROWS)
        alpha = xchg[1].load(S_ROWS)
        beta = gl.full([ROWS], 1.0, gl.float32, layout=S_ROWS)
        xchg[2].store(m_a)
        xchg[3].store(beta)
        _warps_barrier()
        mbarrier.arrive(hand.index(SCALE_B), count=1)
        l_i = l_i * alpha
        acc = acc * gl.convert_layout(alpha, O_ROWS)[:, None]
        acc = _right_issues_a(acc, tiles, LAST)
        acc = _right_frees_a(acc, tiles, LAST)
    return acc, l_i


@gluon.jit
def _right_issues_a(acc, tiles, LAST: gl.constexpr):
    # O_R += P_A A_R, P_A (the left's, at A's max) read where the left
    # stored it, A's rope rows, issued: _right_frees_a waits for it. (From
    # registers, P_A stayed live through B's softmax: triton 3.9's build
    # then spilled in the pair loop.)
    ring, ready, src, a, n_tiles, z, tile_a, seq_end = tiles
    nope_ring, rope_ring = ring
    a_right = nope_ring.index(z).slice(HALF, HALF, dim=1)
    if LAST and tile_a + TOKENS > seq_end:
        _zero_rows_from(nope_ring, z, 1, seq_end - tile_a)
    return warpgroup_mma(rope_ring.index(z), a_right, acc, is_async=True)


@gluon.jit
def _right_frees_a(acc, tiles, LAST: gl.constexpr):
    # P_A A_R done: A_R and A's rope rows (P_A) are free.
    ring, ready, src, a, n_tiles, z, tile_a, seq_end = tiles
    acc = warpgroup_mma_wait(0, deps=[acc])
    if not LAST:  # the segment has a tile a + 2
        slot = _slot(src, a + 2)
        _issue(src, slot, a + 2, 1, ring, ready)
        _issue(src, slot, a + 2, 2, ring, ready)
    return acc


@gluon.jit
def _right_adds_b(acc, p_bf16, tiles, LAST: gl.constexpr):
    # O_R += P_B B_R; then B_R is free.
    ring, ready, src, a, n_tiles, z, tile_a, seq_end = tiles
    nope_ring, rope_ring = ring
    b_right = nope_ring.index(z + 1).slice(HALF, HALF, dim=1)
    if LAST and tile_a + 2 * TOKENS > seq_end:
        _zero_rows_from(nope_ring, z + 1, 1, seq_end - tile_a - TOKENS)
    acc = warpgroup_mma(gl.convert_layout(p_bf16, P_LAYOUT), b_right, acc)
    if not LAST and a + 3 < n_tiles:
        _issue(src, _slot(src, a + 3), a + 3, 1, ring, ready)
    return acc


# --- a segment's results ------------------------------------------------------------


STORE_ROWS = gl.constexpr(16)  # rows a step of _store_half


@constexpr_function
def _piece(dtype):
    # Values in a 16-byte piece of a row: 4 fp32 or 8 bf16.
    return 128 // dtype.primitive_bitwidth


@constexpr_function
def _half_layout(dtype):
    # A warpgroup's output half in shared memory, XOR-swizzled by the row's
    # low bits in 16-byte pieces: the eight rows a warp's accumulator store
    # touches land in different banks, and a warp reading 512 contiguous
    # bytes of a row meets no conflict either.
    return gl.SwizzledSharedLayout(_piece(dtype), 1, 8, [1, 0])


@constexpr_function
def _pieces_layout(dtype):
    # Rows of 16-byte pieces, a warp across a row.
    return gl.BlockedLayout([1, _piece(dtype)], [1, 32], [hopper.WARPGROUP, 1], [1, 0])


@gluon.jit
def _regrouped(x, nope_ring, stage: gl.constexpr):
    # x, a warpgroup's [64, 256] half, written into latent stage `stage`
    # (its 64 KB: one fp32 half or two bf16), then read back STORE_ROWS rows
    # at a time, in a loop: the ring seen again as blocks of 16 rows under
    # the same swizzle, which repeats every 8 rows. Returns those blocks and
    # the first of this stage's. (The whole half read at once, or the steps
    # unrolled, spilled registers outside the pair loops.)
    per_stage: gl.constexpr = 4 // (x.dtype.primitive_bitwidth // 8)
    layout: gl.constexpr = _half_layout(x.dtype)
    halves = _ring_as(nope_ring, x.dtype, [2 * per_stage, ROWS, HALF], layout)
    halves.index(per_stage * stage).store(x)
    _warps_barrier()
    steps: gl.constexpr = ROWS // STORE_ROWS
    blocks = _ring_as(nope_ring, x.dtype, [2 * per_stage * steps, STORE_ROWS, HALF], layout)
    return blocks, per_stage * stage * steps


@gluon.jit
def _chunk_rows(
    head_block,
    num_heads,
    num_rows,
    r0,
    BLOCK_H: gl.constexpr,
    DRAFT_LEN: gl.constexpr,
    layout: gl.constexpr,
):
    # Head, draft and mask of tile rows r0 .. r0 + STORE_ROWS - 1, as
    # kernel_sm90._row_coords numbers a whole tile's (without RAGGED: the
    # seesaw serves only batches whose sequences all have L drafts).
    offs_m = r0 + gl.arange(0, STORE_ROWS, layout=gl.SliceLayout(1, layout))
    offs_h = head_block * BLOCK_H + offs_m // DRAFT_LEN
    offs_i = offs_m % DRAFT_LEN
    mask_m = (offs_m < BLOCK_H * DRAFT_LEN) & (offs_h < num_heads) & (offs_i < num_rows)
    return offs_h, offs_i, mask_m


@gluon.jit
def _store_half(
    out, col0, dest, nope_ring, stage: gl.constexpr, BLOCK_H: gl.constexpr, DRAFT_LEN: gl.constexpr
):
    # A warpgroup's output columns col0 .. col0 + 255 (kernel_sm90._store_out's
    # rows: the output in bf16 for a whole request, else the fp32 partial),
    # regrouped through latent stage `stage` into 16-byte pieces of rows.
    # Stored straight from the accumulator's layout, each warp's store wrote
    # 4 or 8 bytes in each of eight rows: eight 128-byte lines an
    # instruction, and the stores of a segment's end took about 7 us on an
    # H100 (the seesaw's stamps, RESULTS.md). After SUMS the stage is free:
    # every product has read it, and no copy is on its way. Ends with the
    # stage read, for the next segment's copies (the right then arrives
    # SPENT).
    whole, O, stride_o_tok, stride_o_head, PART_O, _, request, slot, head_block, num_heads = dest
    steps: gl.constexpr = ROWS // STORE_ROWS
    if whole:
        bf16_blocks, first = _regrouped(out.to(gl.bfloat16), nope_ring, stage)
        layout: gl.constexpr = _pieces_layout(gl.bfloat16)
        cols = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
        for k in range(steps):
            offs_h, offs_i, mask_m = _chunk_rows(
                head_block, num_heads, request[1], k * STORE_ROWS, BLOCK_H, DRAFT_LEN, layout
            )
            bf16_rows = bf16_blocks.index(first + k).load(layout)
            o_row = (request[0] + offs_i).to(gl.int64) * stride_o_tok + offs_h * stride_o_head
            gl.store(O + o_row[:, None] + cols[None, :], bf16_rows, mask=mask_m[:, None])
    else:
        fp32_blocks, part_first = _regrouped(out, nope_ring, stage)
        wide: gl.constexpr = _pieces_layout(gl.float32)
        part_cols = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, wide))
        for k in range(steps):
            part_h, part_i, part_mask = _chunk_rows(
                head_block, num_heads, request[1], k * STORE_ROWS, BLOCK_H, DRAFT_LEN, wide
            )
            part_row = _partial_rows(
                slot, part_h, part_i, num_heads, BLOCK_H, DRAFT_LEN, gl.SliceLayout(1, wide)
            )
            fp32_rows = fp32_blocks.index(part_first + k).load(wide)
            part_o = PART_O + part_row[:, None] * D_NOPE + part_cols[None, :]
            # evict_last in L2: stage 2 reads the partials right after, and
            # with the cache's default priority the latent stream behind
            # them wrote them back to DRAM first (9.5-9.8 MB of 10.5 at H16
            # L2 B32 with 2K contexts, an H100's ncu; 2.2-2.3 MB with this
            # hint). They stay in L2 until the next call rewrites them.
            gl.store(part_o, fp32_rows, mask=part_mask[:, None], eviction_policy="evict_last")
    fence_async_shared()
    _warps_barrier()


# --- the plan -----------------------------------------------------------------------

PLAN_FIELDS = gl.constexpr(8)  # int32s a CTA's planned share takes (_plan's seven, padded)


@gluon.jit
def _plan(KV_INDPTR, QO_INDPTR, batch_size, min_share, cta, BLOCK_B: gl.constexpr):
    # kernel_sm90's plan for a batch whose sequences all have L drafts: the
    # same shares, so that stage 2 finds the same partials. The CTAs a head
    # block that hold a share, and CTA cta's (kernel_sm90._share: its first
    # and last request, where the first one's positions begin, its
    # positions s0 .. s1 - 1, and the drafts' positions a request).
    plan_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPGROUP], [0])
    total = 0
    most = 0
    for start in range(0, batch_size, BLOCK_B):
        offs = start + gl.arange(0, BLOCK_B, layout=plan_layout)
        positions = _request_positions(KV_INDPTR, QO_INDPTR, offs, offs < batch_size, 0, 1)
        total += gl.sum(positions, 0)
        most = gl.maximum(most, gl.max(positions, 0))
    uniform = most.to(gl.int64) * batch_size == total
    drafts = DRAFT_POSITIONS
    if uniform:
        drafts = 1
    total += (drafts - 1) * batch_size
    ctas = _share_count(gl.num_programs(1), total, uniform, batch_size, min_share)
    s0 = (cta.to(gl.int64) * total // ctas).to(gl.int32)
    s1 = ((cta + 1).to(gl.int64) * total // ctas).to(gl.int32)
    share_block = (KV_INDPTR, QO_INDPTR, 0, QO_INDPTR, 0)  # no RAGGED: no first row read
    _, b0, b1, base0, _, _, _ = _share(
        share_block, batch_size, drafts, s0, s1, BLOCK_B, plan_layout
    )
    return ctas, b0, b1, base0, s0, s1, drafts


@gluon.jit
def _planned(PLAN, cta):
    # _plan's answer for CTA cta, as _plan_kernel stored it.
    row = PLAN + cta * PLAN_FIELDS
    return (
        gl.load(row),
        gl.load(row + 1),
        gl.load(row + 2),
        gl.load(row + 3),
        gl.load(row + 4),
        gl.load(row + 5),
        gl.load(row + 6),
    )


@gluon.jit(do_not_specialize=["batch_size", "min_share"])
def _plan_kernel(PLAN, QO_INDPTR, KV_INDPTR, batch_size, min_share, BLOCK_B: gl.constexpr):
    # Each CTA's share of the seesaw kernel's grid (1 x its CTAs a head
    # block: the plan is the same for every head block), for a step's
    # metadata: the seesaw kernel then reads it (PLANNED) instead of
    # planning at its start.
    cta = gl.program_id(1)
    ctas, b0, b1, base0, s0, s1, drafts = _plan(
        KV_INDPTR, QO_INDPTR, batch_size, min_share, cta, BLOCK_B
    )
    row = PLAN + cta * PLAN_FIELDS
    gl.store(row, ctas)
    gl.store(row + 1, b0)
    gl.store(row + 2, b1)
    gl.store(row + 3, base0)
    gl.store(row + 4, s0)
    gl.store(row + 5, s1)
    gl.store(row + 6, drafts)


# --- the kernel --------------------------------------------------------------------


@gluon.jit
def _grid_wait():
    # PTX griddepcontrol.wait, as kernel_sm90._launch_dependents: until the
    # grid this one depends on has finished and its writes are visible.
    gl.inline_asm_elementwise(
        "griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit(do_not_specialize=["batch_size", "min_share", "page_shift", "slots_per_block"])
def _seesaw_kernel(
    Q,
    O,
    QO_INDPTR,
    KV_INDPTR,
    BLOCK_TABLE,
    PART_O,
    PART_LSE,
    PLAN,
    nope_desc,
    rope_desc,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_table,
    page_shift,
    slots_per_block,
    num_heads,
    batch_size,
    min_share,
    scale,
    v_scale,
    zero,
    DRAFT_LEN: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_B: gl.constexpr,
    WAIT_PRIOR: gl.constexpr,
    LAUNCH_DEPENDENTS: gl.constexpr,
    PLANNED: gl.constexpr,
):
    nope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D_NOPE], gl.bfloat16)
    rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D_ROPE], gl.bfloat16)
    # q [1, ...]: indexed by a loop value (_left's z).
    q_nope = gl.allocate_shared_memory(gl.bfloat16, [1, ROWS, D_NOPE], nope_layout)
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [1, ROWS, D_ROPE], rope_layout)
    nope_ring = gl.allocate_shared_memory(gl.bfloat16, [2, TOKENS, D_NOPE], nope_layout)
    rope_ring = gl.allocate_shared_memory(gl.bfloat16, [2, TOKENS, D_ROPE], rope_layout)
    # Row vectors handed over: m_A, e^(m - m_A), m_B, e^(m_A - m_B),
    # the right's row sums, their total. An allocation each: in one,
    # a store to one row after a load or store of another took a
    # warpgroup barrier (the compiler's hazard check sees the whole
    # allocation).
    vector: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    xchg = (
        gl.allocate_shared_memory(gl.float32, [ROWS], vector),
        gl.allocate_shared_memory(gl.float32, [ROWS], vector),
        gl.allocate_shared_memory(gl.float32, [ROWS], vector),
        gl.allocate_shared_memory(gl.float32, [ROWS], vector),
        gl.allocate_shared_memory(gl.float32, [ROWS], vector),
        gl.allocate_shared_memory(gl.float32, [ROWS], vector),
    )
    ready = gl.allocate_shared_memory(gl.int64, [2 * GROUPS, 1], mbarrier.MBarrierLayout())
    hand = gl.allocate_shared_memory(gl.int64, [HANDS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2 * GROUPS):
        mbarrier.init(ready.index(i), count=1)  # a TMA copy's expect
    for i in gl.static_range(HANDS):
        mbarrier.init(hand.index(i), count=2 if i == Q_READY else 1)
    fence_async_shared()
    _warps_barrier()
    if WAIT_PRIOR:
        # The kernel before may write what this one reads (the indptrs, q,
        # the drafts' rows): the CTA was placed and set up while it ran.
        _grid_wait()
    if LAUNCH_DEPENDENTS:
        # Stage 2 may launch from here (kernel_sm90's reason), not before
        # the wait: it reads the indptrs before its own.
        _launch_dependents()
    head_block = gl.program_id(0)
    cta = gl.program_id(1)
    if PLANNED:  # a step's metadata holds each CTA's share (_plan_kernel)
        ctas, b0, b1, base0, s0, s1, drafts = _planned(PLAN, cta)
    else:
        ctas, b0, b1, base0, s0, s1, drafts = _plan(
            KV_INDPTR, QO_INDPTR, batch_size, min_share, cta, BLOCK_B
        )
    share_block = (KV_INDPTR, QO_INDPTR, 0, QO_INDPTR, head_block * BLOCK_H * DRAFT_LEN)
    if cta < ctas:
        share = (share_block, b0, b1, base0, s0, s1, drafts)
        q_args = (Q, stride_q_tok, stride_q_head)
        out_args = (O, stride_o_tok, stride_o_head, PART_O, PART_LSE, cta, head_block, num_heads)
        bufs = (q_nope, q_rope, (nope_ring, rope_ring), ready, xchg, hand)
        pages = (BLOCK_TABLE, stride_table, page_shift, slots_per_block, (nope_desc, rope_desc))
        both = (share, q_args, out_args, bufs, pages, scale, v_scale, zero)
        gl.warp_specialize(
            [(_left, (both, BLOCK_H, DRAFT_LEN)), (_right, (both, BLOCK_H, DRAFT_LEN))],
            [WARPGROUP],
            [REGS],
        )


# --- the host ----------------------------------------------------------------------


@functools.cache
def page_layouts() -> tuple[tuple[int, int, int, gl.NVMMASharedLayout], ...]:
    """The TMA copies of a tile (first column, columns, box columns, shared
    layout): a latent half, and the rope columns. Cached: building a layout
    costs about 20 us of host time."""
    return tuple(
        (first, width, box, gl.NVMMASharedLayout.get_default_for([hopper.TOKENS, box], gl.bfloat16))
        for first, width, box in (
            (0, problem.D_NOPE, problem.D_NOPE // 2),
            (problem.D_NOPE, problem.D_ROPE, problem.D_ROPE),
        )
    )


def page_descriptors(pool):
    """TMA descriptors of a paged pool's token rows [slots, 576]."""
    return tuple(
        TensorDescriptor.from_tensor(pool[:, first : first + width], [hopper.TOKENS, box], layout)
        for first, width, box, layout in page_layouts()
    )


def launch(
    q,
    pool,
    block_table,
    o,
    qo_indptr,
    kv_indptr,
    part_o,
    part_lse,
    *,
    page_size: int,
    slots_per_block: int,
    batch_size: int,
    draft_len: int,
    block_h: int,
    ctas: int,
    min_share: int,
    score_scale: float,
    v_scale: float,
    wait_prior: bool,
    launch_dependents: bool,
    plan=None,
) -> None:
    """Stage 1 over a paged cache, ``pool`` its token rows [slots, 576]
    (block n's page from slot n * ``slots_per_block``), on ``ctas`` CTAs a
    head block of ``block_h`` heads: kernel_sm90.launch_prefix's plan and
    partials (``part_o`` / ``part_lse`` rows (slot, head, draft)), for
    ``q`` [bs * L, H, 576] and ``o`` [bs * L, H, 512]; ``kv_indptr`` holds
    the prefix lengths (cache_seqlens - L) prefix-summed. ``score_scale``
    is in the log2 domain. ``wait_prior``: a programmatic dependent launch
    of the kernel before it (paged's translation, which writes the
    indptrs, or any other), waited for before anything is read.
    ``launch_dependents``: stage 2 is one of
    this kernel, let go once the indptrs are readable. ``plan``: each CTA's
    share as ``launch_plan`` wrote it for this grid, read instead of
    planned."""
    if page_size & (page_size - 1):  # the kernel finds pages by a shift
        raise ValueError(f"page_size: expected a power of two, got {page_size}")
    head_blocks = hopper.head_blocks(q.shape[1], block_h)
    nope_desc, rope_desc = page_descriptors(pool)
    launcher.launch(
        _seesaw_kernel,
        (head_blocks, ctas),
        q,
        o,
        qo_indptr,
        kv_indptr,
        block_table,
        part_o,
        part_lse,
        kv_indptr if plan is None else plan,  # PLAN: not read unless planned
        nope_desc,
        rope_desc,
        q.stride(0),
        q.stride(1),
        o.stride(0),
        o.stride(1),
        block_table.stride(0),
        page_size.bit_length() - 1,  # page_shift
        slots_per_block,
        q.shape[1],
        batch_size,
        min_share,
        score_scale,
        v_scale,
        0,
        DRAFT_LEN=draft_len,
        BLOCK_H=block_h,
        BLOCK_B=PLAN_BLOCK,
        WAIT_PRIOR=wait_prior,
        LAUNCH_DEPENDENTS=launch_dependents,
        PLANNED=plan is not None,
        **_dependent_options(wait_prior),
        **LAUNCH_OPTIONS,
    )


def plan_numel(ctas: int) -> int:
    """int32s of ``launch_plan``'s plan for a grid of ``ctas`` CTAs a head
    block."""
    return ctas * PLAN_FIELDS.value


def launch_plan(plan, qo_indptr, kv_indptr, *, batch_size: int, ctas: int, min_share: int):
    """Each CTA's share of ``launch``'s grid (``ctas`` CTAs a head block,
    shares of ``min_share`` positions at least) into ``plan``
    [plan_numel(ctas)] int32, from the indptrs: for a step's metadata, so
    that every layer's launch reads its share instead of planning it."""
    launcher.launch(
        _plan_kernel,
        (1, ctas),
        plan,
        qo_indptr,
        kv_indptr,
        batch_size,
        min_share,
        BLOCK_B=PLAN_BLOCK,
        num_warps=4,
        **COMPILE_OPTIONS,
    )
