"""Probe (experiment, not the package's kernel): the seesaw schedule on
whole 64-token pages, with no producer warps.

What it tests. Score/value's compute-bound period is set by its chain and
its two-stage ring together ("Where a compute-bound tile's time goes",
RESULTS.md): the score warpgroup's softmax runs with the tensor cores idle,
and each 72 KB stage is held from its arrival through both P V. The seesaw
(FlashMLA's published schedule) overlaps one warpgroup's softmax with the
other's products; this version also frees each stage in three groups of
columns (latent 0-255, latent 256-511, rope), each reloaded by TMA by the
warpgroup whose product last read it, as soon as that product is done.
Both warpgroups keep 240 registers: no producer partition holds any.

Tiles come in pairs, A (stage 0) and B (stage 1). The left warpgroup holds
output columns 0-255, the right 256-511; m is the running row max:

    left   S_A = Q A^T; m_A = max(m, max S_A); P_A = exp(S_A - m_A);
           O_L = O_L e^(m - m_A) + P_A A_L                  -> frees A_L
    right  S_B = Q B^T; takes m_A; m_B = max(m_A, max S_B);
           P_B = exp(S_B - m_B) (into B's rope rows);
           O_R = O_R e^(m - m_B) + P_B B_R                  -> frees B_R
    left   P_A' = P_A e^(m_A - m_B) (into A's rope rows);
           O_L = O_L e^(m_A - m_B) + P_B B_L                -> frees B_L, B's rope
    right  O_R += P_A' A_R                                  -> frees A_R, A's rope

Q K^T waits for each column group's copy in turn, so the scores of the
next pair start on the groups freed first.

Synthetic steady state: CTA (head block, c) streams pages c * n .. c * n +
n - 1 of a block table (n even), every key visible, and writes its 64 rows'
normalised output and log2-sum-exp, which the script checks against a float
reference for a few CTAs. Then it times the probe beside the package's
``verify_mla_paged`` on the same pages and a bf16 matmul, by the
benchmark's clock (CUDA-graph replays). With --stamps a
build of its own that reads the SM's clock at eleven points of each
warpgroup's pair (pairs 4-12 of every CTA) runs once more, and the script
prints each point's median cycles after the pair's start and the pair's
period against the tensor cores' rate: where a pair's time goes, in the
same run.

    python scripts/probe_seesaw_pages.py [--heads 64 --drafts 4 --batch 32 --context 16384]
        [--gather] [--late-release] [--a-first] [--slices] [--stamps]
"""

from __future__ import annotations

import argparse
import math

import bench_timing  # scripts/, first on the path when run as a script
import model_seesaw
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

import mla_verify

# Triton 3.6's names and their later renames, as the package's kernel has them.
from mla_verify.kernel_sm90 import _cp_async, _tma_load, _warps_barrier

ROWS = gl.constexpr(64)
TOKENS = gl.constexpr(64)
D_NOPE = gl.constexpr(512)
D_ROPE = gl.constexpr(64)
HALF = gl.constexpr(256)
GROUPS = gl.constexpr(3)  # column groups a stage: latent left, latent right, rope
REGS = gl.constexpr(240)  # each warpgroup's, with TMA
# With gathers (page size 1) a producer partition of 4 warps issues the
# cp.async copies: 12 warps of 168 registers, shared out as below.
GATHER_REGS = (216, 224, 64)  # left, right, producer
REP_MS = 10  # the benchmark's --rep-ms in RESULTS.md's runs
# Barriers of the hand-overs between the warpgroups, one phase a pair.
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
SCALE_A = gl.constexpr(0)  # m_A, e^(m - m_A) and P_A (at m_A), from the left
SCALE_B = gl.constexpr(1)  # m_B, e^(m_A - m_B), from the right
P_B = gl.constexpr(2)  # P_B, from the right
SUMS = gl.constexpr(3)
# --late-release only: a warpgroup's own product on the other's stage is done.
A_L_DONE = gl.constexpr(4)  # from the left: P_A A_L
B_R_DONE = gl.constexpr(5)  # from the right: P_B B_R
# --stamps: clock64 at fixed points of pairs FIRST_STAMPED .. + STAMPED - 1
# of every CTA, SLOTS a warpgroup (the left's first, then the right's).
FIRST_STAMPED = gl.constexpr(4)
STAMPED = gl.constexpr(9)
SLOTS = gl.constexpr(16)
LEFT_POINTS = (
    "pair start", "latent 0-255 ready", "latent 256-511 ready", "rope ready", "scores done",
    "P_A handed", "P_A A_L done", "m_B received", "P_B received", "P_B B_L done", "loads issued",
)  # fmt: skip
RIGHT_POINTS = (
    "pair start", "latent 0-255 ready", "latent 256-511 ready", "rope ready", "scores done",
    "m_A received", "P_B handed", "P_B B_R done", "P_A rescaled", "P_A A_R done", "loads issued",
)  # fmt: skip


@gluon.jit
def _stamp(st, k: gl.constexpr, STAMPS: gl.constexpr):
    # --stamps: the SM's cycle counter into slot k of this pair's row; a
    # masked store, no branch, so the wgmma chain around it stays whole.
    if STAMPS:
        TIMES, row, stamped = st
        now = gl.inline_asm_elementwise(
            "mov.u64 $0, %clock64;", "=l,r", [row], dtype=gl.int64, is_pure=False, pack=1
        )
        gl.store(TIMES + row * (2 * SLOTS) + k, now, mask=stamped)


@gluon.jit
def _stamps_of(TIMES, cta, pair, STAMPS: gl.constexpr):
    # (TIMES, this pair's row, whether it is stamped): rows run CTA by CTA.
    if STAMPS:
        stamped = (pair >= FIRST_STAMPED) & (pair < FIRST_STAMPED + STAMPED)
        return (TIMES, cta * STAMPED + pair - FIRST_STAMPED, stamped)
    else:
        return (TIMES, 0, False)


@gluon.jit
def _issue(TABLE, page0, tile, group: gl.constexpr, ring, ready, descs):
    # One column group of `tile` into its stage (tile % 2), by TMA: a copy
    # a group, or with --slices a copy a 64-column slice, each with its own
    # barrier (ready holds 2 x 9 then, not 2 x 3).
    nope_ring, rope_ring = ring
    nope_desc, rope_desc = descs
    bars: gl.constexpr = ready.shape[0] // 2
    pieces: gl.constexpr = (bars - 1) // 2  # copies a latent half
    width: gl.constexpr = HALF // pieces
    stage = tile % 2
    slot = gl.load(TABLE + page0 + tile) * TOKENS
    if group == 2:
        bar = ready.index(stage * bars + bars - 1)
        mbarrier.expect(bar, TOKENS * D_ROPE * 2)
        _tma_load(rope_desc, [slot, 0], bar, rope_ring.index(stage))
    else:
        for k in gl.static_range(pieces):
            bar = ready.index(stage * bars + group * pieces + k)
            mbarrier.expect(bar, TOKENS * width * 2)
            dst = nope_ring.index(stage).slice(group * HALF + k * width, width, dim=1)
            _tma_load(nope_desc, [slot, group * HALF + k * width], bar, dst)


@gluon.jit
def _free(src, tile, group: gl.constexpr, ring, ready, GATHER: gl.constexpr):
    # A column group of a stage has had its last reader: reload it with
    # `tile`'s rows by TMA, or tell the producer so (GATHER).
    TABLE, page0, descs, empty = src
    if GATHER:
        mbarrier.arrive(empty.index((tile % 2) * GROUPS + group), count=1)
    else:
        _issue(TABLE, page0, tile, group, ring, ready, descs)


@gluon.jit
def _gather_group(
    POOL, rows, stage, group: gl.constexpr, ring, ready, empty, phase, layout: gl.constexpr
):
    # GATHER: one column group of a tile's 64 rows (pool rows `rows`) by
    # cp.async, once its last reader has freed it.
    nope_ring, rope_ring = ring
    bar = stage * GROUPS + group
    mbarrier.wait(empty.index(bar), phase)
    if group == 2:
        cols = D_NOPE + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, layout))
        dst = rope_ring.index(stage)
    else:
        cols = group * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
        dst = nope_ring.index(stage).slice(group * HALF, HALF, dim=1)
    _cp_async(dst, POOL + rows.to(gl.int64)[:, None] * (D_NOPE + D_ROPE) + cols[None, :])
    async_copy.mbarrier_arrive(ready.index(bar), increment_count=False)


@gluon.jit
def _gatherer(TABLE, POOL, page0, n_tiles, ring, ready, empty):
    # GATHER: the producer. Tile t's rows are pool rows TABLE[(page0 + t)
    # * 64 ..]; each stage's groups in the order their readers free them
    # (A: the left's latent half first; B: the right's).
    half_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    for t in range(n_tiles):
        stage = t % 2
        phase = ((t // 2) & 1) ^ 1
        first = (page0 + t) * TOKENS
        offs = first + gl.arange(0, TOKENS, layout=gl.SliceLayout(1, half_layout))
        rows = gl.load(TABLE + offs)
        if stage == 0:
            _gather_group(POOL, rows, stage, 0, ring, ready, empty, phase, half_layout)
            _gather_group(POOL, rows, stage, 1, ring, ready, empty, phase, half_layout)
        else:
            _gather_group(POOL, rows, stage, 1, ring, ready, empty, phase, half_layout)
            _gather_group(POOL, rows, stage, 0, ring, ready, empty, phase, half_layout)
        offs = first + gl.arange(0, TOKENS, layout=gl.SliceLayout(1, rope_layout))
        rows = gl.load(TABLE + offs)
        _gather_group(POOL, rows, stage, 2, ring, ready, empty, phase, rope_layout)


@gluon.jit
def _scores(q, ring, ready, stage, z, phase, zero_s, st, k0: gl.constexpr, STAMPS: gl.constexpr):
    # S = Q K^T over the stage's copies (column groups, or 64-column
    # slices), each waited for in turn; z is 0 (see _left). Stamps k0 + 1
    # .. k0 + 4: each group ready (with slices, its first slice), done.
    q_nope = q[0].index(z)
    q_rope = q[1].index(z)
    nope_ring, rope_ring = ring
    kv = nope_ring.index(stage)
    bars: gl.constexpr = ready.shape[0] // 2
    pieces: gl.constexpr = (bars - 1) // 2
    width: gl.constexpr = HALF // pieces
    s = zero_s
    for k in gl.static_range(2 * pieces):
        mbarrier.wait(ready.index(stage * bars + k), phase)
        if k % pieces == 0:
            _stamp(st, k0 + 1 + k // pieces, STAMPS)
        s = warpgroup_mma(
            q_nope.slice(k * width, width, dim=1),
            kv.slice(k * width, width, dim=1).permute((1, 0)),
            s,
            use_acc=k > 0,
            is_async=True,
        )
    mbarrier.wait(ready.index(stage * bars + bars - 1), phase)
    _stamp(st, k0 + 3, STAMPS)
    s = warpgroup_mma(q_rope, rope_ring.index(stage).permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s])
    _stamp(st, k0 + 4, STAMPS)
    return s


@gluon.jit
def _left(both, LSE, GATHER: gl.constexpr, EARLY: gl.constexpr, STAMPS: gl.constexpr):
    # Output columns 0-255; scores tile A of each pair. Stamps 0-10.
    q, ring, ready, xchg, hand, src, n_tiles, scale, zero, O, out_row0, stamps = both
    nope_ring, rope_ring = ring
    zero_s = gl.zeros([ROWS, TOKENS], gl.float32, layout=S_LAYOUT)
    acc = gl.zeros([ROWS, HALF], gl.float32, layout=O_LAYOUT)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=S_ROWS)
    l_i = gl.zeros([ROWS], gl.float32, layout=S_ROWS)
    if not GATHER:  # the first pair's tiles
        TABLE, page0, descs, _ = src
        for t in gl.static_range(2):
            for group in gl.static_range(GROUPS):
                _issue(TABLE, page0, t, group, ring, ready, descs)
    for pair in range(n_tiles // 2):
        phase = pair & 1
        a = 2 * pair
        more = a + 2 < n_tiles
        # z = 0, but a value of the loop to ptxas: the wgmma descriptors
        # of q and of this warpgroup's stage, hoisted out of the loop
        # where their stage is a constant, spilled 30-40 registers a pair.
        z = pair & zero
        sa = z
        sb = z + 1
        st = _stamps_of(stamps[0], stamps[1], pair, STAMPS)
        _stamp(st, 0, STAMPS)
        s = _scores(q, ring, ready, sa, z, phase, zero_s, st, 0, STAMPS)
        m_a = gl.maximum(m_i, gl.max(s, 1) * scale)
        alpha = gl.exp2(m_i - m_a)
        p = gl.exp2(s * scale - m_a[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        p_bf16 = p.to(gl.bfloat16)
        # P_A at A's max into A's spent rope rows; the right rescales it.
        rope_ring.index(sa).store(p_bf16)
        xchg.index(0).store(m_a)
        xchg.index(1).store(alpha)
        _warps_barrier()
        mbarrier.arrive(hand.index(SCALE_A), count=1)
        _stamp(st, 5, STAMPS)
        acc = acc * gl.convert_layout(alpha, O_ROWS)[:, None]
        p_reg = gl.convert_layout(p_bf16, P_LAYOUT)
        acc = warpgroup_mma(p_reg, nope_ring.index(sa).slice(0, HALF, dim=1), acc)
        _stamp(st, 6, STAMPS)
        if EARLY:
            if more:  # A_L is free
                _free(src, a + 2, 0, ring, ready, GATHER)
        else:
            mbarrier.arrive(hand.index(A_L_DONE), count=1)
        mbarrier.wait(hand.index(SCALE_B), phase)
        _stamp(st, 7, STAMPS)
        m_i = xchg.index(2).load(S_ROWS)
        beta = xchg.index(3).load(S_ROWS)
        l_i = l_i * beta
        acc = acc * gl.convert_layout(beta, O_ROWS)[:, None]
        mbarrier.wait(hand.index(P_B), phase)
        _stamp(st, 8, STAMPS)
        acc = warpgroup_mma(rope_ring.index(sb), nope_ring.index(sb).slice(0, HALF, dim=1), acc)
        _stamp(st, 9, STAMPS)
        if not EARLY:  # the whole of B, once the right's P_B B_R is done too
            mbarrier.wait(hand.index(B_R_DONE), phase)
        if more:  # B_L and B's rope rows (P_B) are free
            _free(src, a + 3, 0, ring, ready, GATHER)
            _free(src, a + 3, 2, ring, ready, GATHER)
            if not EARLY:
                _free(src, a + 3, 1, ring, ready, GATHER)
        _stamp(st, 10, STAMPS)
    # The right warpgroup's row sums are at the same max: add them.
    mbarrier.wait(hand.index(SUMS), 0)
    l_i = l_i + xchg.index(4).load(S_ROWS)
    xchg.index(5).store(l_i)
    _warps_barrier()
    mbarrier.arrive(hand.index(SUMS), count=1)
    gl.store(LSE + out_row0 + gl.arange(0, ROWS, layout=S_ROWS), m_i + gl.log2(l_i))
    _store(acc / gl.convert_layout(l_i, O_ROWS)[:, None], O, out_row0, 0)


@gluon.jit
def _right(
    both, GATHER: gl.constexpr, EARLY: gl.constexpr, STAMPS: gl.constexpr, A_FIRST: gl.constexpr
):
    # Output columns 256-511; scores tile B of each pair. Stamps SLOTS + 0-10.
    q, ring, ready, xchg, hand, src, n_tiles, scale, zero, O, out_row0, stamps = both
    nope_ring, rope_ring = ring
    zero_s = gl.zeros([ROWS, TOKENS], gl.float32, layout=S_LAYOUT)
    acc = gl.zeros([ROWS, HALF], gl.float32, layout=O_LAYOUT)
    l_i = gl.zeros([ROWS], gl.float32, layout=S_ROWS)
    for pair in range(n_tiles // 2):
        phase = pair & 1
        a = 2 * pair
        more = a + 2 < n_tiles
        z = pair & zero  # 0 (_left)
        sa = z
        sb = z + 1
        st = _stamps_of(stamps[0], stamps[1], pair, STAMPS)
        _stamp(st, SLOTS, STAMPS)
        s = _scores(q, ring, ready, sb, z, phase, zero_s, st, SLOTS, STAMPS)
        mbarrier.wait(hand.index(SCALE_A), phase)
        _stamp(st, SLOTS + 5, STAMPS)
        m_a = xchg.index(0).load(S_ROWS)
        alpha = xchg.index(1).load(S_ROWS)
        m_b = gl.maximum(m_a, gl.max(s, 1) * scale)
        beta = gl.exp2(m_a - m_b)
        p = gl.exp2(s * scale - m_b[:, None])
        xchg.index(2).store(m_b)
        xchg.index(3).store(beta)
        _warps_barrier()
        mbarrier.arrive(hand.index(SCALE_B), count=1)
        l_i = l_i * (alpha * beta) + gl.sum(p, 1)
        p_bf16 = p.to(gl.bfloat16)
        rope_ring.index(sb).store(p_bf16)  # B's rope rows are spent
        fence_async_shared()
        _warps_barrier()
        mbarrier.arrive(hand.index(P_B), count=1)
        _stamp(st, SLOTS + 6, STAMPS)
        acc = acc * gl.convert_layout(alpha * beta, O_ROWS)[:, None]
        tiles = (ring, ready, hand, src, a, more, phase, st)
        if A_FIRST:
            acc = _right_adds_a(acc, beta, sa, tiles, GATHER, EARLY, STAMPS)
            acc = _right_adds_b(acc, p_bf16, sb, tiles, GATHER, EARLY, STAMPS)
        else:
            acc = _right_adds_b(acc, p_bf16, sb, tiles, GATHER, EARLY, STAMPS)
            acc = _right_adds_a(acc, beta, sa, tiles, GATHER, EARLY, STAMPS)
        _stamp(st, SLOTS + 10, STAMPS)
    xchg.index(4).store(l_i)
    _warps_barrier()
    mbarrier.arrive(hand.index(SUMS), count=1)
    mbarrier.wait(hand.index(SUMS), 1)
    l_i = xchg.index(5).load(S_ROWS)
    _store(acc / gl.convert_layout(l_i, O_ROWS)[:, None], O, out_row0, HALF)


@gluon.jit
def _right_adds_b(
    acc, p_bf16, sb, tiles, GATHER: gl.constexpr, EARLY: gl.constexpr, STAMPS: gl.constexpr
):
    # The right warpgroup: O_R += P_B B_R; then B_R is free.
    ring, ready, hand, src, a, more, phase, st = tiles
    nope_ring, rope_ring = ring
    p_reg = gl.convert_layout(p_bf16, P_LAYOUT)
    acc = warpgroup_mma(p_reg, nope_ring.index(sb).slice(HALF, HALF, dim=1), acc)
    _stamp(st, SLOTS + 7, STAMPS)
    if EARLY:
        if more:
            _free(src, a + 3, 1, ring, ready, GATHER)
    else:
        mbarrier.arrive(hand.index(B_R_DONE), count=1)
    return acc


@gluon.jit
def _right_adds_a(
    acc, beta, sa, tiles, GATHER: gl.constexpr, EARLY: gl.constexpr, STAMPS: gl.constexpr
):
    # The right warpgroup: O_R += P_A' A_R, with P_A (the left's, at A's
    # max: SCALE_A) taken to B's max as the register A operand; then A_R
    # and A's rope rows (P_A) are free.
    ring, ready, hand, src, a, more, phase, st = tiles
    nope_ring, rope_ring = ring
    p_a = rope_ring.index(sa).load(P_LAYOUT).to(gl.float32)
    p_a = (p_a * gl.convert_layout(beta, gl.SliceLayout(1, P_LAYOUT))[:, None]).to(gl.bfloat16)
    _stamp(st, SLOTS + 8, STAMPS)
    acc = warpgroup_mma(p_a, nope_ring.index(sa).slice(HALF, HALF, dim=1), acc)
    _stamp(st, SLOTS + 9, STAMPS)
    if not EARLY:  # the whole of A, once the left's P_A A_L is done too
        mbarrier.wait(hand.index(A_L_DONE), phase)
    if more:
        _free(src, a + 2, 1, ring, ready, GATHER)
        _free(src, a + 2, 2, ring, ready, GATHER)
        if not EARLY:
            _free(src, a + 2, 0, ring, ready, GATHER)
    return acc


@gluon.jit
def _store(out, O, out_row0, col0):
    layout: gl.constexpr = out.type.layout
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    gl.store(O + (out_row0 + rows)[:, None] * D_NOPE + cols[None, :], out.to(gl.bfloat16))


@gluon.jit
def _probe_kernel(
    Q,
    TABLE,
    POOL,
    O,
    LSE,
    TIMES,
    nope_desc,
    rope_desc,
    n_tiles,
    scale,
    zero,
    GATHER: gl.constexpr,
    EARLY: gl.constexpr,
    STAMPS: gl.constexpr,
    A_FIRST: gl.constexpr,
    READY_BARS: gl.constexpr,
    RIGHT_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
):
    # TABLE: a page a tile (TMA), or with GATHER the pool row of each
    # token, 64 a tile.
    head_block = gl.program_id(0)
    c = gl.program_id(1)
    page0 = c * n_tiles
    out_row0 = (c * gl.num_programs(0) + head_block) * ROWS
    nope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D_NOPE], gl.bfloat16)
    rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D_ROPE], gl.bfloat16)
    q_nope = gl.allocate_shared_memory(gl.bfloat16, [1, ROWS, D_NOPE], nope_layout)
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [1, ROWS, D_ROPE], rope_layout)
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, blocked))
    q_rows = Q + (head_block * ROWS + rows).to(gl.int64)[:, None] * (D_NOPE + D_ROPE)
    for piece in gl.static_range(D_NOPE // 64):
        cols = piece * 64 + gl.arange(0, 64, layout=gl.SliceLayout(0, blocked))
        q_nope.index(0).slice(piece * 64, 64, dim=1).store(gl.load(q_rows + cols[None, :]))
    cols = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, blocked))
    q_rope.index(0).store(gl.load(q_rows + D_NOPE + cols[None, :]))
    nope_ring = gl.allocate_shared_memory(gl.bfloat16, [2, TOKENS, D_NOPE], nope_layout)
    rope_ring = gl.allocate_shared_memory(gl.bfloat16, [2, TOKENS, D_ROPE], rope_layout)
    # Row vectors the warpgroups hand over: m_A, e^(m - m_A), m_B,
    # e^(m_A - m_B), the right's row sums, their total.
    xchg = gl.allocate_shared_memory(gl.float32, [6, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # READY_BARS a stage: GROUPS, or with --slices one a 64-column slice.
    ready = gl.allocate_shared_memory(gl.int64, [2 * READY_BARS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2 * GROUPS, 1], mbarrier.MBarrierLayout())
    hand = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2 * READY_BARS):
        # A TMA copy's expect, or each producer thread's cp.async.
        mbarrier.init(ready.index(i), count=128 if GATHER else 1)
    for i in gl.static_range(2 * GROUPS):
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(6):
        mbarrier.init(hand.index(i), count=1)
    fence_async_shared()
    _warps_barrier()
    q = (q_nope, q_rope)
    ring = (nope_ring, rope_ring)
    src = (TABLE, page0, (nope_desc, rope_desc), empty)
    stamps = (TIMES, c * gl.num_programs(0) + head_block)
    # What both warpgroups take.
    both = (q, ring, ready, xchg, hand, src, n_tiles, scale, zero, O, out_row0, stamps)
    left_args = (both, LSE, GATHER, EARLY, STAMPS)
    right_args = (both, GATHER, EARLY, STAMPS, A_FIRST)
    if GATHER:
        gl.warp_specialize(
            [
                (_left, left_args),
                (_right, right_args),
                (_gatherer, (TABLE, POOL, page0, n_tiles, ring, ready, empty)),
            ],
            [4, 4],
            [RIGHT_REGS, PRODUCER_REGS],
        )
    else:
        gl.warp_specialize([(_left, left_args), (_right, right_args)], [4], [RIGHT_REGS])


def descriptors(pool, slice_cols=256):
    """TMA descriptors of the pool's rows [tokens, 576]: a 64-token tile of
    ``slice_cols`` latent columns (a half, or with --slices 64), and of the
    rope columns."""
    out = []
    for first, width, block in ((0, 512, slice_cols), (512, 64, 64)):
        layout = gl.NVMMASharedLayout.get_default_for([64, block], gl.bfloat16)
        out.append(
            TensorDescriptor.from_tensor(pool[:, first : first + width], [64, block], layout)
        )
    return out


def launch(
    q,
    pool,
    table,
    n_tiles,
    scale,
    head_blocks,
    ctas,
    gather,
    out,
    lse,
    early=True,
    a_first=False,
    slices=False,
    times=None,
):
    """The probe over ``table`` into ``out`` [CTAs x 64 rows, 512] and
    ``lse``: pages (TMA) or, with ``gather``, pool rows (64 a tile,
    cp.async); ``early``: each column group reloaded once its last reader
    is done with it, else each stage once both are; ``a_first``: the right
    warpgroup adds P_A A_R before P_B B_R; ``slices`` (TMA): a copy and a
    barrier a 64-column slice. ``times``: an int64 buffer of
    ``stamp_rows(...) x 2 SLOTS`` for the stamps (a build of its own: the
    timed one has none)."""
    nope_desc, rope_desc = descriptors(pool, 64 if slices else 256)
    if gather:
        left, right, producer = GATHER_REGS
        regs = dict(
            RIGHT_REGS=right, PRODUCER_REGS=producer, maxnreg=(left + right + producer) // 3
        )
    else:
        regs = dict(RIGHT_REGS=REGS.value, PRODUCER_REGS=0, maxnreg=REGS.value)
    _probe_kernel[(head_blocks, ctas)](
        q,
        table,
        pool,
        out,
        lse,
        lse if times is None else times,
        nope_desc,
        rope_desc,
        n_tiles,
        scale * math.log2(math.e),
        0,
        GATHER=gather,
        EARLY=early,
        STAMPS=times is not None,
        A_FIRST=a_first,
        READY_BARS=9 if slices else GROUPS.value,
        num_warps=4,
        **regs,
    )


def stamp_rows(head_blocks, ctas):
    """Rows of the stamps' buffer: a stamped pair of each CTA."""
    return head_blocks * ctas * STAMPED.value


def stamp_report(times):
    """The stamps as a table: each point's median cycles after the left
    warpgroup's pair start, and the pair's period against its products at
    the tensor cores' rate (``model_seesaw.PAIR`` cycles)."""
    t = times.view(-1, STAMPED.value, 2 * SLOTS.value).double()
    start = t[:, :, :1]
    period = (start[:, 1:] - start[:, :-1]).median().item()
    after = (t - start)[:, :-1]  # the last stamped pair only closes a period
    lines = [f"{'point (left / right)':<44} {'left':>6} {'right':>6}"]
    for k, (left, right) in enumerate(zip(LEFT_POINTS, RIGHT_POINTS)):
        name = left if left == right else f"{left} / {right}"
        at_left = after[:, :, k].median().item()
        at_right = after[:, :, SLOTS.value + k].median().item()
        lines.append(f"{name:<44} {at_left:>6.0f} {at_right:>6.0f}")
    ideal = model_seesaw.PAIR
    lines.append(
        f"pair period {period:.0f} cycles (median); at the tensor cores' rate "
        f"{ideal:.0f}: {ideal / period:.1%}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--drafts", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument(
        "--gather", action="store_true", help="page size 1: a producer gathers rows by cp.async"
    )
    parser.add_argument(
        "--stamps",
        action="store_true",
        help="after the timing, one call of a stamped build: where each pair's cycles go",
    )
    parser.add_argument(
        "--a-first",
        action="store_true",
        help="the right warpgroup adds P_A A_R before P_B B_R: all of tile A free by mid-pair",
    )
    parser.add_argument(
        "--slices",
        action="store_true",
        help="TMA: a copy and a barrier a 64-column slice, the scores on each as it lands "
        "(the stamps' 'ready' points are then each group's first slice)",
    )
    parser.add_argument(
        "--late-release",
        action="store_true",
        help="reload a stage only once both warpgroups are done with it (the column groups' worth)",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    rows = args.heads * args.drafts
    head_blocks = rows // 64
    ctas = torch.cuda.get_device_properties(0).multi_processor_count // head_blocks
    pages = args.batch * args.context // 64
    n_tiles = pages // ctas // 2 * 2
    if args.slices and args.gather:
        parser.error("--slices: TMA copies; --gather loads each group by cp.async")
    if args.stamps and n_tiles // 2 < FIRST_STAMPED + STAMPED:
        parser.error(f"--stamps: {n_tiles // 2} pairs a CTA, fewer than the stamped ones' end")
    pool = torch.randn(pages * 64, 576, device=dev, dtype=torch.bfloat16)
    if args.gather:  # a pool row a token, scattered
        table = torch.randperm(pages * 64, device=dev, dtype=torch.int32)
        slots_of = lambda c: table[c * n_tiles * 64 : (c + 1) * n_tiles * 64].long()  # noqa: E731
    else:  # a page a tile
        table = torch.randperm(pages, device=dev, dtype=torch.int32)
        slots_of = (
            lambda c: (  # noqa: E731
                table[c * n_tiles : (c + 1) * n_tiles].long()[:, None] * 64
                + torch.arange(64, device=dev)
            ).reshape(-1)
        )
    q = torch.randn(rows, 576, device=dev, dtype=torch.bfloat16)
    scale = 1 / math.sqrt(192)
    launch_args = (q, pool, table, n_tiles, scale, head_blocks, ctas, args.gather)
    orders = (not args.late_release, args.a_first, args.slices)
    # Poisoned: the check below reads only what the probe wrote.
    out = torch.full((ctas * head_blocks * 64, 512), float("nan"), device=dev, dtype=torch.bfloat16)
    lse = torch.full((ctas * head_blocks * 64,), float("nan"), device=dev)
    call = lambda: launch(*launch_args, out, lse, *orders)  # noqa: E731
    call()
    torch.cuda.synchronize()
    errors = []
    for c in (0, ctas // 2, ctas - 1):
        kv = pool[slots_of(c)].float()
        for hb in range(head_blocks):
            s = q[hb * 64 : (hb + 1) * 64].float() @ kv.T * scale
            ref = torch.softmax(s, 1) @ kv[:, :512]
            ref_lse = torch.logsumexp(s, 1) / math.log(2)
            r0 = (c * head_blocks + hb) * 64
            errors.append(((out[r0 : r0 + 64].float() - ref).abs().max() / ref.abs().max()).item())
            errors.append((lse[r0 : r0 + 64] - ref_lse).abs().max().item())
    # A row left unwritten is NaN, which max() would pass over.
    worst = max(errors) if all(map(math.isfinite, errors)) else float("nan")
    print(f"check: worst error {worst:.2e}", "ok" if worst < 2e-2 else "FAILED")

    # The benchmark's clock: CUDA-graph replays.
    t_probe = bench_timing.time_graph([call], rep_ms=REP_MS, written=lambda: out).median_us
    # The package on the same rows: each request's pages (or tokens) in
    # table order, its last L positions its drafts.
    page_size = 1 if args.gather else 64
    block_table = table.view(args.batch, -1)
    kv_cache = pool.view(-1, page_size, 1, 576)
    q_paged = torch.randn(
        args.batch, args.drafts, args.heads, 576, device=dev, dtype=torch.bfloat16
    )
    tokens = pages * 64 // args.batch
    seqlens = torch.full((args.batch,), tokens, device=dev, dtype=torch.int32)
    o_paged = torch.empty(args.batch, args.drafts, args.heads, 512, device=dev, dtype=q.dtype)
    t_package = bench_timing.time_graph(
        [lambda: mla_verify.verify_mla_paged(q_paged, kv_cache, block_table, seqlens, out=o_paged)],
        rep_ms=REP_MS,
        written=lambda: o_paged,
    ).median_us
    matmul = bench_timing.matmul_rate(torch.device(dev), REP_MS) * 1e12
    flops = head_blocks * ctas * n_tiles * 2 * 64 * 64 * (576 + 512)
    rate = flops / t_probe * 1e6
    package_rate = 2 * rows * args.batch * tokens * (576 + 512) / t_package * 1e6
    kind = "page size 1, gathered" if args.gather else "64-token pages, TMA"
    kind += ", a stage reloaded whole" if args.late_release else ", column groups reloaded"
    kind += ", the right adds A first" if args.a_first else ""
    kind += ", 64-column copies" if args.slices else ""
    print(f"H{args.heads}L{args.drafts}B{args.batch}C{args.context}, {kind}")
    print(f"matmul {matmul / 1e12:.0f} TFLOP/s")
    print(
        f"probe: {t_probe:.1f} us, {rate / 1e12:.0f} TFLOP/s, {rate / matmul:.1%} of matmul; "
        f"{t_probe * 1e3 / n_tiles:.0f} ns a tile a CTA ({ctas * n_tiles} of {pages} tiles)"
    )
    print(
        f"verify_mla_paged: {t_package:.1f} us, {package_rate / 1e12:.0f} TFLOP/s, "
        f"{package_rate / matmul:.1%} of matmul (all {pages} tiles, stage 2 and plan included)"
    )
    if args.stamps:
        rows = stamp_rows(head_blocks, ctas)
        times = torch.zeros(rows, 2 * SLOTS.value, device=dev, dtype=torch.int64)
        launch(*launch_args, out, lse, *orders, times=times)
        torch.cuda.synchronize()
        print(stamp_report(times.cpu()))


if __name__ == "__main__":
    main()
