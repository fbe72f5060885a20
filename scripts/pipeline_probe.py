"""Probe: the Triton kernel's memory-bound tiles with two KV buffers.

Compiled for sm90 (triton 3.6), stage 1 keeps one KV buffer in shared
memory at num_stages 2-4: the slot indices are loaded one or two tiles
ahead, the tile itself one. At num_stages 5 the tile is copied two ahead
into two buffers (H8 L2 at 32 tokens, 4 warps: 56.6 -> 93.7 KB, 231 ->
210 registers). This times such tiles against the table's Triton winner
on memory-bound shapes, every split count the tuner would try, with the
tuner's own check and CUDA-graph timer. Run on a GPU from the repository
root: python scripts/pipeline_probe.py
"""

from __future__ import annotations

import torch

from mla_verify import block_config
from mla_verify.config import VerifyConfig
from mla_verify.search_space import split_candidates
from mla_verify.testing import make_pool
from mla_verify.tune import Problems, check_and_time, graph_timer

# (H, L, batch, context)
SHAPES = [
    (8, 2, 64, 65536),
    (8, 2, 32, 16384),
    (16, 2, 64, 65536),
    (16, 2, 32, 16384),
    (8, 4, 64, 65536),
    (32, 1, 64, 65536),
    (16, 2, 8, 65536),
    (8, 4, 8, 16384),
]
# (rows, BLOCK_N, warps, stages)
TILES = [
    (16, 32, 4, 5),
    (16, 64, 8, 5),
    (16, 16, 4, 5),
    (32, 32, 8, 5),
    (32, 64, 8, 5),
    (32, 32, 4, 5),
]


def main() -> None:
    pool = make_pool(72 * 65536, torch.bfloat16, "cuda")
    for heads, drafts, batch, context in SHAPES:
        problems = Problems(pool, heads, drafts, batch, [context], "cuda")
        table = block_config(heads, drafts, batch, torch.bfloat16, "sm90", kernel="triton")
        base = check_and_time(table, problems, graph_timer).per_context[0]
        line = f"H{heads}L{drafts}B{batch}C{context}: table {base:.1f} us |"
        for rows, block_n, warps, stages in TILES:
            block_h = min(heads, rows // drafts)
            if block_h * drafts != rows:
                continue
            times = [
                timing.per_context[0]
                for splits in split_candidates(heads, batch, block_h, "sm90")
                if (
                    timing := check_and_time(
                        VerifyConfig(block_h, block_n, splits, warps, stages), problems, graph_timer
                    )
                )
                is not None
            ]
            line += f" r{rows}n{block_n}w{warps}s{stages} {base / min(times):.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
