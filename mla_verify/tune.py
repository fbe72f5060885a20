"""``python -m mla_verify.tune``: search launch configs on this GPU and write
the JSON table the runtime loads at import.

Per (heads H, draft length L, KV dtype, head dims) entry the search runs in
steps (head dims other than MLA's are timed with V a cache of its own, as
engines pass it):
  1. tile search at one representative batch size: every stage-1 tile from
     ``search_space.tile_candidates`` (BLOCK_H, BLOCK_N, num_warps,
     num_stages), each with the default split rule; the fastest ``--top-k``
     go on. On AMD, tiles that overflow LDS or spill registers when compiled
     ahead of time (``aot``) are never timed, and each finalist is also
     timed with ``search_space.amd_option_candidates`` (waves_per_eu,
     matrix_instr_nonkdim, kpack);
  2. per batch bucket: those tiles x ``search_space.split_candidates`` (one
     value for the Hopper kernel, which plans its own shares), and the
     built-in default, timed side by side in the same run; then the fastest
     with each of ``search_space.min_share_candidates`` (the Hopper
     kernel's share floor);
  3. the fastest and the default timed again, side by side (``confirm``).
A bucket keeps a tuned config only where step 3 finds it faster than the
default by ``--margin`` on the geometric mean over the contexts, or faster
on it by less while faster by the margin at one context and slower by it at
none (``beats_default``); the table records both times either way.

A rerun tunes only the buckets whose records are stale (measured with other
code of their kernel's family). With ``--remeasure`` a stale record's config
is not searched again but timed again against the default (step 3 alone):
after a change that should not move the winners (one to a path the search
does not time, say) that costs a few timings a bucket instead of the search.

Where the arch's own kernel is not the Triton kernel (the Hopper kernel on
sm90), the same steps run again over the Triton kernel's tiles against its
built-in default, and the bucket keeps that winner beside the other
(``"triton"``): the portable path is measured where there is hardware.
Where that winner beats the own winner, timed side by side, it is the
bucket's own config too (``_best_of_both``).

Without a GPU, ``--write-reported ARCH`` writes a table for an AMD arch
from a stated model instead (``perf_model``, ``tuning/amd.md``): per
bucket the config it estimates fastest among the tiles that compile
without overflowing LDS or spilling registers. Its metadata says it is not
measured.

Every candidate's output is checked against the float32 reference before it
is timed. Timing: CUDA-graph replays, median, per ``--contexts`` prefix
length, KV slots scattered over a pool larger than L2; candidates are ranked
by the geometric mean over the contexts.
All tile shapes are compiled up front in parallel worker processes (they
fill Triton's on-disk cache). Each bucket is written as soon as it is
measured, under a file lock, so an interrupted run loses at most the bucket
in flight; a rerun resumes where it stopped.

Each record (a bucket's config and times, and its Triton winner's) carries
the hash of its kernel family's code (``code_hash.KERNEL_HASHES``). A rerun
after a kernel change searches again only the records of the family whose
code changed (``pending_work``), and keeps the others as they are: a change
to the Triton kernel alone re-tunes its records and leaves the Hopper
kernel's, and the other way round.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import __version__, perf_model, tables
from .cli import Parser
from .code_hash import KERNEL_HASH, KERNEL_HASHES, kernel_hash
from .config import (
    VerifyConfig,
    default_config,
    default_num_kv_splits,
    kernel_family,
    rows_per_program,
    triton_default_config,
)
from .device import check_arch, current_arch, is_amd_arch
from .problem import (
    MAX_BATCH_SIZE,
    MAX_DRAFT_LEN,
    MAX_HEADS,
    MIN_BATCH_SIZE,
    MIN_DRAFT_LEN,
    MIN_HEADS,
    MLA_HEAD_DIMS,
    check_range,
    kv_dtype_from_name,
    parse_head_dims,
)
from .search_space import (
    amd_option_candidates,
    min_share_candidates,
    split_candidates,
    tile_candidates,
)

logger = logging.getLogger("mla_verify.tune")

DEFAULT_HEADS = (8, 12, 16, 32, 64, 128)
# Local heads of shared-KV models with other head dims (Qwen3.5's 32 heads at
# tensor parallelism 8, 4, 2): the grid --heads defaults to for them.
SHARED_KV_HEADS = (4, 8, 16)
DEFAULT_DRAFT_LENS = (1, 2, 3, 4, 5, 6, 7, 8)
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_CONTEXTS = (2048, 16384)
# Prefix tokens one timed problem may hold: long contexts at large batches
# are cut to this, which keeps a bucket's timing under a second or so.
MAX_PROBLEM_TOKENS = 1 << 20
# Batches rotated through one graph until their KV spans this many bytes.
L2_DEFEAT_BYTES = 256 << 20
FULL_GRID = {
    "heads": DEFAULT_HEADS,
    "draft_lens": DEFAULT_DRAFT_LENS,
    "batch_sizes": DEFAULT_BATCH_SIZES,
    "contexts": DEFAULT_CONTEXTS,
}
QUICK_GRID = {"heads": (16, 128), "draft_lens": (1, 4), "batch_sizes": (1, 32), "contexts": (4096,)}
# Archs whose table can be derived from a model, not measured (perf_model).
REPORTED_DEVICES = {arch: gpu.device for arch, gpu in perf_model.MODELS.items()}
# fp8_e4m3fnuz: MI300's (gfx942) fp8 flavour; gfx950 and NVIDIA take fp8_e4m3.
TUNABLE_KV_DTYPES = ("bf16", "fp8_e4m3", "fp8_e4m3fnuz")

TIMING_METHOD = (
    "CUDA-graph replays, median of 7, per launch, at each of the bucket's contexts "
    "(uniform prefixes, slots scattered over a pool > L2); candidates ranked by the "
    "geometric mean over the contexts; the default timed after a warm-up; the winner "
    "and the default timed again side by side (tuned, default, default, tuned), the "
    "winner kept where it is faster by the margin on the geometric mean, or faster on it "
    "by less while faster by the margin at one context and slower by it at none"
)
# Appended to the timing method by a run with --remeasure (the table's
# metadata is its last run's).
REMEASURE_METHOD = (
    "; this run (--remeasure) timed each stale record's config again beside the default "
    "instead of searching, keeping it where it still won"
)
# A timer maps (config, batches) to microseconds per launch; tests inject one.
Timer = Callable[[VerifyConfig, Sequence["object"]], float]


@dataclass(frozen=True)
class Timing:
    """A config's microseconds at each context of a bucket."""

    per_context: tuple[float, ...]

    @property
    def mean(self) -> float:
        """Geometric mean over the contexts: how candidates are ranked."""
        return statistics.geometric_mean(self.per_context)


@dataclass
class BucketResult:
    num_heads: int
    draft_len: int
    kv_dtype: str
    batch_size: int
    config: VerifyConfig
    tuned: Timing
    default: Timing
    contexts: list[int] = field(default_factory=list)
    head_dims: tuple[int, int] = MLA_HEAD_DIMS
    # The Triton kernel's winner against its own default, where ``config``
    # is another kernel's (the Hopper kernel on sm90).
    triton: BucketResult | None = None

    @property
    def key(self) -> str:
        return tables.entry_key(self.num_heads, self.draft_len, self.kv_dtype, self.head_dims)

    @property
    def tuned_us(self) -> float:
        return self.tuned.mean

    @property
    def default_us(self) -> float:
        return self.default.mean

    @property
    def speedup(self) -> float:
        return self.default_us / self.tuned_us


# --------------------------------------------------------------------- problems


class Problems:
    """The batches one bucket is timed on, built once, with their
    references; KV slots are drawn from one shared pool per dtype (MLA: K
    its columns, V their view; other head dims: K and V columns of their
    own, as separate caches)."""

    def __init__(
        self,
        pool,
        num_heads,
        draft_len,
        batch_size,
        contexts,
        device,
        seed=0,
        head_dims=MLA_HEAD_DIMS,
    ):
        from .testing import make_batch

        mla = tuple(head_dims) == MLA_HEAD_DIMS
        kv_cols = head_dims[0] if mla else sum(head_dims)
        self.batch_size = batch_size
        self.sets = []  # per context: batches rotated through one graph
        for ctx in contexts:
            elem = pool.element_size()
            per_batch = max(1, batch_size * ctx * kv_cols * elem)
            copies = 1 if device == "cpu" else min(32, math.ceil(L2_DEFEAT_BYTES / per_batch))
            batches = [
                make_batch(
                    num_heads,
                    draft_len,
                    [ctx] * batch_size,
                    kv_dtype=pool.dtype,
                    pool=pool,
                    device=device,
                    seed=seed + 7919 * i + ctx,
                    head_dims=head_dims,
                    separate_v=not mla,
                )
                for i in range(copies)
            ]
            self.sets.append(batches)
        self.references = [batches[0].reference() for batches in self.sets]
        self.contexts = list(contexts)


def contexts_for(batch_size: int, contexts: Sequence[int]) -> list[int]:
    """The timing contexts of a bucket, each cut to MAX_PROBLEM_TOKENS total."""
    cap = max(64, MAX_PROBLEM_TOKENS // batch_size)
    return sorted({min(c, cap) for c in contexts})


# ------------------------------------------------------------------- measuring


def check_and_time(config: VerifyConfig, problems: Problems, timer: Timer) -> Timing | None:
    """The config's time at each of the problem's contexts, or None when it
    fails to compile, runs out of resources or computes wrongly."""
    from .testing import check_close

    times = []
    try:
        for batches, ref in zip(problems.sets, problems.references):
            out = batches[0].new_output()
            batches[0].run(out, config)
            check_close(out, ref, what=str(config))
            times.append(timer(config, batches))
    except AssertionError as exc:
        logger.warning("wrong output, candidate dropped: %s", exc)
        return None
    except Exception as exc:  # compile errors, out of resources
        logger.info("candidate %s skipped: %s: %s", config.to_dict(), type(exc).__name__, exc)
        return None
    return Timing(tuple(times))


def confirm(
    tuned: VerifyConfig, default: VerifyConfig, problems: Problems, timer: Timer
) -> tuple[Timing, Timing]:
    """The search's winner and the default timed again, in the order
    tuned, default, default, tuned at each context; each one's time is the
    geometric mean of its two. The search's own time of the winner is the
    fastest of several noisy timings and reads low; these do not."""
    tuned_times, default_times = [], []
    for batches in problems.sets:
        t1, d1, d2, t2 = [timer(config, batches) for config in (tuned, default, default, tuned)]
        tuned_times.append(math.sqrt(t1 * t2))
        default_times.append(math.sqrt(d1 * d2))
    return Timing(tuple(tuned_times)), Timing(tuple(default_times))


def beats_default(tuned: Timing, default: Timing, margin: float) -> bool:
    """Whether a bucket keeps its tuned config: faster than the default by
    ``margin`` on the geometric mean over the contexts, or faster on it by
    less while faster by the margin at one context and slower by it at
    none. The second keeps a config that wins where it matters and ties
    elsewhere (a share floor of 2 at batch 8: 6% at 2K, a tie at 16K),
    which the mean alone would leave to noise."""
    ratios = [t / d for t, d in zip(tuned.per_context, default.per_context)]
    mean = tuned.mean / default.mean
    ties_elsewhere = min(ratios) <= 1 - margin and max(ratios) < 1 + margin
    return mean <= 1 - margin or (mean < 1 and ties_elsewhere)


def graph_timer(config: VerifyConfig, batches: Sequence[object]) -> float:
    from .timing import graph_time_us

    outs = [b.new_output() for b in batches]
    return graph_time_us([lambda b=b, o=o: b.run(o, config) for b, o in zip(batches, outs)])


# ---------------------------------------------------------------- compilation


def _compile_worker(jobs: list[tuple[int, int, str, dict, tuple[int, int]]]) -> int:
    """Run each (H, L, kv dtype, config, head dims) once on a tiny batch:
    Triton writes the compiled kernels to its cache for the tuning process
    to load."""
    from .testing import make_batch

    done = 0
    for heads, draft_len, dtype_name, cfg, head_dims in jobs:
        config = VerifyConfig.from_dict(cfg)
        batch = make_batch(
            heads,
            draft_len,
            [2 * config.BLOCK_N + 1],
            kv_dtype=kv_dtype_from_name(dtype_name),
            device="cuda",
            head_dims=head_dims,
            separate_v=tuple(head_dims) != MLA_HEAD_DIMS,
        )
        try:
            batch.run(batch.new_output(), config)
            torch.cuda.synchronize()
            done += 1
        except Exception as exc:  # reported again, with context, when timed
            logging.getLogger("mla_verify.tune").debug("compile failed %s: %s", cfg, exc)
    return done


def searched_tiles(
    heads: int,
    draft_len: int,
    dtype_name: str,
    arch: str,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
    kernel: str | None = None,
) -> list[VerifyConfig]:
    """The tiles step 1 times (``search_space.tile_candidates``); on an AMD
    arch the compiler targets (``aot.TARGETS``), only those that fit its
    LDS and spill no register."""
    tiles = tile_candidates(heads, draft_len, arch, dtype_name, head_dims, kernel=kernel)
    return [tile for tile in tiles if _fits(tile, draft_len, dtype_name, arch, head_dims)]


def _fits(
    config: VerifyConfig, draft_len: int, dtype_name: str, arch: str, head_dims: tuple[int, int]
) -> bool:
    """Whether a candidate may be timed: on an AMD arch ``aot`` compiles
    for, only if it fits LDS and spills no register."""
    if not is_amd_arch(arch):
        return True
    from . import aot

    return arch not in aot.TARGETS or aot.fits(config, draft_len, dtype_name, arch, head_dims)


def _searches(
    heads: int,
    draft_len: int,
    dtype_name: str,
    arch: str,
    head_dims: tuple[int, int],
    portable: bool = True,
) -> list[str | None]:
    """The kernels an entry's search covers: the arch's own (None), and the
    Triton kernel beside it where the arch's own is another (unless
    ``portable`` is off: ``--own-kernel-only``)."""
    tiles = tile_candidates(heads, draft_len, arch, dtype_name, head_dims)
    own_only = not portable or all(t.kernel == "triton" for t in tiles)
    return [None] if own_only else [None, "triton"]


def compile_workers(jobs: int | None) -> int:
    """Parallel compile processes: ``--jobs``, else the CPU cores, at most 16."""
    return jobs or min(16, os.cpu_count() or 1)


def precompile(entries, arch: str, workers: int) -> None:
    """Compile, for every (H, L, kv dtype, head dims, kernels, searched,
    configs) entry, the default of each of its kernels (as ``_searches``
    names them), every tile shape of the ``searched`` ones and the other
    ``configs`` (records timed again), in parallel processes (on AMD, first
    check the searched tiles ahead of time in parallel too)."""
    if is_amd_arch(arch):
        from . import aot

        if arch in aot.TARGETS:
            checks = [
                (tile, draft_len, dtype_name, arch, head_dims)
                for heads, draft_len, dtype_name, head_dims, _, searched, _ in entries
                if searched
                for tile in tile_candidates(heads, draft_len, arch, dtype_name, head_dims)
            ]
            aot.resources_many(checks, workers, "compiling ahead of time")  # for searched_tiles
    jobs = []
    seen = set()
    for heads, draft_len, dtype_name, head_dims, kernels, searched, configs in entries:
        tiles = list(configs)
        for kernel in kernels:
            if kernel in searched:
                tiles += searched_tiles(heads, draft_len, dtype_name, arch, head_dims, kernel)
            rule = triton_default_config if kernel == "triton" else default_config
            tiles.append(rule(heads, draft_len, 1, arch, dtype_name, head_dims))
        for tile in tiles:
            # Triton specialises ints on divisibility by 16: H=8 and H=12
            # compile alike, as do 16, 32, 64, 128.
            spec = (
                heads % 16 == 0,
                draft_len,
                dtype_name,
                dataclasses.replace(tile, NUM_KV_SPLITS=2),
                head_dims,
            )
            if spec not in seen:
                seen.add(spec)
                jobs.append((heads, draft_len, dtype_name, spec[3].to_dict(), head_dims))
    if workers <= 1 or len(jobs) < 2:
        _compile_worker(jobs)
        return
    chunks = [jobs[i::workers] for i in range(workers)]
    start = time.perf_counter()
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        compiled = sum(pool.map(_compile_worker, chunks))
    logger.info(
        "compiled %d/%d kernel variants in %.0f s on %d workers",
        compiled,
        len(jobs),
        time.perf_counter() - start,
        workers,
    )


# ---------------------------------------------------------------------- search


def tune_entry(
    heads: int,
    draft_len: int,
    dtype_name: str,
    searches: Mapping[int, Sequence[str | None]],
    contexts: Sequence[int],
    *,
    arch: str,
    pool: torch.Tensor,
    device: str,
    timer: Timer,
    top_k: int,
    margin: float,
    on_bucket: Callable[[dict[str | None, BucketResult], dict[str | None, tables.Record]], None],
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
    kept: Mapping[int, Mapping[str | None, tables.Record]] | None = None,
    remeasured: Mapping[int, Mapping[str | None, tables.Record]] | None = None,
) -> None:
    """Tune one entry's buckets: per batch size the searches ``searches``
    names (None: the arch's own kernel, "triton": the Triton kernel beside
    it), or where ``remeasured`` holds the bucket's record of a search, that
    record's config timed again. Each bucket goes to ``on_bucket`` as it is
    measured: its results and the records of it that ``kept`` holds, by
    search."""
    remeasured = remeasured or {}
    key = tables.entry_key(heads, draft_len, dtype_name, head_dims)
    shape = (heads, draft_len, dtype_name, arch, head_dims)
    searched = _searched_kernels(searches, remeasured)
    finalists = {}
    if searched:
        rep_bs = min(searches, key=lambda b: abs(math.log2(b) - 4))  # nearest to 16
        rep = Problems(
            pool,
            heads,
            draft_len,
            rep_bs,
            contexts_for(rep_bs, contexts),
            device,
            head_dims=head_dims,
        )
    for kernel in searched:
        tiles = searched_tiles(heads, draft_len, dtype_name, arch, head_dims, kernel)
        finalists[kernel] = _finalists(tiles, shape, rep, timer, top_k)
        logger.debug("%s %s finalists: %s", key, kernel, [t.to_dict() for t in finalists[kernel]])

    for bs, kernels in searches.items():
        problems = Problems(
            pool, heads, draft_len, bs, contexts_for(bs, contexts), device, head_dims=head_dims
        )
        found = {}
        for kernel in kernels:
            rule = triton_default_config if kernel == "triton" else default_config
            default = rule(heads, draft_len, bs, arch, dtype_name, head_dims)
            where = f"{key} batch {bs}"
            if kernel in remeasured.get(bs, {}):
                config = remeasured[bs][kernel].config
                best, best_t, default_t = _remeasure_bucket(
                    config, default, problems, timer, margin, where
                )
            else:
                best, best_t, default_t = _tune_bucket(
                    finalists[kernel], default, problems, heads, bs, arch, timer, margin, where
                )
            found[kernel] = BucketResult(
                heads,
                draft_len,
                dtype_name,
                bs,
                best,
                best_t,
                default_t,
                problems.contexts,
                head_dims,
            )
        if None in found and "triton" in found:
            found[None] = _best_of_both(found[None], found["triton"], problems, timer, margin)
        if None in found:
            found[None].triton = found.get("triton")
        on_bucket(found, dict((kept or {}).get(bs, {})))


def _best_of_both(
    own: BucketResult, portable: BucketResult, problems: Problems, timer: Timer, margin: float
) -> BucketResult:
    """The bucket's own record, or the Triton search's winner where that
    beats it. The own search carries only the tiles fastest at one
    representative batch to the other batches, so a Triton tile ranked
    below the Hopper schedules there can still win a bucket, as the Triton
    search beside finds (H4 L4 256/256 bf16 at batch 64 on the H200: 6%).
    The two are timed side by side (``confirm``), and the Triton config
    takes the own record where it beats the own winner as a tuned config
    must beat the default (``beats_default``); the default's times stay
    the own default's."""
    if portable.config == own.config:
        return own
    portable_t, own_t = confirm(portable.config, own.config, problems, timer)
    if not beats_default(portable_t, own_t, margin):
        return own
    logger.info(
        "%s batch %d: the Triton winner %s beats the own winner %s (%.1f against %.1f us)",
        own.key,
        own.batch_size,
        portable.config.to_dict(),
        own.config.to_dict(),
        portable_t.mean,
        own_t.mean,
    )
    return dataclasses.replace(own, config=portable.config, tuned=portable_t)


def _kernels(searches: Mapping[int, Sequence[str | None]]) -> list[str | None]:
    """The kernels some bucket searches, in search order."""
    return [k for k in (None, "triton") if any(k in s for s in searches.values())]


def _searched_kernels(
    searches: Mapping[int, Sequence[str | None]], remeasured: Mapping[int, Mapping]
) -> list[str | None]:
    """The kernels some bucket searches, less the searches whose records
    are timed again instead (``--remeasure``)."""
    return _kernels(
        {
            bs: [k for k in kernels if k not in remeasured.get(bs, {})]
            for bs, kernels in searches.items()
        }
    )


def _finalists(
    tiles: Sequence[VerifyConfig],
    shape: tuple[int, int, str, str, tuple[int, int]],
    rep: Problems,
    timer: Timer,
    top_k: int,
) -> list[VerifyConfig]:
    """Step 1: the ``top_k`` fastest tiles at the representative batch, each
    with the default split rule; on AMD each with its fastest compiler
    options that fit. ``shape``: (H, L, kv dtype, arch, head dims)."""
    heads, draft_len, dtype_name, arch, head_dims = shape

    def with_default_splits(tile: VerifyConfig) -> VerifyConfig:
        rows = rows_per_program(tile.BLOCK_H, draft_len)
        return tile.with_splits(
            default_num_kv_splits(heads, rep.batch_size, tile.BLOCK_H, rows, arch)
        )

    ranked = []
    for tile in tiles:
        t = check_and_time(with_default_splits(tile), rep, timer)
        if t is not None:
            ranked.append((t.mean, tile))
    ranked.sort(key=lambda x: x[0])
    finalists = []
    for mean, tile in ranked[:top_k]:
        best, best_mean = tile, mean
        for options in amd_option_candidates(arch)[1:]:
            cand = dataclasses.replace(tile, **options)
            if not _fits(cand, draft_len, dtype_name, arch, head_dims):
                continue
            t = check_and_time(with_default_splits(cand), rep, timer)
            if t is not None and t.mean < best_mean:
                best, best_mean = cand, t.mean
        finalists.append(best)
    return finalists


def _tune_bucket(
    finalists: Sequence[VerifyConfig],
    default: VerifyConfig,
    problems: Problems,
    heads: int,
    bs: int,
    arch: str,
    timer: Timer,
    margin: float,
    where: str,
) -> tuple[VerifyConfig, Timing, Timing]:
    """Steps 2 and 3 for one bucket: the finalists x split counts (then
    share floors) against ``default``; the winner, its timing and the
    default's."""
    # The first timing on new problems read up to 12% slow on the H200
    # (tuning/README.md); the default's first one only checks it.
    if check_and_time(default, problems, timer) is None:
        raise RuntimeError(f"{where}: the built-in default {default} failed")
    default_t = check_and_time(default, problems, timer)
    best, best_t = default, default_t
    for tile in finalists:
        for splits in split_candidates(heads, bs, tile.BLOCK_H, arch, tile.kernel):
            cand = tile.with_splits(splits)
            if cand == default:
                continue
            t = check_and_time(cand, problems, timer)
            if t is not None and t.mean < best_t.mean:
                best, best_t = cand, t
    # Then the share floor of the fastest (the Hopper kernel's only).
    for floor in min_share_candidates(arch, best.kernel)[1:]:
        cand = best.with_min_share(floor)
        t = check_and_time(cand, problems, timer)
        if t is not None and t.mean < best_t.mean:
            best, best_t = cand, t
    return _keep_if_faster(best, best_t, default, default_t, problems, timer, margin)


def _keep_if_faster(
    best: VerifyConfig,
    best_t: Timing,
    default: VerifyConfig,
    default_t: Timing,
    problems: Problems,
    timer: Timer,
    margin: float,
) -> tuple[VerifyConfig, Timing, Timing]:
    """Step 3: ``best``, where it is not the default, and the default timed
    again side by side (``confirm``); the default where ``best`` does not
    beat it (``beats_default``)."""
    if best != default:
        best_t, default_t = confirm(best, default, problems, timer)
        if not beats_default(best_t, default_t, margin):
            best, best_t = default, default_t
    return best, best_t, default_t


def _remeasure_bucket(
    config: VerifyConfig,
    default: VerifyConfig,
    problems: Problems,
    timer: Timer,
    margin: float,
    where: str,
) -> tuple[VerifyConfig, Timing, Timing]:
    """A stale record's config, checked and timed again against the
    default (``--remeasure``): kept where it still beats it, else the
    default; the default too where it no longer runs or computes right."""
    # As in _tune_bucket: a first timing on new problems only checks.
    if check_and_time(default, problems, timer) is None:
        raise RuntimeError(f"{where}: the built-in default {default} failed")
    default_t = check_and_time(default, problems, timer)
    config_t = default_t if config == default else check_and_time(config, problems, timer)
    if config_t is None:
        logger.warning("%s: the recorded %s fails now; the default replaces it", where, config)
        config, config_t = default, default_t
    return _keep_if_faster(config, config_t, default, default_t, problems, timer, margin)


# ------------------------------------------------------------------------ CLI


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The values argparse's types cannot check, against the supported
    ranges; a one-line error naming the option."""
    ranges = {
        "heads": (MIN_HEADS, MAX_HEADS),
        "draft_lens": (MIN_DRAFT_LEN, MAX_DRAFT_LEN),
        "batch_sizes": (MIN_BATCH_SIZE, MAX_BATCH_SIZE),
        "contexts": (1, MAX_PROBLEM_TOKENS),
    }
    try:
        for name, (low, high) in ranges.items():
            for value in getattr(args, name) or ():
                check_range(f"--{name.replace('_', '-')}", value, low, high)
    except ValueError as exc:
        p.error(str(exc))
    for option, value in (("--top-k", args.top_k), ("--jobs", args.jobs)):
        if value is not None and value < 1:
            p.error(f"{option}: expected a positive int, got {value}")
    if args.own_kernel_only and args.triton_only:
        p.error("--triton-only: not with --own-kernel-only")
    if args.redo and args.remeasure:
        p.error("--remeasure: not with --redo (which searches every bucket again)")
    if not 0 <= args.margin < 1:
        p.error(f"--margin: expected a fraction in [0, 1), got {args.margin}")
    if args.time_limit is not None and not args.time_limit > 0:
        p.error(f"--time-limit: expected a positive number of seconds, got {args.time_limit}")
    for d in args.kv_dtypes:
        if d not in TUNABLE_KV_DTYPES:
            p.error(f"--kv-dtype: expected one of {', '.join(TUNABLE_KV_DTYPES)}, got {d!r}")
    if args.arch is not None:
        from .tune_report import known_archs

        if not args.show:
            p.error("--arch: only with --show (the tuner tunes the GPU it runs on)")
        try:
            check_arch(args.arch, "--arch", known=known_archs())
        except ValueError as exc:
            p.error(str(exc))
    elif args.show and args.shapes_given and not torch.cuda.is_available():
        from .tune_report import known_archs

        p.error(
            "--show: no GPU here to take the arch from; pass --arch "
            f"(one of {', '.join(sorted(known_archs()))})"
        )


def _head_dims(text: str) -> list[tuple[int, int]]:
    """``576x512,256`` -> [(576, 512), (256, 256)]: q/k x v, or one dim for both."""
    dims = []
    for item in filter(None, text.split(",")):
        try:
            dims.append(parse_head_dims(item))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if not dims:
        raise argparse.ArgumentTypeError(f"expected head dims, got {text!r}")
    return dims


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = Parser(
        prog="python -m mla_verify.tune",
        description="Tune mla_verify launch configs on this GPU and write its JSON table.",
    )
    p.add_argument(
        "--heads",
        type=_ints,
        help=f"per-rank head counts (default {DEFAULT_HEADS}; {SHARED_KV_HEADS} when every "
        "--head-dims is another than MLA's)",
    )
    p.add_argument("--draft-lens", type=_ints, help=f"draft lengths (default {DEFAULT_DRAFT_LENS})")
    p.add_argument(
        "--head-dims",
        type=_head_dims,
        default=[MLA_HEAD_DIMS],
        help="comma-separated q/k x v head dims, e.g. 576x512,256 (default 576x512, MLA)",
    )
    p.add_argument(
        "--batch-sizes", type=_ints, help=f"batch buckets (default {DEFAULT_BATCH_SIZES})"
    )
    p.add_argument(
        "--contexts",
        type=_ints,
        help=f"prefix lengths each bucket is timed on (default {DEFAULT_CONTEXTS})",
    )
    p.add_argument(
        "--kv-dtype",
        default="bf16",
        help=f"comma-separated KV dtypes from {TUNABLE_KV_DTYPES} (default bf16)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: the user table directory)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small grid (H 16,128; L 1,4; batch 1,32; one context) to try things",
    )
    p.add_argument("--top-k", type=int, default=2, help="tiles carried to the split search")
    p.add_argument(
        "--margin",
        type=float,
        default=0.03,
        help="keep a tuned config only if faster than the default by this fraction",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="stop cleanly after this many seconds, compiling included (rerun to resume)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="parallel compile workers (default: CPU cores, at most 16)",
    )
    p.add_argument("--redo", action="store_true", help="re-tune buckets already in the table")
    p.add_argument(
        "--remeasure",
        action="store_true",
        help="for a stale record, time its config again against the default instead of "
        "searching (after a change that should not move the winners)",
    )
    p.add_argument(
        "--own-kernel-only",
        action="store_true",
        help="search only the arch's own kernel (the Hopper one on sm90), not the portable "
        "Triton kernel beside it: its compiles take most of a full grid's time",
    )
    p.add_argument(
        "--triton-only",
        action="store_true",
        help="in the buckets the table holds, search only the portable Triton kernel beside "
        "the arch's own (sm90), adding or refreshing its winner and keeping the own "
        "kernel's record as it is; a bucket the table lacks, or whose own record is a "
        "Triton config, is searched in full",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the loaded tables against this machine and software",
    )
    p.add_argument(
        "--show",
        action="store_true",
        help="show the loaded tables and the config each given shape gets",
    )
    p.add_argument(
        "--arch", default=None, help="with --show: the arch to look up (default: this GPU's)"
    )
    p.add_argument(
        "--write-reported",
        metavar="ARCH",
        choices=sorted(REPORTED_DEVICES),
        help="write (unmeasured) a table for ARCH over the grid, derived from a stated "
        "model (perf_model) among the tiles that compile without spilling, for hardware "
        "we cannot tune on",
    )
    p.add_argument(
        "--note",
        default=None,
        help="a line of provenance stored in the table's metadata (what changed, why)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    args.kv_dtypes = [d.strip() for d in args.kv_dtype.split(",")]
    args.shapes_given = any(getattr(args, n) is not None for n in FULL_GRID if n != "contexts")
    _check_args(p, args)
    grid = QUICK_GRID if args.quick else FULL_GRID
    if args.heads is None and not args.quick and MLA_HEAD_DIMS not in args.head_dims:
        args.heads = list(SHARED_KV_HEADS)  # only other head dims: their models' heads
    for name, default in grid.items():
        if getattr(args, name) is None:
            setattr(args, name, list(default))
    return args


def table_metadata(arch: str, device_name: str, sm_count: int, args) -> dict:
    import triton

    return {
        "device": device_name,
        "arch": arch,
        "multiprocessor_count": sm_count,
        "triton": triton.__version__,
        "torch": torch.__version__,
        "mla_verify": __version__,
        "kernel_hash": KERNEL_HASH,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "timing": TIMING_METHOD + (REMEASURE_METHOD if getattr(args, "remeasure", False) else ""),
        "measured": True,
        "grid": {
            "contexts": list(args.contexts),
            "max_problem_tokens": MAX_PROBLEM_TOKENS,
            "top_k": args.top_k,
            "margin": args.margin,
        },
    } | ({"note": args.note} if getattr(args, "note", None) else {})


def write_reported_table(args: argparse.Namespace, arch: str, out_dir: Path) -> Path:
    """A table for an AMD GPU we cannot measure, derived from a model
    (``perf_model``) without a GPU: per bucket the config the model
    estimates fastest among the Triton kernel's tiles that compile for
    ``arch`` without overflowing LDS or spilling registers (each compiled
    here ahead of time, on ``--jobs`` processes). No times; the metadata
    says so and states the model. Tuning on the hardware replaces it (user
    tables take precedence; or tune with --out configs)."""
    import triton

    from . import aot

    gpu = perf_model.MODELS[arch]
    tiles = {
        (heads, draft_len, dtype_name, head_dims): tile_candidates(
            heads, draft_len, arch, dtype_name, head_dims, kernel="triton"
        )
        for dtype_name, head_dims in itertools.product(args.kv_dtypes, args.head_dims)
        for heads in args.heads
        for draft_len in args.draft_lens
    }
    jobs = [(tile, l, d, arch, dims) for (_, l, d, dims), found in tiles.items() for tile in found]
    start = time.perf_counter()
    workers = compile_workers(args.jobs)
    compiled = dict(zip(jobs, aot.resources_many(jobs, workers, f"compiling for {arch}")))
    entries = {}
    for (heads, draft_len, dtype_name, head_dims), candidates in tiles.items():
        fitting = []
        for tile in candidates:
            found = compiled[tile, draft_len, dtype_name, arch, head_dims]
            if isinstance(found, aot.Resources) and not found.problems(arch):
                fitting.append((tile, found))
        kv_bytes = kv_dtype_from_name(dtype_name).itemsize
        buckets = {}
        for bs in args.batch_sizes:
            contexts = contexts_for(bs, args.contexts)
            config, _ = perf_model.best_config(
                fitting, gpu, heads, draft_len, bs, contexts, kv_bytes, head_dims
            )
            buckets[str(bs)] = tables.bucket_json(tables.Record(config))
        key = tables.entry_key(heads, draft_len, dtype_name, head_dims)
        entries[key] = {
            "num_heads": heads,
            "draft_len": draft_len,
            "kv_dtype": dtype_name,
            **_dims_field(head_dims),
            "buckets": buckets,
        }
        logger.info("%s: %d of %d tiles fit %s", key, len(fitting), len(candidates), arch)
    logger.info("compiled and modelled in %.0f s", time.perf_counter() - start)
    metadata = {
        "device": f"{gpu.device} (NOT MEASURED by this project)",
        "arch": arch,
        "multiprocessor_count": gpu.compute_units,
        "triton": triton.__version__,
        "torch": torch.__version__,
        "mla_verify": __version__,
        "kernel_hash": KERNEL_HASH,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "timing": "none: no hardware to measure on; configs chosen by a model, never timed",
        "measured": False,
        "model": gpu.as_metadata()
        | {"contexts": list(args.contexts), "max_problem_tokens": MAX_PROBLEM_TOKENS},
        "provenance": (
            f"UNMEASURED: derived from a model, never timed on {arch} hardware. Per bucket, "
            "the config with the lowest time the model in 'model' estimates "
            "(mla_verify/perf_model.py, tuning/amd.md) among the Triton kernel's tiles "
            f"that compile for {arch} with this triton without overflowing LDS or "
            "spilling registers (compiled ahead of time, mla_verify/aot.py). Replace it "
            "by tuning on the hardware: python -m mla_verify.tune (tuning/amd.md)."
        ),
    } | ({"note": args.note} if getattr(args, "note", None) else {})
    path = out_dir / f"{arch}.json"
    tables.write_entries(path, arch, metadata, entries)
    return path


def _bucket_json(
    found: Mapping[str | None, BucketResult], kept: Mapping[str | None, tables.Record]
) -> dict:
    """A tuned bucket in the table's format (``tables.bucket_json``): the
    records of its searches, and those it keeps as they were."""
    records = {**kept, **{kernel: _record(result) for kernel, result in found.items()}}
    return tables.bucket_json(records[None], records.get("triton"))


def _record(result: BucketResult) -> tables.Record:
    return tables.Record(
        config=result.config,
        tuned_us=result.tuned_us,
        default_us=result.default_us,
        context_lens=tuple(result.contexts),
        tuned_us_by_context=result.tuned.per_context,
        default_us_by_context=result.default.per_context,
        kernel_hash=kernel_hash(result.config),
    )


def _dims_field(head_dims: tuple[int, int]) -> dict:
    """An entry's head_dims field: none for MLA (tables.py)."""
    return {} if tuple(head_dims) == MLA_HEAD_DIMS else {"head_dims": list(head_dims)}


@dataclass(frozen=True)
class EntryWork:
    """One entry's buckets still to tune: per batch size the searches to run
    (as ``_searches`` names them: None the arch's own kernel, "triton" the
    Triton kernel beside it), the bucket's records that stay as they are,
    and those whose configs are timed again instead of searched
    (``--remeasure``), by search."""

    heads: int
    draft_len: int
    kv_dtype: str
    head_dims: tuple[int, int]
    searches: dict[int, tuple[str | None, ...]]
    kept: dict[int, dict[str | None, tables.Record]] = field(default_factory=dict)
    remeasured: dict[int, dict[str | None, tables.Record]] = field(default_factory=dict)

    @property
    def searched_kernels(self) -> list[str | None]:
        """The kernels some bucket searches (not only times again)."""
        return _searched_kernels(self.searches, self.remeasured)

    @property
    def kernels(self) -> list[str | None]:
        return _kernels(self.searches)

    @property
    def timed_again(self) -> list[VerifyConfig]:
        """The configs of the records timed again."""
        return [r.config for records in self.remeasured.values() for r in records.values()]


def pending_work(args, out_path: Path) -> list[EntryWork]:
    """The searches still to run per entry and bucket, for resuming (the
    arch is the table's, ``out_path``'s stem). A bucket's search is done
    where its record of it is current: measured with this code of its
    kernel family (``tables.record_is_stale``). A bucket the table holds
    runs only the searches of its stale records and keeps the others; one
    without a Triton record beside its config was tuned with
    --own-kernel-only and gets none, unless --triton-only asks for the
    Triton search alone in the held buckets. A new bucket, every bucket of an
    unmeasured (model-derived) table and, with --redo, every bucket runs
    every search. With --remeasure a stale record's search is its config
    timed again (``_remeasure_bucket``)."""
    arch = out_path.stem
    existing = tables.read_table(out_path) if out_path.exists() else None
    if existing and not existing["metadata"].get("measured", True):
        existing = None  # a measured bucket replaces an unmeasured table whole
    entries = tables.kept_entries(existing, KERNEL_HASH) if existing else {}
    work = []
    for dtype_name, head_dims in itertools.product(args.kv_dtypes, args.head_dims):
        for heads in args.heads:
            for draft_len in args.draft_lens:
                key = tables.entry_key(heads, draft_len, dtype_name, head_dims)
                portable = not args.own_kernel_only
                kernels = _searches(heads, draft_len, dtype_name, arch, head_dims, portable)
                buckets = entries.get(key, {}).get("buckets", {})
                searches, kept, remeasured = {}, {}, {}
                for bs in args.batch_sizes:
                    bucket = buckets.get(str(bs))
                    records = {} if bucket is None else tables.bucket_records(bucket)
                    todo = tuple(
                        k
                        for k in kernels
                        if not records
                        or args.redo
                        or (k in records and _is_stale(records[k], existing))
                        or (args.triton_only and k == "triton" and k not in records)
                    )
                    if args.triton_only and records and "triton" in kernels:
                        # A held bucket keeps the arch's own record as it is,
                        # unless that record is itself a Triton config: then
                        # it goes stale with the Triton records, and the
                        # bucket is searched in full (the Hopper kernel may
                        # win it now).
                        own = tables.Record.from_json(records[None]).config
                        own_is_triton = kernel_family(own) == "triton"
                        todo = tuple(k for k in todo if k == "triton" or own_is_triton)
                    keep = {k: r for k, r in records.items() if k not in todo}
                    if todo:
                        searches[bs] = todo
                    if todo and keep:
                        kept[bs] = {k: tables.Record.from_json(r) for k, r in keep.items()}
                    again = [k for k in todo if k in records] if args.remeasure else []
                    if again:
                        remeasured[bs] = {k: tables.Record.from_json(records[k]) for k in again}
                if searches:
                    work.append(
                        EntryWork(
                            heads, draft_len, dtype_name, head_dims, searches, kept, remeasured
                        )
                    )
    return work


def _is_stale(record: dict, table: dict) -> bool:
    return tables.record_is_stale(record, table["metadata"], KERNEL_HASH, KERNEL_HASHES)


def run_tuning(
    args: argparse.Namespace,
    *,
    arch: str,
    device: str,
    device_name: str,
    sm_count: int,
    timer: Timer,
    out_dir: Path,
) -> list[BucketResult]:
    """The tuning loop; ``timer`` and ``device`` are injectable for tests."""
    from tqdm import tqdm

    start = time.perf_counter()  # --time-limit counts the compile step too
    out_path = out_dir / f"{arch}.json"
    work = pending_work(args, out_path)
    total = sum(len(w.searches) for w in work)
    logger.info("%d buckets to tune in %d entries -> %s", total, len(work), out_path)
    again = sum(len(r) for w in work for r in w.remeasured.values())
    if again:
        logger.info("%d of their stale records: configs timed again, not searched", again)
    if device == "cuda" and work:
        workers = compile_workers(args.jobs)
        entries = [
            (
                w.heads,
                w.draft_len,
                w.kv_dtype,
                w.head_dims,
                w.kernels,
                w.searched_kernels,
                w.timed_again,
            )
            for w in work
        ]
        precompile(entries, arch, workers)

    metadata = table_metadata(arch, device_name, sm_count, args)
    results: list[BucketResult] = []
    pools: dict[str, torch.Tensor] = {}

    def record(
        found: dict[str | None, BucketResult], kept: dict[str | None, tables.Record]
    ) -> None:
        # The arch's own kernel's result, with the Triton one in it; or the
        # Triton one alone, where the bucket kept its config.
        result = found[None] if None in found else found["triton"]
        entry = {
            "num_heads": result.num_heads,
            "draft_len": result.draft_len,
            "kv_dtype": result.kv_dtype,
            **_dims_field(result.head_dims),
            "buckets": {str(result.batch_size): _bucket_json(found, kept)},
        }
        tables.write_entries(out_path, arch, metadata, {result.key: entry})
        results.append(result)
        bar.update(1)

    with tqdm(total=total, desc="tuning buckets", unit="bucket", file=sys.stderr) as bar:
        for w in work:
            if args.time_limit and time.perf_counter() - start > args.time_limit:
                logger.warning("time limit reached; rerun the same command to resume")
                break
            if w.kv_dtype not in pools:
                pools[w.kv_dtype] = _make_pool(args, w.kv_dtype, device)
            try:
                tune_entry(
                    w.heads,
                    w.draft_len,
                    w.kv_dtype,
                    w.searches,
                    args.contexts,
                    arch=arch,
                    pool=pools[w.kv_dtype],
                    device=device,
                    timer=timer,
                    top_k=args.top_k,
                    margin=args.margin,
                    on_bucket=record,
                    head_dims=w.head_dims,
                    kept=w.kept,
                    remeasured=w.remeasured,
                )
            except (RuntimeError, ValueError) as exc:  # one bad entry must not end the run
                logger.error("H%d L%d %s not tuned: %s", w.heads, w.draft_len, w.kv_dtype, exc)
    logger.info("tuning took %.0f s for %d buckets", time.perf_counter() - start, len(results))
    return results


def _make_pool(args, dtype_name: str, device: str) -> torch.Tensor:
    from .testing import make_pool

    needed = max(b * c for b in args.batch_sizes for c in contexts_for(b, args.contexts))
    # Room for the rotated copies of small problems, and always > L2.
    slots = needed if device == "cpu" else max(needed, L2_DEFEAT_BYTES // 576) * 2
    return make_pool(slots, kv_dtype_from_name(dtype_name), device)


def print_summary(results: list[BucketResult]) -> None:
    if not results:
        print("nothing tuned (every bucket already in the table; --redo re-tunes)")
        return
    by_context = [
        " ".join(f"{d / t:.2f}" for t, d in zip(r.tuned.per_context, r.default.per_context))
        for r in results
    ]
    # Columns as wide as their longest cell: keys with head dims and three
    # or more contexts would otherwise run into the next column.
    key_width = max(16, *(len(r.key) + 2 for r in results))
    context_width = max(14, *(len(text) + 2 for text in by_context))
    print(
        f"{'entry':<{key_width}}{'batch':>6}{'tuned us':>11}{'default us':>12}{'speed-up':>10}"
        f"  {'by context':<{context_width}}config"
    )
    for r, contexts in zip(results, by_context):
        print(
            f"{r.key:<{key_width}}{r.batch_size:>6}{r.tuned_us:>11.1f}{r.default_us:>12.1f}"
            f"{r.speedup:>9.2f}x  {contexts:<{context_width}}{r.config.to_dict()}"
        )
    geo = statistics.geometric_mean(r.speedup for r in results)
    print(f"geometric-mean speed-up over the default: {geo:.3f}x ({len(results)} buckets)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    if args.show:
        from .tune_report import show

        return show(args)
    if args.check:
        from .tune_report import check

        return check(args)
    if args.write_reported:
        out_dir = args.out or tables.user_table_dir()
        path = write_reported_table(args, args.write_reported, out_dir)
        print(f"wrote {path} (derived from a model, not measured)")
        return 0
    if not torch.cuda.is_available():
        print("python -m mla_verify.tune needs a GPU (this machine has none)", file=sys.stderr)
        return 2
    arch = current_arch()
    props = torch.cuda.get_device_properties(0)
    out_dir = args.out or tables.user_table_dir()
    try:
        results = run_tuning(
            args,
            arch=arch,
            device="cuda",
            device_name=props.name,
            sm_count=props.multi_processor_count,
            timer=graph_timer,
            out_dir=out_dir,
        )
    except KeyboardInterrupt:
        print(
            "interrupted: every bucket finished so far is saved; rerun to resume", file=sys.stderr
        )
        return 130
    print_summary(results)
    print(f"table: {out_dir / (arch + '.json')} (loaded at the next import of mla_verify)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
