"""Probe (experiment, not the package's kernel): can a third ring stage lift
the compute-bound rate?

Score/value holds q (72 KB) in shared memory beside two 72 KB stages, and a
stage stays held from its arrival through the scores, the softmax and both
P V; with two stages the ring sets the period ("Where a compute-bound
tile's time goes", RESULTS.md). Here the score warpgroup holds q in its
registers (the A operand of Q K^T: 144 registers a thread, or 128 with the
rope columns left in shared memory), which frees room for a third stage.
The score warpgroup only scores and hands P over (into the tile's spent
rope rows); an 8-warp value partition adds P V for all 512 columns and
issues the next TMA loads into the stage it has just freed.

Synthetic steady state: CTA (head block, c) streams pages c * n .. c * n +
n - 1 of a block table, 64 tokens a page, every key visible; it writes its
64 rows' normalised output and log2-sum-exp, which the script checks
against a float reference for a few CTAs. Then it times the probe beside
``verify_mla_paged`` on the same pages (and FlashMLA where importable).

    python scripts/probe_q_registers.py [--rope-in-smem] [--value-regs 152]
"""

from __future__ import annotations

import argparse
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_warps_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

ROWS = gl.constexpr(64)
TOKENS = gl.constexpr(64)
D_NOPE = gl.constexpr(512)
D_ROPE = gl.constexpr(64)
STAGES = gl.constexpr(3)
MAX_REGS = 168


@gluon.jit
def _score_partition(
    Q,
    head_block,
    q_rope_smem,
    nope_ring,
    rope_ring,
    xchg,
    ready,
    p_bar,
    sums_bar,
    n_tiles,
    scale,
    LSE,
    out_row0,
    ROPE_IN_REGS: gl.constexpr,
):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, a_layout))
    cols = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, a_layout))
    q_base = Q + (head_block * ROWS + rows).to(gl.int64)[:, None] * (D_NOPE + D_ROPE)
    q_nope = gl.load(q_base + cols[None, :])
    rope_cols = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, a_layout))
    if ROPE_IN_REGS:  # noqa: SIM108 (a constexpr branch in a Gluon function)
        q_rope = gl.load(q_base + D_NOPE + rope_cols[None, :])
    else:
        q_rope = q_rope_smem
    zero_s = gl.zeros([ROWS, TOKENS], gl.float32, layout=s_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=s_rows)
    l_i = gl.zeros([ROWS], gl.float32, layout=s_rows)
    for t in range(n_tiles):
        stage = t % STAGES
        mbarrier.wait(ready.index(stage), (t // STAGES) & 1)
        kv_nope = nope_ring.index(stage)
        kv_rope = rope_ring.index(stage)
        qk = warpgroup_mma(q_nope, kv_nope.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        qk = warpgroup_mma(q_rope, kv_rope.permute((1, 0)), qk, is_async=True)
        qk = warpgroup_mma_wait(0, deps=[qk])
        m_new = gl.maximum(m_i, gl.max(qk, 1) * scale)
        p = gl.exp2(qk * scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        kv_rope.store(p.to(gl.bfloat16))  # the tile's rope rows are spent
        xchg.index(stage).store(alpha)
        fence_async_shared()
        _warps_barrier()
        mbarrier.arrive(p_bar.index(stage), count=1)
    xchg.index(STAGES).store(l_i)
    _warps_barrier()
    mbarrier.arrive(sums_bar, count=1)
    gl.store(LSE + out_row0 + gl.arange(0, ROWS, layout=s_rows), m_i + gl.log2(l_i))


@gluon.jit
def _issue_tile(TABLE, page0, t, nope_ring, rope_ring, ready, nope_desc, rope_desc):
    stage = t % STAGES
    slot = gl.load(TABLE + page0 + t) * TOKENS
    bar = ready.index(stage)
    mbarrier.expect(bar, TOKENS * (D_NOPE + D_ROPE) * 2)
    _tma_load(nope_desc, [slot, 0], bar, nope_ring.index(stage))
    _tma_load(rope_desc, [slot, 0], bar, rope_ring.index(stage))


@gluon.jit
def _value_partition(
    TABLE,
    page0,
    nope_ring,
    rope_ring,
    xchg,
    ready,
    p_bar,
    sums_bar,
    n_tiles,
    nope_desc,
    rope_desc,
    O,
    out_row0,
):
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16]
    )
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    for t in gl.static_range(STAGES):
        _issue_tile(TABLE, page0, t, nope_ring, rope_ring, ready, nope_desc, rope_desc)
    acc = gl.zeros([ROWS, D_NOPE], gl.float32, layout=o_layout)
    for t in range(n_tiles):
        stage = t % STAGES
        mbarrier.wait(p_bar.index(stage), (t // STAGES) & 1)
        acc = acc * xchg.index(stage).load(o_rows)[:, None]
        acc = warpgroup_mma(rope_ring.index(stage), nope_ring.index(stage), acc)
        _warps_barrier()  # both warpgroups' P V have read the stage
        if t + STAGES < n_tiles:
            _issue_tile(TABLE, page0, t + STAGES, nope_ring, rope_ring, ready, nope_desc, rope_desc)
    mbarrier.wait(sums_bar, 0)
    l_i = xchg.index(STAGES).load(o_rows)
    # Through a spent stage: stored from the accumulator's layout, the
    # output's addresses alone would take more registers than the partition has.
    staged = nope_ring.index(0)
    staged.store((acc / l_i[:, None]).to(gl.bfloat16))
    _warps_barrier()
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, blocked))
    cols = gl.arange(0, D_NOPE, layout=gl.SliceLayout(0, blocked))
    gl.store(O + (out_row0 + rows)[:, None] * D_NOPE + cols[None, :], staged.load(blocked))


@gluon.jit
def _probe_kernel(
    Q,
    TABLE,
    O,
    LSE,
    nope_desc,
    rope_desc,
    n_tiles,
    scale,
    ROPE_IN_REGS: gl.constexpr,
    VALUE_REGS: gl.constexpr,
):
    head_block = gl.program_id(0)
    c = gl.program_id(1)
    page0 = c * n_tiles
    out_row0 = (c * gl.num_programs(0) + head_block) * ROWS
    ring_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TOKENS, D_NOPE], gl.bfloat16)
    rope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TOKENS, D_ROPE], gl.bfloat16)
    nope_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, TOKENS, D_NOPE], ring_layout)
    rope_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, TOKENS, D_ROPE], rope_layout)
    if ROPE_IN_REGS:  # noqa: SIM108 (a constexpr branch in a Gluon function)
        q_rope_smem = rope_ring.index(0)  # not read
    else:
        q_rope_smem = gl.allocate_shared_memory(gl.bfloat16, [ROWS, D_ROPE], rope_layout)
        blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, blocked))
        cols = gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, blocked))
        q_rope_smem.store(
            gl.load(
                Q
                + (head_block * ROWS + rows).to(gl.int64)[:, None] * (D_NOPE + D_ROPE)
                + D_NOPE
                + cols[None, :]
            )
        )
    xchg = gl.allocate_shared_memory(
        gl.float32, [STAGES + 1, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0])
    )
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    sums_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(p_bar.index(s), count=1)
    mbarrier.init(sums_bar, count=1)
    fence_async_shared()
    _warps_barrier()
    gl.warp_specialize(
        [
            (
                _score_partition,
                (
                    Q,
                    head_block,
                    q_rope_smem,
                    nope_ring,
                    rope_ring,
                    xchg,
                    ready,
                    p_bar,
                    sums_bar,
                    n_tiles,
                    scale,
                    LSE,
                    out_row0,
                    ROPE_IN_REGS,
                ),
            ),
            (
                _value_partition,
                (
                    TABLE,
                    page0,
                    nope_ring,
                    rope_ring,
                    xchg,
                    ready,
                    p_bar,
                    sums_bar,
                    n_tiles,
                    nope_desc,
                    rope_desc,
                    O,
                    out_row0,
                ),
            ),
        ],
        [8],
        [VALUE_REGS],
    )


def descriptors(pool):
    """TMA descriptors of the pool's rows [tokens, 576]: 64-token tiles of
    the latent and the rope columns."""
    out = []
    for first, width in ((0, 512), (512, 64)):
        layout = gl.NVMMASharedLayout.get_default_for([64, width], gl.bfloat16)
        out.append(
            TensorDescriptor.from_tensor(pool[:, first : first + width], [64, width], layout)
        )
    return out


def launch(q, pool, table, n_tiles, scale, head_blocks, ctas, rope_in_regs, value_regs):
    out = torch.empty(ctas * head_blocks * 64, 512, device=q.device, dtype=torch.bfloat16)
    lse = torch.empty(ctas * head_blocks * 64, device=q.device, dtype=torch.float32)
    nope_desc, rope_desc = descriptors(pool)
    _probe_kernel[(head_blocks, ctas)](
        q,
        table,
        out,
        lse,
        nope_desc,
        rope_desc,
        n_tiles,
        scale * math.log2(math.e),
        ROPE_IN_REGS=rope_in_regs,
        VALUE_REGS=value_regs,
        num_warps=4,
        maxnreg=MAX_REGS,
    )
    return out, lse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rope-in-smem", action="store_true")
    parser.add_argument("--value-regs", type=int, default=152)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--drafts", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=16384)
    args = parser.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    rows = args.heads * args.drafts
    head_blocks = rows // 64
    ctas = torch.cuda.get_device_properties(0).multi_processor_count // head_blocks
    pages = args.batch * args.context // 64
    n_tiles = pages // ctas
    pool = torch.randn(pages * 64, 576, device=dev, dtype=torch.bfloat16)
    table = torch.randperm(pages, device=dev, dtype=torch.int32)
    q = torch.randn(rows, 576, device=dev, dtype=torch.bfloat16)
    scale = 1 / math.sqrt(192)
    rope_in_regs = not args.rope_in_smem
    out, lse = launch(
        q, pool, table, n_tiles, scale, head_blocks, ctas, rope_in_regs, args.value_regs
    )
    torch.cuda.synchronize()
    worst = 0.0
    for c in (0, ctas // 2, ctas - 1):
        for hb in range(head_blocks):
            slots = (
                table[c * n_tiles : (c + 1) * n_tiles].long()[:, None] * 64
                + torch.arange(64, device=dev)
            ).reshape(-1)
            kv = pool[slots].float()
            s = q[hb * 64 : (hb + 1) * 64].float() @ kv.T * scale
            ref = torch.softmax(s, 1) @ kv[:, :512]
            ref_lse = torch.logsumexp(s, 1) / math.log(2)
            r0 = (c * head_blocks + hb) * 64
            err = ((out[r0 : r0 + 64].float() - ref).abs().max() / ref.abs().max()).item()
            err_lse = (lse[r0 : r0 + 64] - ref_lse).abs().max().item()
            worst = max(worst, err, err_lse)
    print(f"check: worst relative error {worst:.2e}", "ok" if worst < 2e-2 else "FAILED")

    def timed(fn, reps=20):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1000 / reps)
        return sorted(times)[len(times) // 2]

    t_probe = timed(
        lambda: launch(
            q, pool, table, n_tiles, scale, head_blocks, ctas, rope_in_regs, args.value_regs
        )
    )
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t_mm = timed(lambda: a @ a, reps=5)
    matmul = 2 * 8192**3 / t_mm * 1e6
    flops = head_blocks * ctas * n_tiles * 2 * 64 * 64 * (576 + 512)
    rate = flops / t_probe * 1e6
    print(
        f"probe: {t_probe:.1f} us for {ctas * n_tiles} pages x {head_blocks} head blocks, "
        f"{rate / 1e12:.0f} TFLOP/s, {rate / matmul:.1%} of matmul ({matmul / 1e12:.0f} TFLOP/s)"
    )
    print(f"probe: {t_probe * 1e3 / n_tiles:.0f} ns a tile a CTA")


if __name__ == "__main__":
    main()
