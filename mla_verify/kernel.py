"""Triton kernels for target-verify attention with one KV head shared by
every query head: absorbed MLA (q/k 576 = 512 latent + 64 rope, V the first
512 latent columns) and ordinary attention (q/k = v = 256 or 128, no rope).

Tensors (T query rows, bs requests, request b owning E_b = qo_indptr[b+1] -
qo_indptr[b] of them, 1 <= E_b <= L; H heads; Dqk = Dv + Drope; P_b prefix
tokens; U = bs * NUM_KV_SPLITS work units):
    q        [T, H, Dqk]      query rows, request b owns rows qo_indptr[b] .. + E_b
    k_buffer [slots, 1, Dqk]  paged KV pool, page size 1
    v_buffer [slots, 1, Dv]   a pool of its own, or the view k_buffer[..., :Dv]
    k_ext    [T, 1, Dqk]      the drafts' own K
    v_ext    [T, 1, Dv]
    mask     flat uint8, optional: request b's row i sees key j (its P_b
             prefix keys, then its E_b drafts) where
             mask[mask_indptr[b] + i * (P_b + E_b) + j] != 0
    o        [T, H, Dv]
    part_o   [U, H, L, Dv]    fp32 workspace: normalised output of each slot
                              (a unit's segment of one request)
    part_lse [U, H, L]        fp32 workspace: log2-sum-exp2 of each slot
             (the Hopper kernel: U = 2 slots a CTA of a head block; with
             ragged drafts [2 x its grid, BLOCK_H x L] rows, see
             hopper.partial_rows)

Algorithm: the requests' prefixes are laid end to end, one stream of
tokens, cut into batch x (NUM_KV_SPLITS - 1) equal shares (BLOCK_N-aligned);
stage 1 runs one program per (head block, unit), and unit u streams share u
once for BLOCK_H heads x L drafts (rows past a request's E_b masked), with
an online softmax, one segment for each request its share meets, whose
partial goes to slot u + b (at most U - 1); stage 2 runs one program per
(request, head), merges the request's segments and adds the E_b x E_b
draft-draft block: causal, or as the mask says. With a mask, stage 1 also
reads its tile's prefix bits (E_b bytes a token), unless the caller takes
the prefix as visible to every row. Every unit thus holds the same work
whatever the lengths: a long request among short ones spreads over many
units, and short ones share one (as FlashMLA plans on the GPU), with no
host sync: both stages derive the plan and the draft counts from the
indptrs on the device. A uniform batch whose length NUM_KV_SPLITS - 1
BLOCK_N-tiles divide gets NUM_KV_SPLITS - 1 units a request, each inside
one request.

On sm90, a config with kernel="gluon_sm90" or "gluon_sm90_sv" runs stage 1
as the Gluon kernel of kernel_sm90.py instead (two schedules; for 256/256
and 128/128 a module of that source of its own, hopper.gluon_kernel), with its own
plan: balanced shares of the batch's tiles on one wave of CTAs, each
request's drafts folded in (kernel_sm90's docstring). NUM_KV_SPLITS then
plays no part, MIN_SHARE sets the smallest share; stage 2 is then
_merge_shares_kernel, one program per (request, head, column block), which
merges only the requests that several shares hold (stage 1 writes the
others).

On CUDA sm90 and later, stage 2 is a programmatic dependent launch
(plan.dependent_launch): its programs plan on the SMs stage 1's CTAs free as
they exit, and wait for the whole grid in the kernel before reading a
partial.

fp8 e4m3 KV is widened to bf16 in registers after its load, on NVIDIA by
PTX integer ops (E4M3_TO_BF16_PTX), not Triton's conversion, which runs on
the slow conversion pipe (1.05-1.28x faster on the H200's fp8 rows).

Scores are kept in the log2 domain (exp2 is one instruction). Units past
the batch's work are neither written nor read: stale workspace never leaks.
A row the mask hides every key of a segment from holds weight 0 there; a row
that sees no key at all gets output 0.
Limits: one KV head; page size 1; the Hopper kernel takes MLA, 256/256 and
128/128 calls, bf16 or fp8 KV (ragged and masked ones too: plan.py,
hopper.supports), this one every call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from . import fp8, hopper, launcher
from .config import COMPILE_OPTIONS, rows_per_program, value_chunk

LOG2E = 1.4426950408889634
PLAN_BLOCK = 128  # requests the work plan reads per step
# Stage 2 after the Triton kernel: one program per (request, head), all Dv
# columns, unpipelined, measured fastest: splitting the columns repeats the
# draft block and the plan; pipelining the unit loop, and blocks of heads per
# program, never paid. Its unit loop takes 16 // next_pow2(L) units per load
# (the slots of _merge_pieces).
MERGE_WARPS = 4
# fp32 elements of one load of stage 2 after the shares (its tile: pieces x
# drafts rows, a block of columns): 16 a thread. The units' merge tile of
# 8192 took 168-255 registers (ptxas, sm90), two or three programs an SM for
# a merge of a few small pieces bound by latency.
MERGE_SHARES_TILE = 2048
# Column blocks of stage 2 after the shares (plan.merge_column_blocks):
# about this many partial elements a program (pieces x drafts x columns), at
# least this many programs for one request (so a long request among short
# ones still spreads over half the SMs), at most this many in all (a large
# batch's programs mostly find their request whole and only pay the plan).
# Fitted to A/Bs on the H200 (commit 6bca2a0): programs bound by latency
# cost more than narrow tiles save.
MERGE_PROGRAM_ELEMENTS = 8192
MERGE_REQUEST_PROGRAMS = 64
MERGE_MAX_PROGRAMS = 4096
MERGE_MAX_BLOCKS = 16  # 32 columns a block
# A request of at most MERGE_WIDE_PIECES pieces is merged in tiles of
# MERGE_SHARES_WIDE_TILE elements (all its pieces and drafts, as many
# columns as fit), by as few programs as that takes; the grid's other
# column blocks end at once. On the H200 a batch of 64 requests of 2-3
# pieces each merged by 4096 programs of 64 columns took 22 us (Nsight
# Compute), merged wide 11 (RESULTS.md, "Stage 2's programs").
MERGE_WIDE_PIECES = 4
MERGE_SHARES_WIDE_TILE = 4096


@triton.jit
def _unit_shares(KV_INDPTR, batch_size, num_kv_splits, BLOCK_N: tl.constexpr):
    # The batch's prefix tokens, requests laid end to end: the first
    # request's offset in the pool's indices, the tokens in all, and the
    # tokens a unit's share holds: batch x (NUM_KV_SPLITS - 1) equal
    # shares, BLOCK_N-aligned (a uniform batch's shares then fall on
    # request boundaries where its lengths allow), so that a share's index
    # plus its requests' (at most the shares + the batch - 1 slots in all)
    # fits the batch x NUM_KV_SPLITS units.
    base = tl.load(KV_INDPTR)
    total = (tl.load(KV_INDPTR + batch_size) - base).to(tl.int32)
    shares = tl.maximum(batch_size * (num_kv_splits - 1), 1)
    share = tl.maximum(tl.cdiv(tl.cdiv(total, shares), BLOCK_N), 1) * BLOCK_N
    return base, total, share


@triton.jit
def _prefix_lens(KV_INDPTR, offs_b, mask_b):
    # Prefix lengths of requests offs_b (0 where masked), in int32 whatever
    # the index dtype: loop-carried types must not change.
    lens = tl.load(KV_INDPTR + offs_b + 1, mask=mask_b, other=0) - tl.load(
        KV_INDPTR + offs_b, mask=mask_b, other=0
    )
    return lens.to(tl.int32)


@triton.jit
def _requests_met(KV_INDPTR, batch_size, pos_lo, pos_hi, BLOCK_B: tl.constexpr):
    # The first and the last request whose prefixes meet the batch's prefix
    # tokens pos_lo .. pos_hi - 1 (pos_lo < pos_hi; requests between them
    # may have none), prefixes laid end to end in request order.
    base = tl.load(KV_INDPTR)
    first = 0
    last = 0
    for start in range(0, batch_size, BLOCK_B):
        offs_b = start + tl.arange(0, BLOCK_B)
        mask_b = offs_b < batch_size
        ends = (tl.load(KV_INDPTR + offs_b + 1, mask=mask_b, other=0) - base).to(tl.int32)
        first += tl.sum(((ends <= pos_lo) & mask_b).to(tl.int32), 0)
        last += tl.sum(((ends < pos_hi) & mask_b).to(tl.int32), 0)
    return first, last


@triton.jit
def _ahead_in_order(rows, offs_b, own, req):
    # Whether requests offs_b, of `rows` drafts, come before request req,
    # of `own`, in a RAGGED call's order (plan.ragged_order: more drafts
    # first, then by index).
    return (rows > own) | ((rows == own) & (offs_b < req))


@triton.jit
def _share_positions(
    KV_INDPTR,
    QO_INDPTR,
    req,
    own,
    batch_size,
    last_rows,
    BLOCK_B: tl.constexpr,
    TOKENS: tl.constexpr,
    DRAFT_POSITIONS: tl.constexpr,
    RAGGED: tl.constexpr,
):
    # The Hopper kernel's positions where every request has heads in every
    # head block (kernel_sm90's plan: each request's prefix tiles of
    # TOKENS, then its drafts, DRAFT_POSITIONS in a ragged batch, one in a
    # uniform one; a RAGGED call's requests in plan.ragged_order): those of
    # the requests before req, req's own and the batch's; whether every
    # request holds as many; the drafts'; and, where the call is RAGGED,
    # the fewest drafts of any request (req's own: `own`). A RAGGED call
    # with a request of fewer than last_rows drafts (no rows in the last
    # head block) has aligned shares, which cut requests wherever they
    # fall: its drafts weigh DRAFT_POSITIONS whatever the tiles.
    before = 0
    ahead_count = 0
    mine = 0
    total = 0
    most = 0
    fewest = 0
    if RAGGED:
        fewest = (tl.load(QO_INDPTR + 1) - tl.load(QO_INDPTR)).to(tl.int32)
    for start in range(0, batch_size, BLOCK_B):
        offs_b = start + tl.arange(0, BLOCK_B)
        mask_b = offs_b < batch_size
        lens = _prefix_lens(KV_INDPTR, offs_b, mask_b)
        positions = tl.where(mask_b, tl.cdiv(lens, TOKENS) + 1, 0)
        ahead = offs_b < req
        if RAGGED:
            rows = tl.where(mask_b, _prefix_lens(QO_INDPTR, offs_b, mask_b), fewest)
            fewest = tl.minimum(fewest, tl.min(rows, 0))
            ahead = _ahead_in_order(rows, offs_b, own, req)
        ahead &= mask_b
        before += tl.sum(tl.where(ahead, positions, 0), 0)
        ahead_count += tl.sum(ahead.to(tl.int32), 0)
        mine += tl.sum(tl.where(offs_b == req, positions, 0), 0)
        total += tl.sum(positions, 0)
        most = tl.maximum(most, tl.max(positions, 0))
    uniform = most.to(tl.int64) * batch_size == total  # int64: no wrap to equal
    if RAGGED:
        uniform &= fewest >= last_rows
    drafts = DRAFT_POSITIONS
    if uniform:
        drafts = 1
    before += (drafts - 1) * ahead_count
    mine += drafts - 1
    total += (drafts - 1) * batch_size
    return before, mine, total, uniform, drafts, fewest


@triton.jit
def _min_rows(head_block, num_heads, tile_rows):
    # The fewest drafts of a request with rows in head_block (a scalar or
    # a vector of them; kernel_sm90._min_rows: E drafts pack H E rows
    # densely, so head block k > 0 holds rows where k tile_rows < H E).
    return tl.where(head_block == 0, 0, head_block * tile_rows // num_heads + 1)


@triton.jit
def _share_len(positions, first_positions, grid_ctas, head_blocks, batch_size, min_share):
    # The aligned plan's share length (kernel_sm90._share_len, the same
    # rule; plan.head_block_plan): the least that fits every head block's
    # shares in the grid, at least min_share, and no shorter than the cap
    # of 1 + 4 sqrt(P) shares a request allows the first head block.
    spare = tl.maximum(grid_ctas - head_blocks, 1)
    fit = tl.where(grid_ctas > head_blocks, tl.cdiv(positions, spare), first_positions)
    cap = (4.0 * tl.sqrt_rn(first_positions.to(tl.float32) * batch_size)).to(tl.int32)
    cap += batch_size
    return tl.maximum(tl.maximum(fit, min_share), tl.cdiv(first_positions, cap))


@triton.jit
def _head_block_shares(
    KV_INDPTR,
    QO_INDPTR,
    req,
    own,
    head_block,
    batch_size,
    num_heads,
    tile_rows,
    grid_ctas,
    head_blocks,
    min_share,
    drafts,
    BLOCK_B: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    TOKENS: tl.constexpr,
):
    # The Hopper kernel's aligned plan, where some request has no rows in
    # some head block (kernel_sm90._head_block_plan, the same rule;
    # plan.head_block_plan): a request of E drafts has rows in head blocks
    # hb with hb * tile_rows < num_heads * E (E at least _min_rows); its
    # positions there are its prefix tiles of
    # TOKENS, then `drafts`, in plan.ragged_order. Every head block cuts
    # shares of one length and takes as many CTAs as it has shares, one
    # head block after another. Returns head_block's first CTA, its
    # positions, the share length and the positions of its requests before
    # req. All head blocks at once (HEAD_BLOCKS >= head_blocks, a power of
    # two).
    blocks = tl.arange(0, HEAD_BLOCKS)
    min_rows = _min_rows(blocks, num_heads, tile_rows)
    # Sums carried as tiles, reduced after the loop: triton 3.6 fails to
    # lower a loop that carries a reduction's result vector.
    total = tl.zeros([HEAD_BLOCKS, BLOCK_B], dtype=tl.int32)
    before = tl.zeros([HEAD_BLOCKS, BLOCK_B], dtype=tl.int32)
    for start in range(0, batch_size, BLOCK_B):
        offs_b = start + tl.arange(0, BLOCK_B)
        mask_b = offs_b < batch_size
        rows = _prefix_lens(QO_INDPTR, offs_b, mask_b)
        inside = (
            (rows[None, :] >= min_rows[:, None]) & (blocks < head_blocks)[:, None] & mask_b[None, :]
        )
        tiles = tl.cdiv(_prefix_lens(KV_INDPTR, offs_b, mask_b), TOKENS)
        positions = tl.where(inside, (tiles + drafts)[None, :], 0)
        total += positions
        ahead = _ahead_in_order(rows, offs_b, own, req)
        before += tl.where(ahead[None, :], positions, 0)
    total = tl.sum(total, 1)
    before = tl.sum(before, 1)
    first_positions = tl.sum(tl.where(blocks == 0, total, 0), 0)
    share_len = _share_len(
        tl.sum(total, 0), first_positions, grid_ctas, head_blocks, batch_size, min_share
    )
    used = tl.cdiv(total, share_len)
    here = blocks == head_block
    return (
        tl.sum(tl.where(blocks < head_block, used, 0), 0),
        tl.sum(tl.where(here, total, 0), 0),
        share_len,
        tl.sum(tl.where(here, before, 0), 0),
    )


@triton.jit
def _share_count(grid_ctas, total, uniform, batch_size, min_share):
    # The Hopper kernel's share count (kernel_sm90._share_count, the same
    # rule): one a CTA, of min_share positions at least; where every
    # request holds as many positions (`uniform`), a multiple or a divisor
    # of the batch size that costs at most a sixteenth of them; no more
    # than 1 + 4 sqrt(P) shares a request of P positions, on average.
    ctas = tl.minimum(grid_ctas, tl.cdiv(total, min_share))
    work = total.to(tl.float32) * batch_size
    ctas = tl.minimum(ctas, (4.0 * tl.sqrt_rn(work)).to(tl.int32) + batch_size)
    aligned = ctas
    if uniform:
        if ctas >= batch_size:
            aligned = ctas - ctas % batch_size
        else:
            group = tl.cdiv(batch_size, ctas)
            if batch_size % group == 0:
                aligned = batch_size // group
    if aligned * 16 >= ctas * 15:
        ctas = aligned
    return ctas


# e4m3 -> bf16 by integer PTX on NVIDIA (fp8.py says how, and why not
# Triton's conversion).
E4M3_TO_BF16_PTX = tl.constexpr(fp8.E4M3_TO_BF16_PTX)


@triton.jit
def _widen(x, dtype: tl.constexpr, WIDEN_BY_PTX: tl.constexpr):
    # A KV tile in the dot's dtype: fp8 e4m3 into bf16 by E4M3_TO_BF16_PTX
    # where WIDEN_BY_PTX (NVIDIA, compiled), else by Triton's conversion.
    if WIDEN_BY_PTX and x.dtype == tl.float8e4nv and dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(
            E4M3_TO_BF16_PTX,
            "=r,=r,r",
            [x.to(tl.uint8, bitcast=True)],
            dtype=tl.bfloat16,
            is_pure=True,
            pack=4,
        )
    else:
        return x.to(dtype)


@triton.jit
def _rows_chunk(ptr, col0, offs_c, mask, dtype: tl.constexpr, WIDEN_BY_PTX: tl.constexpr):
    # Columns col0 .. col0 + D_CHUNK - 1 of rows ptr [R, 1] (masked rows 0),
    # in the dot's dtype.
    x = tl.load(ptr + col0 + offs_c[None, :], mask=mask[:, None], other=0.0)
    return _widen(x, dtype, WIDEN_BY_PTX)


@triton.jit
def _new_max(qk, m_i):
    # The rows' new maxima over scores qk [R, N] (log2 domain, -inf where a
    # key is hidden) and the shift their weights take. A row that has seen
    # no key yet keeps m = -inf: shifted by 0 there, its weights are 0, not
    # exp2(-inf - -inf) = NaN.
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    return m_new, tl.where(m_new == float("-inf"), 0.0, m_new)


@triton.jit
def _softmax_step(qk, m_i):
    # One online-softmax step: the new maxima, the rescale factor of what
    # the rows hold and the new weights.
    m_new, shift = _new_max(qk, m_i)
    return m_new, tl.exp2(m_i - shift), tl.exp2(qk - shift[:, None])


@triton.jit(do_not_specialize=["batch_size", "num_kv_splits"])
def _prefix_kernel(
    Q,
    K_BUF,
    V_BUF,
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
    num_heads,
    batch_size,
    num_kv_splits,
    score_scale,
    v_scale,
    DRAFT_LEN: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
    D_V: tl.constexpr,
    D_ROPE: tl.constexpr,
    V_CHUNK: tl.constexpr,
    V_FROM_K: tl.constexpr,
    PREFIX_MASK: tl.constexpr,
    DOT_FP32: tl.constexpr,
    WIDEN_BY_PTX: tl.constexpr,
    SPLIT_SCORES: tl.constexpr,
):
    # Head blocks of one unit are neighbours in launch order: the later
    # ones find the unit's KV tiles in L2.
    head_block = tl.program_id(0)
    unit = tl.program_id(1)

    # The unit's share of the batch's prefix tokens, requests laid end to
    # end: positions pos_lo .. pos_hi - 1, met by requests first .. last.
    base, total, share = _unit_shares(KV_INDPTR, batch_size, num_kv_splits, BLOCK_N)
    pos_lo = unit * share
    pos_hi = tl.minimum(pos_lo + share, total)
    if pos_lo >= pos_hi:
        return
    first, last = _requests_met(KV_INDPTR, batch_size, pos_lo, pos_hi, BLOCK_B)

    # Row m of the tile is (head h, draft i) with m = (h - h0) * L + i;
    # drafts past a request's own count are padding.
    offs_m = tl.arange(0, BLOCK_M)
    offs_h = head_block * BLOCK_H + offs_m // DRAFT_LEN
    offs_i = offs_m % DRAFT_LEN
    # The value columns in chunks of V_CHUNK (the config's), one dot a chunk,
    # so a dot holds one chunk of the KV tile in registers. Without one, tiles
    # of 64 rows or more (a warpgroup's wgmma on Hopper) take chunks of 128;
    # smaller tiles ran slower so (RESULTS.md).
    D_CHUNK: tl.constexpr = (
        V_CHUNK if V_CHUNK > 0 else (128 if BLOCK_M >= 64 and D_V > 128 else D_V)
    )
    N_CHUNKS: tl.constexpr = D_V // D_CHUNK
    DOT_DTYPE: tl.constexpr = tl.float32 if DOT_FP32 else Q.dtype.element_ty
    offs_c = tl.arange(0, D_CHUNK)
    if D_ROPE > 0:
        offs_r = tl.arange(0, D_ROPE)
    mask_head = (offs_m < BLOCK_H * DRAFT_LEN) & (offs_h < num_heads)

    # One segment a request: its tokens inside the share, its partial at
    # slot unit + req (segments in stream order raise the unit or the
    # request at each step, so no two share a slot). A request with no
    # tokens here (no prefix) writes weight 0 at a slot no one reads.
    for req in range(first, last + 1):
        kv_start = tl.load(KV_INDPTR + req)
        kv_len = (tl.load(KV_INDPTR + req + 1) - kv_start).to(tl.int32)
        begin = (kv_start - base).to(tl.int32)
        lo = tl.maximum(pos_lo - begin, 0)
        hi = tl.minimum(pos_hi - begin, kv_len)
        q_start = tl.load(QO_INDPTR + req)
        num_rows = (tl.load(QO_INDPTR + req + 1) - q_start).to(tl.int32)  # the request's drafts
        mask_m = mask_head & (offs_i < num_rows)

        q_row = (q_start + offs_i).to(tl.int64)
        ptr_q = Q + q_row[:, None] * stride_q_tok + offs_h[:, None] * stride_q_head
        # Q's value columns in chunks of D_CHUNK [M, D_CHUNK]: each dot then
        # holds one chunk of the KV tile in registers, not all D_V columns.
        qs = ()
        for c in tl.static_range(N_CHUNKS):
            qs = qs + (_rows_chunk(ptr_q, c * D_CHUNK, offs_c, mask_m, DOT_DTYPE, False),)
        if D_ROPE > 0:
            q_pe = tl.load(ptr_q + D_V + offs_r[None, :], mask=mask_m[:, None], other=0.0)
            q_pe = q_pe.to(DOT_DTYPE)  # [M, 64]
        if PREFIX_MASK:
            # Row i's mask bits: its request's prefix keys, then its drafts.
            mask_row = tl.load(MASK_INDPTR + req).to(tl.int64) + offs_i.to(tl.int64) * (
                kv_len + num_rows
            )

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        accs = ()
        for _ in tl.static_range(N_CHUNKS):
            accs = accs + (tl.zeros([BLOCK_M, D_CHUNK], dtype=tl.float32),)
        if SPLIT_SCORES:
            # The row sums by the tensor cores, P @ ones (every column the
            # same sum), in the value product's layout: no reduction of P
            # across the warpgroups each tile. 8 columns: 16 spill (93b948f).
            ones = tl.full([BLOCK_N, 8], 1.0, DOT_DTYPE)
            l_acc = tl.zeros([BLOCK_M, 8], dtype=tl.float32)
        else:
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

        for start in tl.range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            mask_n = offs_n < hi
            slot = tl.load(KV_INDICES + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
            ptr_k = K_BUF + slot[:, None] * stride_k_slot
            # The scores [M, N]. Triton gives every warp of a dot whose
            # result reaches another dot rows of its own (a chain, as in
            # flash attention): at 64 rows and 8 warps both warpgroups would
            # compute every score. SPLIT_SCORES ends both chains: each
            # chunk's product is scaled before the sum (a sum of dots is folded
            # into one accumulating chain, a sum of scaled dots is not), and P
            # and alpha are made behind a branch always taken, whose results
            # Triton does not trace to P V; the score dots then split the keys
            # between the warpgroups.
            ks = ()
            qk = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for c in tl.static_range(N_CHUNKS):
                k_c = _rows_chunk(ptr_k, c * D_CHUNK, offs_c, mask_n, DOT_DTYPE, WIDEN_BY_PTX)
                if SPLIT_SCORES:
                    qk += tl.dot(qs[c], tl.trans(k_c)) * score_scale
                else:
                    qk = tl.dot(qs[c], tl.trans(k_c), qk)
                ks = ks + (k_c,)
            if D_ROPE > 0:
                k_pe = tl.load(ptr_k + D_V + offs_r[None, :], mask=mask_n[:, None], other=0.0)
                pe = tl.dot(q_pe, tl.trans(_widen(k_pe, DOT_DTYPE, WIDEN_BY_PTX)))
                qk += pe * score_scale if SPLIT_SCORES else pe
            if not SPLIT_SCORES:
                qk = qk * score_scale
            qk = tl.where(mask_n[None, :], qk, float("-inf"))
            if PREFIX_MASK:
                bits = tl.load(
                    MASK + mask_row[:, None] + offs_n[None, :],
                    mask=mask_m[:, None] & mask_n[None, :],
                    other=0,
                )  # [M, N], E_b bytes a token
                qk = tl.where(bits != 0, qk, float("-inf"))

            if SPLIT_SCORES:
                # _softmax_step with alpha and P behind a branch always taken
                # (the API checks both factors of score_scale positive),
                # which no Triton version folds away. The branch not taken
                # casts the scores, not a constant: a constant P would be
                # given a shared buffer of its own for the whole loop. The
                # row sums are l_acc's dot, not l_i's reduction (l_i is set
                # from l_acc after the loop).
                m_new, shift = _new_max(qk, m_i)
                alpha = tl.zeros([BLOCK_M], dtype=tl.float32)
                if score_scale > 0:
                    alpha = tl.exp2(m_i - shift)
                    p_dot = tl.exp2(qk - shift[:, None]).to(DOT_DTYPE)
                else:
                    p_dot = qk.to(DOT_DTYPE)
                l_acc = tl.dot(p_dot, ones, l_acc * alpha[:, None])
            else:
                m_new, alpha, p = _softmax_step(qk, m_i)
                l_i = l_i * alpha + tl.sum(p, 1)
                p_dot = p.to(DOT_DTYPE)
            new_accs = ()
            for c in tl.static_range(N_CHUNKS):
                if V_FROM_K:  # V is K's first Dv columns (MLA's latent), already loaded
                    v_c = ks[c]
                else:
                    ptr_v = V_BUF + slot[:, None] * stride_v_slot
                    v_c = _rows_chunk(ptr_v, c * D_CHUNK, offs_c, mask_n, DOT_DTYPE, WIDEN_BY_PTX)
                new_accs = new_accs + (tl.dot(p_dot, v_c, accs[c] * alpha[:, None]),)
            accs = new_accs
            m_i = m_new

        if SPLIT_SCORES:
            l_i = tl.max(l_acc, 1)
        part_row = (((unit + req) * num_heads + offs_h) * DRAFT_LEN + offs_i).to(tl.int64)
        # The KV cache's value scale applies to the prefix alone. A row the
        # mask hid the whole segment from holds weight 0 (lse -inf, values
        # 0: merged as nothing, never as NaN * 0).
        seen = l_i > 0
        l_i = tl.where(seen, l_i, 1.0)
        scale = (v_scale / l_i)[:, None]
        ptr_o = PART_O + part_row[:, None] * D_V + offs_c[None, :]
        hidden = ~seen[:, None]
        for c in tl.static_range(N_CHUNKS):
            tl.store(
                ptr_o + c * D_CHUNK, tl.where(hidden, 0.0, accs[c] * scale), mask=mask_m[:, None]
            )
        tl.store(
            PART_LSE + part_row, tl.where(seen, m_i + tl.log2(l_i), float("-inf")), mask=mask_m
        )


@triton.jit
def _merge_pieces(
    PART_O,
    PART_LSE,
    row_stride,
    row0,
    first,
    later,
    step,
    num_pieces,
    num_rows,
    col0,
    L_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    D_BLOCK: tl.constexpr,
    D_V: tl.constexpr,
):
    # Merges a request's partials ("pieces"; log2-sum-exp2 weights) for one
    # head, drafts 0 .. num_rows - 1, columns col0 .. col0 + D_BLOCK - 1:
    # piece 0 is at partial slot `first`, piece j > 0 at later + step * j;
    # a slot's draft i is row slot * row_stride + row0 + i.
    # A piece of weight 0 (lse -inf, values 0) adds nothing. Row r of the tile is draft
    # r % L_PAD of slot r // L_PAD; each slot merges every SLOTS-th piece, so
    # one load fetches SLOTS pieces and the loop (a chain of L2 round trips
    # on a long request) is SLOTS times shorter. Returns the running max,
    # sum and values of drafts 0 .. L_PAD - 1: [L_PAD], [L_PAD], [L_PAD, D_BLOCK].
    SLOTS: tl.constexpr = ROWS // L_PAD
    offs_r = tl.arange(0, ROWS)
    slot = offs_r // L_PAD
    draft = offs_r % L_PAD
    offs_d = col0 + tl.arange(0, D_BLOCK)
    m_r = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_r = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, D_BLOCK], dtype=tl.float32)
    for piece0 in range(0, num_pieces, SLOTS):
        piece = piece0 + slot
        valid = (draft < num_rows) & (piece < num_pieces)
        part = tl.where(piece == 0, first, later + step * piece)
        part_row = part.to(tl.int64) * row_stride + row0 + draft
        lse = tl.load(PART_LSE + part_row, mask=valid, other=float("-inf"))
        part = tl.load(
            PART_O + part_row[:, None] * D_V + offs_d[None, :], mask=valid[:, None], other=0.0
        )
        m_new = tl.maximum(m_r, lse)
        # A slot with no piece yet keeps m = -inf: shift by 0 there, not NaN.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_r - shift)
        w = tl.exp2(lse - shift)
        acc = acc * alpha[:, None] + w[:, None] * part
        l_r = l_r * alpha + w
        m_r = m_new
    m_slots = tl.reshape(m_r, [SLOTS, L_PAD])
    m_i = tl.max(m_slots, 0)
    w_slots = tl.exp2(m_slots - tl.where(m_i == float("-inf"), 0.0, m_i)[None, :])
    l_i = tl.sum(tl.reshape(l_r, [SLOTS, L_PAD]) * w_slots, 0)
    acc = tl.sum(tl.reshape(acc, [SLOTS, L_PAD, D_BLOCK]) * w_slots[:, :, None], 0)
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["batch_size", "num_kv_splits"])
def _merge_extend_kernel(
    Q,
    K_EXT,
    V_EXT,
    O,
    QO_INDPTR,
    KV_INDPTR,
    MASK,
    MASK_INDPTR,
    PART_O,
    PART_LSE,
    stride_q_tok,
    stride_q_head,
    stride_ke_tok,
    stride_ve_tok,
    stride_o_tok,
    stride_o_head,
    num_heads,
    batch_size,
    num_kv_splits,
    ext_scale,
    ext_v_scale,
    DRAFT_LEN: tl.constexpr,
    L_PAD: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_V: tl.constexpr,
    D_ROPE: tl.constexpr,
    DRAFT_MASK: tl.constexpr,
    DOT_FP32: tl.constexpr,
    WAIT_PRIOR: tl.constexpr,
):
    # After the Triton kernel: the request's unit partials (at slots first
    # .. first + pieces - 1, the plan stage 1 followed), then the drafts.
    req = tl.program_id(0)
    head = tl.program_id(1)
    kv_len = (tl.load(KV_INDPTR + req + 1) - tl.load(KV_INDPTR + req)).to(tl.int32)
    q_start = tl.load(QO_INDPTR + req)
    num_rows = (tl.load(QO_INDPTR + req + 1) - q_start).to(tl.int32)
    # The units whose shares meet the request's prefix wrote its pieces, at
    # slots unit + req (stage 1).
    base, _, share = _unit_shares(KV_INDPTR, batch_size, num_kv_splits, BLOCK_N)
    begin = (tl.load(KV_INDPTR + req) - base).to(tl.int32)
    first_unit = begin // share
    num_pieces = tl.where(kv_len > 0, (begin + kv_len - 1) // share - first_unit + 1, 0)
    first = first_unit + req
    if WAIT_PRIOR:  # the partials are stage 1's (dependent launch, see launch)
        gdc_wait()
    m_i, l_i, acc = _merge_pieces(
        PART_O,
        PART_LSE,
        num_heads * DRAFT_LEN,
        head * DRAFT_LEN,
        first,
        first,
        1,
        num_pieces,
        num_rows,
        0,
        L_PAD,
        BLOCK_L,
        D_V,
        D_V,
    )
    # Back to BLOCK_L rows, row r holding draft r % L_PAD (rows >= the
    # request's count are padding): the shape the draft block's dots need.
    SLOTS: tl.constexpr = BLOCK_L // L_PAD
    m_i = tl.reshape(tl.broadcast_to(m_i[None, :], [SLOTS, L_PAD]), [BLOCK_L])
    l_i = tl.reshape(tl.broadcast_to(l_i[None, :], [SLOTS, L_PAD]), [BLOCK_L])
    acc = tl.reshape(tl.broadcast_to(acc[None, :, :], [SLOTS, L_PAD, D_V]), [BLOCK_L, D_V])
    offs_i = tl.arange(0, BLOCK_L)
    mask_i = offs_i < num_rows
    q_row = (q_start + offs_i).to(tl.int64)
    # The draft block's mask bits follow the row's prefix bits.
    mask_first = kv_len.to(tl.int64)
    if DRAFT_MASK:
        mask_first += tl.load(MASK_INDPTR + req).to(tl.int64)
    acc, l_i = _add_drafts(
        Q,
        K_EXT,
        V_EXT,
        MASK,
        q_row,
        head,
        num_rows,
        mask_first,
        kv_len + num_rows,
        stride_q_tok,
        stride_q_head,
        stride_ke_tok,
        stride_ve_tok,
        ext_scale,
        ext_v_scale,
        acc,
        m_i,
        l_i,
        BLOCK_L,
        D_V,
        D_ROPE,
        DRAFT_MASK,
        DOT_FP32,
    )
    # A row that sees no key at all (its mask bits all off) gets 0.
    seen = l_i > 0
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    offs_d = tl.arange(0, D_V)
    ptr_o = O + q_row[:, None] * stride_o_tok + head * stride_o_head + offs_d[None, :]
    tl.store(ptr_o, out.to(O.dtype.element_ty), mask=mask_i[:, None])


@triton.jit
def _pieces_at_most(KV_INDPTR, req, batch_size, cuts, TOKENS: tl.constexpr):
    # At least as many pieces as request req's (_merge_shares_kernel's
    # c0 .. c1), from four loads instead of the plan: at most `cuts` cuts
    # of at least the batch's prefix tokens / TOKENS positions plus one a
    # request, and t positions meet at most t cuts // total + 2 of them.
    first = tl.load(KV_INDPTR).to(tl.int64)
    tokens = tl.load(KV_INDPTR + batch_size).to(tl.int64) - first
    own = tl.load(KV_INDPTR + req + 1).to(tl.int64) - tl.load(KV_INDPTR + req).to(tl.int64)
    least_total = tokens // TOKENS + batch_size
    return tl.cdiv(own, TOKENS) * cuts // least_total + 2


@triton.jit(do_not_specialize=["batch_size", "share_ctas", "min_share"])
def _merge_shares_kernel(
    O,
    QO_INDPTR,
    KV_INDPTR,
    PART_O,
    PART_LSE,
    stride_o_tok,
    stride_o_head,
    num_heads,
    batch_size,
    head_blocks,
    share_ctas,
    min_share,
    DRAFT_LEN: tl.constexpr,
    TILE_ROWS: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    L_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    D_BLOCK: tl.constexpr,
    D_V: tl.constexpr,
    TOKENS: tl.constexpr,
    DRAFT_POSITIONS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    RAGGED: tl.constexpr,
    WIDE_PIECES: tl.constexpr,
    WIDE_BLOCKS: tl.constexpr,
    WIDE_ROWS: tl.constexpr,
    WAIT_PRIOR: tl.constexpr,
):
    # After the Hopper kernel's shares: the partials of a request that
    # several shares hold (drafts included), columns of block program_id(2).
    # A request of at most WIDE_PIECES pieces is merged by the first
    # WIDE_BLOCKS blocks alone, each D_V // WIDE_BLOCKS columns wide, and
    # the other blocks end before the wait (WIDE_BLOCKS 0: every request
    # by all blocks): most requests of a large batch hold a few pieces,
    # and the grid is sized for the long request that holds many.
    req = tl.program_id(0)
    head = tl.program_id(1)
    block = tl.program_id(2)
    if WIDE_BLOCKS > 0:  # noqa: SIM102 (a constexpr test first, then a runtime one)
        if block >= WIDE_BLOCKS:
            # A block past the wide ones merges only a request of more
            # than WIDE_PIECES pieces; where a bound from four loads rules
            # that out, it ends before the plan.
            cuts = share_ctas
            if RAGGED:
                # Or the aligned plan's (_head_block_shares): one share
                # length for all head blocks, at least all their positions
                # over head_blocks * share_ctas - head_blocks (share_ctas
                # is 1 or more).
                cuts = tl.maximum(cuts, head_blocks * share_ctas - head_blocks)
            if _pieces_at_most(KV_INDPTR, req, batch_size, cuts, TOKENS) <= WIDE_PIECES:
                return
    q_first = tl.load(QO_INDPTR + req)
    num_rows = (tl.load(QO_INDPTR + req + 1) - q_first).to(tl.int32)  # the request's drafts
    last_rows = _min_rows(head_blocks - 1, num_heads, TILE_ROWS)
    base, n, total, uniform, drafts, fewest = _share_positions(
        KV_INDPTR,
        QO_INDPTR,
        req,
        num_rows,
        batch_size,
        last_rows,
        BLOCK_B,
        TOKENS,
        DRAFT_POSITIONS,
        RAGGED,
    )
    # Partial rows (slot, head, draft), the slots the head block's CTAs'
    # (kernel_sm90._partial_rows).
    row_stride = num_heads * DRAFT_LEN
    row0 = head * DRAFT_LEN
    first_slot = 0
    share_len = 0  # the aligned plan's (_head_block_shares); 0: equal cuts
    straddle_from = L_PAD  # drafts from this one on are the next tile's (none)
    straddle_step = 0
    if RAGGED:
        # Rows (slot, tile row), the slots the grid's CTAs': the head's
        # head block and first row there (kernel_sm90._row_coords: E
        # drafts pack H E rows densely, TILE_ROWS a tile). Where some
        # request has no rows in some head block, the plan is aligned
        # (kernel_sm90's); else each head block has a row of the grid.
        head_block = head * num_rows // TILE_ROWS
        row_stride = TILE_ROWS
        row0 = head * num_rows - head_block * TILE_ROWS
        first_slot = 2 * head_block * share_ctas
        block_ctas = share_ctas
        if fewest < last_rows:
            first_cta, total, share_len, base = _head_block_shares(
                KV_INDPTR,
                QO_INDPTR,
                req,
                num_rows,
                head_block,
                batch_size,
                num_heads,
                TILE_ROWS,
                head_blocks * share_ctas,
                head_blocks,
                min_share,
                drafts,
                BLOCK_B,
                HEAD_BLOCKS,
                TOKENS,
            )
            first_slot = 2 * first_cta
            block_ctas = tl.cdiv(total, share_len)
            kv_len = (tl.load(KV_INDPTR + req + 1) - tl.load(KV_INDPTR + req)).to(tl.int32)
            n = tl.cdiv(kv_len, TOKENS) + drafts
        # A head whose drafts straddle two tiles: drafts TILE_ROWS - row0
        # on are the next head block's first rows, in the slots of the CTA
        # as many CTAs on (2 block_ctas slots; the same cuts and the same
        # requests before it there, so the same pieces).
        straddle_from = TILE_ROWS - row0
        straddle_step = (2 * block_ctas - 1) * TILE_ROWS
    # Positions base .. base + n - 1 of the head block are the request's,
    # its drafts' from base + n - drafts; c0 holds the first position, c1
    # the drafts' first, and c0's range begins at start0. Aligned shares:
    # CTA c holds positions from c * share_len. Equal cuts: from
    # c * total // ctas, so the one that holds position p is
    # ((p + 1) * ctas - 1) // total (int64: the products pass 2^31 on
    # large batches).
    base = base.to(tl.int64)
    if share_len > 0:
        c0 = base // share_len
        c1 = (base + n - drafts) // share_len
        start0 = c0 * share_len
    else:
        ctas = _share_count(share_ctas, total, uniform, batch_size, min_share).to(tl.int64)
        c0 = ((base + 1) * ctas - 1) // total
        c1 = ((base + n - drafts + 1) * ctas - 1) // total
        start0 = c0 * total // ctas
    c0 = c0.to(tl.int32)
    c1 = c1.to(tl.int32)
    pieces = c1 - c0 + 1
    # CTA c0's part is its first segment when no earlier request has work
    # in its range (the previous drafts' first position is before it),
    # else its last (slot 2 c0 + 1); the later CTAs' is their first (slot
    # 2 c). c0 == c1: one CTA held the whole request and wrote its output.
    slot0 = first_slot + 2 * c0
    first = slot0 + (start0 <= base - drafts).to(tl.int32)
    request = (O, stride_o_tok, stride_o_head, head, q_first, num_rows)
    partials = (PART_O, PART_LSE, row_stride, row0, straddle_from, straddle_step)
    pieces_at = (first, slot0, pieces)
    if WIDE_BLOCKS > 0 and pieces <= WIDE_PIECES:
        if pieces > 1 and block < WIDE_BLOCKS:
            if WAIT_PRIOR:  # the partials are stage 1's (dependent launch, see launch)
                gdc_wait()
            D_WIDE: tl.constexpr = D_V // WIDE_BLOCKS
            _merge_request_columns(
                request, partials, pieces_at, block * D_WIDE, L_PAD, WIDE_ROWS, D_WIDE, D_V
            )
    elif pieces > 1:
        if WAIT_PRIOR:
            gdc_wait()
        _merge_request_columns(
            request, partials, pieces_at, block * D_BLOCK, L_PAD, ROWS, D_BLOCK, D_V
        )


@triton.jit
def _merge_request_columns(
    request,
    partials,
    pieces_at,
    col0,
    L_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    D_BLOCK: tl.constexpr,
    D_V: tl.constexpr,
):
    # Stage 2 after the shares: one request's head, columns col0 ..
    # col0 + D_BLOCK - 1, merged into its output rows (`request`). Its
    # pieces (`pieces_at`) are at slot `first`, then slot0 + 2 j; a slot's
    # draft i is at row slot * row_stride + row0 + i, and drafts
    # straddle_from onwards straddle_step rows further (the next head
    # block's tile) (`partials`).
    O, stride_o_tok, stride_o_head, head, q_first, num_rows = request
    PART_O, PART_LSE, row_stride, row0, straddle_from, straddle_step = partials
    first, slot0, pieces = pieces_at
    offs_r = tl.arange(0, ROWS)
    rows0 = row0 + tl.where((offs_r % L_PAD) >= straddle_from, straddle_step, 0)
    _, l_i, acc = _merge_pieces(
        PART_O,
        PART_LSE,
        row_stride,
        rows0,
        first,
        slot0,
        2,
        pieces,
        num_rows,
        col0,
        L_PAD,
        ROWS,
        D_BLOCK,
        D_V,
    )
    offs_i = tl.arange(0, L_PAD)
    q_row = (q_first + offs_i).to(tl.int64)
    offs_d = col0 + tl.arange(0, D_BLOCK)
    ptr_o = O + q_row[:, None] * stride_o_tok + head * stride_o_head + offs_d[None, :]
    # A row a mask hid every key from has sum 0 and output 0.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(ptr_o, out.to(O.dtype.element_ty), mask=(offs_i < num_rows)[:, None])


@triton.jit
def _add_drafts(
    Q,
    K_EXT,
    V_EXT,
    MASK,
    q_row,
    head,
    num_rows,
    mask_first,
    mask_stride,
    stride_q_tok,
    stride_q_head,
    stride_ke_tok,
    stride_ve_tok,
    ext_scale,
    ext_v_scale,
    acc,
    m_i,
    l_i,
    BLOCK_L: tl.constexpr,
    D_V: tl.constexpr,
    D_ROPE: tl.constexpr,
    DRAFT_MASK: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    # Adds the request's own drafts (rows q_row, num_rows of them) to the
    # online softmax (acc, m_i, l_i); returns (acc, l). Row i sees draft j
    # where its mask bit MASK[mask_first + i * mask_stride + j] is set, or,
    # without a mask, where j <= i. The drafts' values count ext_v_scale
    # times, applied to their P V in fp32: no scaled value is rounded.
    offs_i = tl.arange(0, BLOCK_L)
    mask_i = offs_i < num_rows
    offs_d = tl.arange(0, D_V)
    ptr_q = Q + q_row[:, None] * stride_q_tok + head * stride_q_head
    ptr_ke = K_EXT + q_row[:, None] * stride_ke_tok
    q_nope = tl.load(ptr_q + offs_d[None, :], mask=mask_i[:, None], other=0.0)  # [L, Dv]
    k_nope = tl.load(ptr_ke + offs_d[None, :], mask=mask_i[:, None], other=0.0)
    v_ext = tl.load(
        V_EXT + q_row[:, None] * stride_ve_tok + offs_d[None, :], mask=mask_i[:, None], other=0.0
    )
    if DOT_FP32:
        q_nope = q_nope.to(tl.float32)
        k_nope = k_nope.to(tl.float32)
        v_ext = v_ext.to(tl.float32)
    qk = tl.dot(q_nope, tl.trans(k_nope))  # [L, L]
    if D_ROPE > 0:
        offs_r = tl.arange(0, D_ROPE)
        q_pe = tl.load(ptr_q + D_V + offs_r[None, :], mask=mask_i[:, None], other=0.0)
        k_pe = tl.load(ptr_ke + D_V + offs_r[None, :], mask=mask_i[:, None], other=0.0)
        qk += tl.dot(q_pe.to(q_nope.dtype), tl.trans(k_pe.to(q_nope.dtype)))
    if DRAFT_MASK:
        bits = tl.load(
            MASK + mask_first + offs_i.to(tl.int64)[:, None] * mask_stride + offs_i[None, :],
            mask=mask_i[:, None] & mask_i[None, :],
            other=0,
        )
        seen = bits != 0
    else:
        seen = (offs_i[None, :] <= offs_i[:, None]) & mask_i[None, :]
    qk = tl.where(seen, qk * ext_scale, float("-inf"))

    m_new, alpha, p = _softmax_step(qk, m_i)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v_ext.dtype), v_ext) * ext_v_scale
    return acc, l_i


# Under TRITON_INTERPRET=1 the decorators return interpreter functions; the
# interpreter's bf16 tl.dot is wrong, so dots then run on fp32 operands.
INTERPRETED = not isinstance(_prefix_kernel, triton.runtime.JITFunction)


def launch(
    plan,
    q: torch.Tensor,
    k_ext: torch.Tensor,
    v_ext: torch.Tensor,
    o: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
    *,
    sm_scale: float,
    k_scale: float,
    v_scale: float,
    v_extend_scale: float = 1.0,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
) -> None:
    """Launch both stages as ``plan`` (a ``plan.Plan`` of this call) says.
    Inputs are trusted (the API validates them); ``part_o`` / ``part_lse``
    hold at least ``workspace_numel(plan.partial_rows, ...)`` elements;
    ``custom_mask`` (uint8, SGLang's layout) and ``mask_indptr`` where the
    plan reads a mask. Looks nothing up, allocates nothing, never
    synchronises."""
    config = plan.config
    if plan.hopper:
        hopper.gluon_kernel(plan.head_dims, plan.ragged, plan.paged).launch_prefix(
            q,
            k_buffer,
            v_buffer,
            k_ext,
            v_ext,
            o,
            qo_indptr,
            kv_indptr,
            kv_indices,
            part_o,
            part_lse,
            batch_size=plan.batch_size,
            draft_len=plan.draft_len,
            block_h=config.BLOCK_H,
            ctas=plan.share_ctas,
            min_share=plan.min_share,
            score_scale=sm_scale * k_scale * LOG2E,
            draft_scale=sm_scale * LOG2E,
            v_scale=v_scale,
            v_extend_scale=v_extend_scale,
            v_extend_from_k=plan.v_extend_from_k,
            plan_block=PLAN_BLOCK,
            score_value=plan.score_value,
            launch_dependents=plan.dependent,
            custom_mask=custom_mask if plan.draft_mask else None,
            mask_indptr=mask_indptr if plan.draft_mask else None,
            prefix_mask=plan.prefix_mask,
        )
        launch_merge_shares(
            o,
            qo_indptr,
            kv_indptr,
            part_o,
            part_lse,
            batch_size=plan.batch_size,
            draft_len=plan.draft_len,
            block_h=config.BLOCK_H,
            share_ctas=plan.share_ctas,
            min_share=plan.min_share,
            column_blocks=plan.merge_blocks,
            dependent=plan.dependent,
            ragged=plan.ragged,
        )
        return
    num_heads = q.shape[1]
    splits = config.NUM_KV_SPLITS
    grid = (triton.cdiv(num_heads, config.BLOCK_H), plan.batch_size * splits)
    # Without a mask the kernels take kv_indptr in its place and never read it.
    mask = custom_mask if custom_mask is not None else kv_indptr
    mask_indptr = mask_indptr if mask_indptr is not None else kv_indptr
    d_qk, d_v = plan.head_dims
    launcher.launch(
        _prefix_kernel,
        grid,
        q,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        mask,
        mask_indptr,
        part_o,
        part_lse,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        v_buffer.stride(0),
        num_heads,
        plan.batch_size,
        splits,
        sm_scale * k_scale * LOG2E,
        v_scale,
        DRAFT_LEN=plan.draft_len,
        BLOCK_H=config.BLOCK_H,
        BLOCK_M=rows_per_program(config.BLOCK_H, plan.draft_len),
        BLOCK_N=config.BLOCK_N,
        BLOCK_B=PLAN_BLOCK,
        D_V=d_v,
        D_ROPE=d_qk - d_v,
        V_CHUNK=value_chunk(config, d_v),
        V_FROM_K=plan.v_from_k,
        PREFIX_MASK=plan.prefix_mask,
        DOT_FP32=INTERPRETED,
        WIDEN_BY_PTX=not INTERPRETED and torch.version.hip is None,
        SPLIT_SCORES=plan.split_scores,
        **config.launch_options(),
    )
    launch_merge(
        q,
        k_ext,
        v_ext,
        o,
        qo_indptr,
        kv_indptr,
        part_o,
        part_lse,
        batch_size=plan.batch_size,
        draft_len=plan.draft_len,
        block_n=config.BLOCK_N,
        num_kv_splits=splits,
        sm_scale=sm_scale,
        v_extend_scale=v_extend_scale,
        dependent=plan.dependent,
        custom_mask=custom_mask if plan.draft_mask else None,
        mask_indptr=mask_indptr if plan.draft_mask else None,
    )


def launch_merge(
    q: torch.Tensor,
    k_ext: torch.Tensor,
    v_ext: torch.Tensor,
    o: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
    *,
    batch_size: int,
    draft_len: int,
    block_n: int,
    num_kv_splits: int,
    sm_scale: float,
    v_extend_scale: float = 1.0,
    dependent: bool,
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
) -> None:
    """Stage 2 after the Triton kernel, writes ``o``: merges each request's
    unit partials (the plan of stage 1 with ``block_n``) and adds the
    drafts (their values times ``v_extend_scale``), causally or as
    ``custom_mask`` says (its draft block; uint8, with ``mask_indptr``).
    ``dependent``: a programmatic dependent launch
    (``plan.dependent_launch``)."""
    num_heads = q.shape[1]
    d_v = v_ext.shape[-1]
    draft_mask = custom_mask is not None
    launcher.launch(
        _merge_extend_kernel,
        (batch_size, num_heads),
        q,
        k_ext,
        v_ext,
        o,
        qo_indptr,
        kv_indptr,
        custom_mask if draft_mask else kv_indptr,
        mask_indptr if draft_mask else kv_indptr,
        part_o,
        part_lse,
        q.stride(0),
        q.stride(1),
        k_ext.stride(0),
        v_ext.stride(0),
        o.stride(0),
        o.stride(1),
        num_heads,
        batch_size,
        num_kv_splits,
        sm_scale * LOG2E,
        v_extend_scale,
        DRAFT_LEN=draft_len,
        L_PAD=triton.next_power_of_2(draft_len),
        BLOCK_L=max(16, triton.next_power_of_2(draft_len)),
        BLOCK_N=block_n,
        D_V=d_v,
        D_ROPE=q.shape[-1] - d_v,
        DRAFT_MASK=draft_mask,
        DOT_FP32=INTERPRETED,
        WAIT_PRIOR=dependent,
        num_warps=MERGE_WARPS,
        num_stages=1,
        **COMPILE_OPTIONS,
        **_dependent_options(dependent),
    )


def launch_merge_shares(
    o: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
    *,
    batch_size: int,
    draft_len: int,
    block_h: int,
    share_ctas: int,
    min_share: int,
    column_blocks: int,
    dependent: bool,
    ragged: bool,
    warps: int = MERGE_WARPS,
) -> None:
    """Stage 2 after the Hopper kernel's shares (``share_ctas`` CTAs per head
    block of ``block_h`` heads, shares of ``min_share`` positions at least),
    writes ``o``: merges the requests that several shares hold (drafts
    included) and leaves the others, which stage 1 wrote; ``column_blocks``
    programs a (request, head), each a block of columns
    (``plan.merge_column_blocks``). ``dependent``: a programmatic dependent
    launch (``plan.dependent_launch``). ``ragged``: as stage 1 was launched
    (some request may have fewer than ``draft_len`` drafts). ``warps``: a
    program's (fewer after paged's seesaw kernel: ``paged._seesaw_merge_warps``)."""
    num_heads, d_v = o.shape[1], o.shape[2]
    head_blocks = hopper.head_blocks(num_heads, block_h)
    launcher.launch(
        _merge_shares_kernel,
        (batch_size, num_heads, column_blocks),
        o,
        qo_indptr,
        kv_indptr,
        part_o,
        part_lse,
        o.stride(0),
        o.stride(1),
        num_heads,
        batch_size,
        head_blocks,
        share_ctas,
        min_share,
        DRAFT_LEN=draft_len,
        TILE_ROWS=block_h * draft_len,
        HEAD_BLOCKS=hopper.plan_width(head_blocks),
        TOKENS=hopper.TOKENS,
        DRAFT_POSITIONS=hopper.DRAFT_POSITIONS,
        BLOCK_B=hopper.plan_requests(head_blocks, PLAN_BLOCK),
        RAGGED=ragged,
        WAIT_PRIOR=dependent,
        num_warps=warps,
        num_stages=1,
        **merge_shares_tiles(draft_len, d_v, column_blocks),
        **COMPILE_OPTIONS,
        **_dependent_options(dependent),
    )


def merge_shares_tiles(draft_len: int, d_v: int, column_blocks: int) -> dict[str, int]:
    """The tile constexprs of stage 2 after the shares (``_merge_shares_kernel``,
    and ``seesaw_merge``'s planned merge), ``column_blocks`` programs a
    (request, head): a program's rows (L_PAD a piece) and columns, and the
    wide merge's, only where it needs fewer blocks than the grid has."""
    l_pad = triton.next_power_of_2(draft_len)
    wide_rows = MERGE_WIDE_PIECES * l_pad
    wide_blocks = d_v // min(d_v, MERGE_SHARES_WIDE_TILE // wide_rows)
    return {
        "L_PAD": l_pad,
        "ROWS": max(l_pad, MERGE_SHARES_TILE * column_blocks // d_v),
        "D_BLOCK": d_v // column_blocks,
        "D_V": d_v,
        "WIDE_PIECES": MERGE_WIDE_PIECES,
        "WIDE_BLOCKS": wide_blocks if wide_blocks < column_blocks else 0,
        "WIDE_ROWS": wide_rows,
    }


def _dependent_options(dependent: bool) -> dict[str, bool]:
    # Only CUDA's backend knows the option.
    return {"launch_pdl": True} if dependent else {}
