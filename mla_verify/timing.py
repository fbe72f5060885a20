"""Timing by CUDA-graph replay: the tuner's and the demo's one clock.

A graph holds one launch per batch in ``calls`` (rotating among batches that
use different KV slots, so a small problem cannot sit in L2 between
launches); replays are timed with device events and the median replay over
the number of launches is the time of one launch.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch


def graph_time_us(calls: Sequence[Callable[[], object]], replays: int = 7) -> float:
    """Median microseconds of one call, over ``replays`` graph replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # compile and size the workspace outside capture
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()  # warm-up
    samples = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return statistics.median(samples)
