"""Probe (not for main): the rate at which SMs read KV tiles that stay in the
L2, by cp.async-pipelined loads and by TMA, beside the rate from DRAM.

    python3 scripts/l2_probe.py

Each of `grid` CTAs reads `tiles` tiles of 64 rows x 512 bf16 columns (the
latent part of a Hopper-kernel ring stage, 64 KB) from a pool, summing
them so that no load is dead, with Triton's pipeline of 2, 3 or 4 stages
(1, 2 or 3 tiles in flight) and 1 or 2 CTAs an SM; the pool is 16 MB
(stays in the L2) or 2 GB (streams from DRAM). Bytes read / CUDA-graph replay time. The
question it answers: how far the Hopper kernel's 4.8-5.0 TB/s of tile
reads at H64L4B32C16384 (RESULTS.md, "Whole pages by TMA on paged
calls") is from what the L2 can deliver to the SMs.
"""

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

ROWS, COLS = 64, 512


@triton.jit
def _pointer_reads(
    POOL, OUT, tiles, pool_tiles, ROWS: tl.constexpr, COLS: tl.constexpr, STAGES: tl.constexpr
):
    pid = tl.program_id(0)
    offs_r = tl.arange(0, ROWS)
    offs_c = tl.arange(0, COLS)
    acc = tl.zeros([COLS], tl.float32)
    for i in tl.range(0, tiles, num_stages=STAGES):
        tile = (pid * 7 + i * 13) % pool_tiles
        rows = (tile * ROWS + offs_r).to(tl.int64)
        x = tl.load(POOL + rows[:, None] * COLS + offs_c[None, :])
        acc += tl.sum(x.to(tl.float32), 0)
    tl.store(OUT + pid * COLS + offs_c, acc)


@triton.jit
def _tma_reads(
    desc, OUT, tiles, pool_tiles, ROWS: tl.constexpr, COLS: tl.constexpr, STAGES: tl.constexpr
):
    # A tile as COLS // BOX boxes of [ROWS, BOX] (a TMA box is at most 256
    # elements a side).
    BOX: tl.constexpr = desc.block_shape[1]
    pid = tl.program_id(0)
    offs_c = tl.arange(0, BOX)
    acc = tl.zeros([BOX], tl.float32)
    for i in tl.range(0, tiles, num_stages=STAGES):
        tile = (pid * 7 + i * 13) % pool_tiles
        for c in tl.static_range(COLS // BOX):
            x = desc.load([tile * ROWS, c * BOX])
            acc += tl.sum(x.to(tl.float32), 0)
    tl.store(OUT + pid * COLS + offs_c, acc)


def graph_us(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tile_bytes = ROWS * COLS * 2
    print(f"{'pool':>8} {'reads':>8} {'ctas':>6} {'warps':>5} {'us':>9} {'TB/s':>7}")
    for pool_mb in (16, 2048):
        pool_tiles = pool_mb * 2**20 // tile_bytes
        pool = torch.randn(pool_tiles * ROWS, COLS, device="cuda").to(torch.bfloat16)
        desc = TensorDescriptor.from_tensor(pool, [ROWS, 128])
        for ctas_per_sm, stages in ((1, 2), (1, 3), (1, 4), (2, 2)):
            for warps in (4, 8):
                grid = sms * ctas_per_sm
                tiles = 256
                out = torch.empty(grid, COLS, device="cuda")
                for name, kernel, src in (("ptr", _pointer_reads, pool), ("tma", _tma_reads, desc)):
                    args = (src, out, tiles, pool_tiles, ROWS, COLS, stages)
                    run = functools.partial(kernel[(grid,)], *args, num_warps=warps)
                    row = f"{pool_mb:>6}MB {name:>8} {grid:>6} {warps:>5} st{stages}"
                    try:
                        us = graph_us(run)
                    except Exception as exc:  # a variant that does not fit
                        print(f"{row} failed: {type(exc).__name__}")
                        continue
                    rate = grid * tiles * tile_bytes / us / 1e6
                    print(f"{row} {us:>9.1f} {rate:>7.2f}")
        del pool


if __name__ == "__main__":
    main()
