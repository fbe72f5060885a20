"""Timing and ceilings: microseconds per launch from CUDA-graph replays
(or eager calls), the device's copy-bandwidth and matmul ceilings, and the
rates and fractions of them that a time reaches."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl
from bench_shapes import Work

from mla_verify.timing import eager_samples_us, graph_replays, percentile

logger = logging.getLogger("bench")


@dataclass(frozen=True)
class Ceilings:
    copy_bw: float | None  # bytes/s
    matmul_rate: float | None  # FLOP/s
    details: dict[str, float | None] = field(default_factory=dict)


def metrics(time_us: float, work: Work, ceilings: Ceilings) -> dict[str, Any]:
    """Rates, and the fractions of the ceilings one time reaches; the
    roofline floor is the larger of bytes / copy BW and FLOPs / matmul rate."""
    seconds = time_us * 1e-6
    out: dict[str, Any] = {
        "bytes_per_s": work.bytes / seconds,
        "flop_per_s": work.flops / seconds,
        "frac_copy_bw": None,
        "frac_matmul": None,
        "frac_roofline": None,
        "bound": None,
    }
    if ceilings.copy_bw:
        out["frac_copy_bw"] = out["bytes_per_s"] / ceilings.copy_bw
    if ceilings.matmul_rate:
        out["frac_matmul"] = out["flop_per_s"] / ceilings.matmul_rate
    if ceilings.copy_bw and ceilings.matmul_rate:
        t_mem = work.bytes / ceilings.copy_bw
        t_math = work.flops / ceilings.matmul_rate
        out["frac_roofline"] = max(t_mem, t_math) / seconds
        out["bound"] = "memory" if t_mem >= t_math else "compute"
    return out


def geomean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


# --- timing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    mode: str  # 'cudagraph' | 'eager'
    launches_per_replay: int
    replays: int
    per_launch_us: tuple[float, ...] = ()


def _summarise(per_launch_us: Sequence[float], mode: str, launches: int) -> Timing:
    return Timing(
        median_us=percentile(per_launch_us, 50),
        p20_us=percentile(per_launch_us, 20),
        p80_us=percentile(per_launch_us, 80),
        mode=mode,
        launches_per_replay=launches,
        replays=len(per_launch_us),
        per_launch_us=tuple(per_launch_us),
    )


def pool_timings(timings: Sequence[Timing]) -> Timing:
    """One contender's rounds as one timing: every replay of every round."""
    first = timings[0]
    samples = [t for timing in timings for t in timing.per_launch_us]
    return _summarise(samples, first.mode, first.launches_per_replay)


def time_graph(
    launches: Sequence[Callable[[], None]],
    *,
    rep_ms: float,
    replay_ms: float = 5.0,
    max_launches: int = 2000,
    written: Callable[[], torch.Tensor] | None = None,
) -> Timing:
    """One CUDA graph cycling through ``launches`` (one per rotation set)
    for about ``replay_ms``, replayed back to back for about ``rep_ms``;
    microseconds per launch over the replays. ``written`` returns the
    tensor every launch writes whole, checked to be written by a replay."""
    replays = graph_replays(
        launches,
        rep_ms=rep_ms,
        replay_ms=replay_ms,
        max_launches=max_launches,
        written=written,
        pipelined=True,
    )
    return _summarise(replays.us, "cudagraph", replays.launches)


def time_eager(run: Callable[[], None], *, rep_ms: float) -> Timing:
    """Per-call event timing, for what a graph cannot hold (host syncs)."""
    return _summarise(eager_samples_us(run, rep_ms=rep_ms), "eager", 1)


# --- ceilings -------------------------------------------------------------------------


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def triton_copy(src: torch.Tensor, dst: torch.Tensor, block: int = 4096) -> None:
    n = src.numel()
    _copy_kernel[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, num_warps=4)


def _copy_rates(device: torch.device, rep_ms: float, copy_bytes: int) -> dict[str, float | None]:
    """TB/s of torch.add(x, 0, out=y) and of a Triton copy, each inside a
    CUDA graph, counting read + write bytes."""
    n = copy_bytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    moved = 2 * n * 4
    rates: dict[str, float | None] = {}
    t = time_graph([lambda: torch.add(src, 0, out=dst)], rep_ms=rep_ms)
    rates["copy_torch_add_tbps"] = moved / (t.median_us * 1e-6) / 1e12
    dst.zero_()
    t = time_graph([lambda: triton_copy(src, dst)], rep_ms=rep_ms)
    rates["copy_triton_tbps"] = moved / (t.median_us * 1e-6) / 1e12
    if not torch.equal(src, dst):
        logger.warning("the Triton copy kernel did not copy; ignoring its bandwidth")
        rates["copy_triton_tbps"] = None
    return rates


def matmul_rate(device: torch.device, rep_ms: float, size: int = 8192) -> float:
    """TFLOP/s of a bf16 torch.mm on random size^3 operands inside a CUDA graph."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    c = torch.empty(size, size, device=device, dtype=torch.bfloat16)
    t = time_graph([lambda: torch.mm(a, b, out=c)], rep_ms=rep_ms, replay_ms=10.0)
    return 2 * size**3 / (t.median_us * 1e-6) / 1e12


def measure_ceilings(device: torch.device, rep_ms: float, copy_bytes: int) -> Ceilings:
    """The best SM copy inside a graph (torch.add and a Triton copy; read +
    write bytes) and the 8192^3 bf16 torch.mm rate."""
    details: dict[str, float | None] = {}
    try:
        details.update(_copy_rates(device, rep_ms, copy_bytes))
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        logger.error("copy-bandwidth measurement failed: %s", exc)
    try:
        details["matmul_tflops"] = matmul_rate(device, rep_ms)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        logger.error("matmul-rate measurement failed: %s", exc)
    torch.cuda.empty_cache()
    copies = [v for k, v in details.items() if k.startswith("copy_") and v]
    copy_bw = max(copies) * 1e12 if copies else None
    mm = details.get("matmul_tflops")
    return Ceilings(copy_bw, mm * 1e12 if mm else None, details)
