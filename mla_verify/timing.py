"""Timing by CUDA-graph replay: the one clock of the tuner, the demo and the benchmark.

A graph holds one launch per batch in ``calls`` (rotating among batches that
use different KV slots, so a small problem cannot sit in L2 between
launches), optionally repeated so a replay lasts long enough to time; replays
are timed with device events, and a replay's time over the number of
launches it holds is the time of one launch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Replays:
    us: tuple[float, ...]  # microseconds of one launch, in each timed replay
    launches: int  # launches one replay holds


def graph_time_us(calls: Sequence[Callable[[], object]], replays: int = 7) -> float:
    """Median microseconds of one call, over ``replays`` graph replays."""
    return statistics.median(graph_replays(calls, replays=replays).us)


def graph_replays(
    calls: Sequence[Callable[[], object]],
    *,
    replays: int = 7,
    rep_ms: float | None = None,
    replay_ms: float | None = None,
    max_launches: int = 2000,
    written: Callable[[], torch.Tensor] | None = None,
    pipelined: bool = False,
) -> Replays:
    """Microseconds of one call in each timed replay.

    ``replay_ms``: the graph cycles through ``calls`` as often as makes a
    replay last about that long (sized from an eager run; at most
    ``max_launches`` launches), instead of once. ``rep_ms``: as many replays
    as take about that long (5..200), instead of ``replays``. ``written``:
    returns the tensor every launch writes whole (read after capture, so it
    may be one the captured calls allocate); it is NaN-filled before a first
    replay that must leave it finite, or a launch that escaped capture would
    time as nothing. ``pipelined``: replays queued back to back with one
    sync at the end, instead of each waited for.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # compile and size the workspace outside capture
            call()
    torch.cuda.current_stream().wait_stream(stream)

    def cycle() -> None:
        for call in calls:
            call()

    cycles = 1
    if replay_ms is not None:
        # Eager, so launch overhead included: an upper bound, for sizing only.
        cycle_us = event_time_us(cycle, repeats=2)
        cycles = round(replay_ms * 1e3 / max(cycle_us, 0.1))
        cycles = max(1, min(max_launches // len(calls), cycles))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(cycles):
            cycle()
    if written is not None:
        written().fill_(float("nan"))
    graph.replay()  # warm-up
    if written is not None:
        torch.cuda.synchronize()
        if not bool(torch.isfinite(written()).all()):
            raise RuntimeError("a graph replay left the output unwritten: a launch escaped capture")
    if rep_ms is not None:
        one_ms = event_time_us(graph.replay) / 1e3
        replays = max(5, min(200, math.ceil(rep_ms / max(one_ms, 1e-3))))
    launches = cycles * len(calls)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        graph.replay()
        end.record()
        if not pipelined:
            end.synchronize()
    torch.cuda.synchronize()
    del graph
    us = tuple(s.elapsed_time(e) * 1e3 / launches for s, e in zip(starts, ends, strict=True))
    return Replays(us, launches)


def event_time_us(run: Callable[[], object], repeats: int = 1) -> float:
    """Microseconds per call of ``repeats`` eager calls, by device events
    (launch overhead included); synchronizes."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / repeats


def eager_samples_us(
    run: Callable[[], object], *, rep_ms: float, max_reps: int = 50
) -> list[float]:
    """Microseconds of each of about ``rep_ms`` of eager calls (3..max_reps),
    for what a graph cannot hold (calls that synchronize)."""
    run()  # warm-up
    torch.cuda.synchronize()
    reps = max(3, min(max_reps, math.ceil(rep_ms * 1e3 / max(event_time_us(run), 1.0))))
    return [event_time_us(run) for _ in range(reps)]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of ``values``, q in [0, 100]."""
    s = sorted(values)
    if not s:
        raise ValueError("percentile of no values")
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
