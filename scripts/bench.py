"""Benchmark of MLA target-verify attention: the project's one source of speed numbers.

    python scripts/bench.py --quick                        # 12 shapes, a few minutes
    python scripts/bench.py --extra --rep-ms 10 --rounds 2 --out bench_out/extra
                                                           # tree, ragged, 256/256, paged
    python scripts/bench.py --shapes H16L4B32C16K H16L4B32Rlognormal16K --out bench_out/two
    python scripts/bench.py                                # the full grid (long)

Every run appends one row per shape x contender to one tidy CSV (``--csv``,
default ``results/results.csv``): device, versions, commit, date, config,
median/p20/p80 microseconds, bytes/s, FLOP/s, the fractions of the ceilings,
and the error against the float32 reference. ``--out DIR`` also writes that
run alone as results.csv, results.json, summary.md and roofline*.png (with
matplotlib). Run it as a script (``python scripts/bench.py``): Python then
puts ``scripts/`` first on the import path, which is how its modules beside
it are found (``bench_shapes``, ``bench_batch``, ``bench_timing``,
``bench_contenders``, ``bench_revisions``, ``bench_output``, and the
optional plot module ``bench_plot``); the package itself is imported as
installed (``pip install -e .``).

Measures, in one run on one GPU:

- the ceilings: device-to-device copy bandwidth (an SM-kernel copy timed
  inside a CUDA graph, read + write bytes; a graph-captured ``copy_`` becomes a
  copy-engine memcpy and is not a valid ceiling) and the bf16 ``torch.mm``
  rate on random 8192^3 operands;
- per shape, the contenders: ``tuned`` (the shipped table, launched as an
  engine launches it), ``paged`` (``verify_mla_paged`` on a paged copy of
  the same values, -page rows only), ``paged_step`` (the same given its
  step's ``paged_metadata`` for the shape's heads, made outside the timed
  call as FlashMLA's metadata is), ``paged_seesaw`` and
  ``paged_translated`` (the same with the seesaw kernel at any batch size
  where it can serve the call, and never: ``paged.seesaw_shape``'s rule
  opened or closed), ``default`` (the built-in default config),
  ``triton`` (the tuned tile on the package's portable Triton kernel),
  ``mha`` (the Triton kernel with BLOCK_H=1, the MHA-style baseline),
  ``torch_ref`` (the float32 reference on the GPU), ``flashinfer``
  (``BatchMLAPagedAttentionWrapper``, fa3 backend, page size 1),
  ``flashmla`` (FlashMLA's dense decode, 64-token pages; only where
  ``import flash_mla`` succeeds); ``sglang`` (SGLang's verify kernel, the
  one this package grew from, read from the checkout ``--sglang-src``
  names; uniform causal bf16 rows); and ``rev:<git rev>``: ``tuned`` as this
  package was at that commit, its code and shipped tables imported beside
  the working tree's (``load_revision``), so that revisions are compared
  in one process on the same batches (timed in separate processes, two
  revisions differed by up to 10% from order and clock alone);
  ``rev:<git rev>:triton``: that revision's ``triton``;
  ``rev:<git rev>:step``: its ``paged_step`` (-page rows only). All read the
  same KV values; each is checked against the float32 reference with the
  package's tolerance (``mla_verify.testing.check_close``) before it is
  timed. Each runs only where it computes the shape's call: FlashInfer,
  FlashMLA and ``mha`` on plain shapes (MLA 576/512, L causal drafts a
  request); tree, ragged and head-dim shapes time ``tuned``, ``default``,
  ``triton`` and ``torch_ref``, head-dim shapes ``sglang`` too; -page
  shapes ``paged``, ``tuned`` (token-indexed, the same values) and, at
  page 64, ``flashmla`` on the very pages ``paged`` reads; ``rev:``
  contenders run where ``tuned`` does (on -page shapes the revision's
  ``verify_mla_paged``, as ``paged``). The others get a ``skipped`` row
  saying why.

Shape specs: ``H{heads}L{drafts}B{batch}`` then the prefix lengths, one of
``C{ctx}`` (uniform), ``Rlognormal{mean}`` (lognormal lengths, sigma 1, the
same mean) or ``Rlong{long}x{short}`` (one request of ``long`` tokens among
``batch - 1`` of ``short``; ``x{short}`` defaults to 512). Lengths take an
optional ``K`` (x1024): ``H16L4B32C16K``. Optional suffixes, in any order,
each at most once, name the kind of call (names print them in this order):

- ``-d256`` / ``-d128``: ordinary attention with one shared KV head, q/k =
  v = 256 or 128, V a cache of its own as SGLang passes it (default:
  absorbed MLA, 576/512, V a view of K's first 512 columns);
- ``-ragged``: request b has E_b drafts, drawn in 1..L with a seed fixed by
  the shape (L >= 2), through ``qo_indptr``;
- ``-tree``: an SGLang tree mask (``custom_mask``/``mask_indptr``, topk > 1
  drafting; ``mla_verify.testing.make_batch(mask="tree")``) with the prefix
  visible (``skip_prefix_custom_mask=True``); ``-treefull``: the same tree
  with every prefix bit set and read (``skip_prefix_custom_mask=False``),
  so the cost of the prefix mask bits shows against ``-tree``;
- ``-i64``: the token-indexed call's ``kv_indices`` in int64 rather than
  int32, on the same slots as the plain row (issue 23: within 3% of its
  time);
- ``-page{1,16,32,64,128}``: the paged entry point, ``verify_mla_paged``,
  on a cache of that page size holding each request's prefix and then its
  L drafts' K, pages scattered (MLA, uniform causal drafts, bf16 only);
- ``-fp8``: the KV cache in fp8 e4m3 (k_scale = v_scale = 1; q, the drafts
  and the output stay bf16). FlashInfer and FlashMLA are timed on bf16 KV only.

A shape's tree, ragged, head-dim, int64 and paged variants get its plain
row's prefix lengths. Work per shape (``shape_work``): bytes are the prefix KV
read once (Dqk elements a token), q, the output, the drafts' K and V (the
drafts' cache rows on -page rows) and the custom mask bytes the kernel must
read; FLOPs are 2 H sum_b(E_b P_b) (Dqk + Dv).

Timing (``mla_verify.timing``): CUDA-graph replays of N back-to-back
launches, each launch reading a different set of scattered KV slots (sets
rotate so the KV read per replay is a few times the L2), reported as median,
p20 and p80 over replays in microseconds per launch. ``torch_ref`` syncs, so
it is timed eagerly. The contenders of a shape are timed in ``--rounds``
interleaved rounds (rounded up to a multiple of the contenders), each round
starting with the next contender, and each one's replays are pooled: timed
one after another, the one timed first ran up to 12% faster than the same
config timed next (`git show b2e39e1`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_revisions
import torch
import triton
from bench_batch import Batch, build_batch, estimate_bytes, plan_pool
from bench_contenders import (
    CONTENDERS,
    PAGED_CALLS,
    SGLANG_MAX_POOL,
    SGLANG_VERIFY,
    Contender,
    FlashInfer,
    FlashMLA,
    SGLangVerify,
    check_output,
    kernel_contender,
    not_applicable,
    paged_contender,
    rev_contender,
    torch_ref_contender,
)
from bench_output import (
    CONFIG_FIELDS,
    CSV_FIELDS,
    append_csv,
    check_csv,
    config_text,
    fmt,
    pct,
    stdout_table,
    write_outputs,
)
from bench_revisions import (
    REPO_ROOT,
    REV_PREFIX,
    REV_STEP_SUFFIX,
    REV_TRITON_SUFFIX,
    load_revision,
    run_git,
)
from bench_shapes import (
    EXTRA_SHAPES,
    QUICK_SHAPES,
    SUFFIXES,
    ShapeSpec,
    Work,
    full_grid,
    parse_shape,
    prefix_lengths,
    spec_work,
)
from bench_timing import (
    Ceilings,
    Timing,
    measure_ceilings,
    metrics,
    pool_timings,
    time_eager,
    time_graph,
)

import mla_verify

DEFAULT_CSV = REPO_ROOT / "results" / "results.csv"

logger = logging.getLogger("bench")


# --- one shape --------------------------------------------------------------------------


@dataclass
class RunContext:
    device: torch.device
    arch: str
    ceilings: Ceilings
    flashinfer: FlashInfer
    flashmla: FlashMLA
    sglang: SGLangVerify
    contenders: tuple[str, ...]
    meta: dict[str, Any]
    rep_ms: float
    rounds: int
    pool_min_bytes: int
    l2_bytes: int
    max_rotations: int
    mem_cap_bytes: int
    torch_ref_max_tokens: int
    seed: int


def _base_row(spec: ShapeSpec, prefix_lens: Sequence[int], ctx: RunContext) -> dict[str, Any]:
    work = spec_work(spec, prefix_lens)
    row: dict[str, Any] = dict.fromkeys(CSV_FIELDS)
    row.update(
        shape=spec.name,
        kv_dtype=spec.kv_dtype,
        num_heads=spec.num_heads,
        draft_len=spec.draft_len,
        batch_size=spec.batch_size,
        ctx_kind=spec.kind,
        ctx=spec.ctx,
        prefix_tokens=sum(prefix_lens),
        prefix_min=min(prefix_lens),
        prefix_max=max(prefix_lens),
        bytes=work.bytes,
        flops=work.flops,
        reason="",
        copy_bytes_per_s=ctx.ceilings.copy_bw,
        matmul_flop_per_s=ctx.ceilings.matmul_rate,
        arch=ctx.arch,
        **ctx.meta,
    )
    return row


def _with_config(row: dict[str, Any], contender: Contender) -> None:
    row["config_source"] = contender.config_source
    if contender.config is not None:
        for name in CONFIG_FIELDS:
            row[name] = getattr(contender.config, name, None)
        # Every field, including any this script does not know by name.
        fields = dataclasses.asdict(contender.config)
        row["config"] = json.dumps({k: v for k, v in fields.items() if v is not None})


def _make_contender(name: str, batch: Batch, ctx: RunContext) -> Contender | str:
    """The contender, or why it is skipped."""
    reason = not_applicable(name, batch.spec)
    if reason is not None:
        return reason
    if name in ("tuned", "default", "triton", "mha"):
        return kernel_contender(name, batch, ctx.arch)
    if name.startswith(REV_PREFIX):
        return rev_contender(bench_revisions.loaded_revisions[name], batch, ctx.arch)
    if name in PAGED_CALLS:
        seesaw, step = PAGED_CALLS[name]
        return paged_contender(batch, ctx.arch, name=name, seesaw=seesaw, step=step)
    if name == "torch_ref":
        tokens = sum(batch.prefix_lens)
        if tokens > ctx.torch_ref_max_tokens:
            return f"{tokens} prefix tokens > --torch-ref-max-tokens {ctx.torch_ref_max_tokens}"
        return torch_ref_contender(batch)
    if name == "flashinfer":
        if not ctx.flashinfer.available:
            return ctx.flashinfer.reason
        try:
            return ctx.flashinfer.contender(batch)
        except Exception as exc:
            # A failed JIT build would fail (slowly) again on every shape.
            reason = f"plan failed: {describe_error(exc)}"
            ctx.flashinfer.disable(f"disabled after an error in {batch.spec.name}: {reason}")
            raise
    if name == "flashmla":
        if not ctx.flashmla.available:
            return ctx.flashmla.reason
        return ctx.flashmla.contender(batch, ctx.seed + 3)
    if name == "sglang":
        if not ctx.sglang.available:
            return ctx.sglang.reason
        elements = max(batch.k_buffer.numel(), batch.sets[0].v_buffer.numel())
        if elements >= SGLANG_MAX_POOL:
            # On the H200 such a pool's first call broke the CUDA context.
            return (
                f"the pool holds {elements} elements; SGLang's kernel addresses it in "
                "int32 (slot x row stride), which wraps at 2^31"
            )
        return ctx.sglang.contender(batch)
    raise ValueError(f"unknown contender {name!r}")


def prepare_contender(
    name: str, batch: Batch, ref: torch.Tensor, ctx: RunContext, row: dict[str, Any]
) -> Contender | None:
    """Build and check one contender; None (with ``row`` saying skipped or
    FAILED) if it is not to be timed."""
    made = _make_contender(name, batch, ctx)
    if isinstance(made, str):
        row.update(status="skipped", reason=made)
        return None
    contender = made
    _with_config(row, contender)
    if contender.out is not None:
        contender.out.fill_(float("nan"))
    contender.launches[0]()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    check = check_output(contender.output(), ref)
    row.update(rel_err=check.rel_err, max_abs_err=check.max_abs_err)
    if not check.ok:
        row.update(status="FAILED", reason=check.reason)
        return None
    return contender


def time_contender(
    contender: Contender, batch: Batch, ctx: RunContext, row: dict[str, Any]
) -> Timing:
    """One round of one contender: graph replays where it can be captured."""
    if contender.graphable and row.get("timing") != "eager":
        try:
            timing = time_graph(contender.launches, rep_ms=ctx.rep_ms, written=contender.output)
            row["rotations"] = len(contender.launches)
            return timing
        except Exception as exc:
            logger.warning(
                "%s %s: graph capture failed (%s); timing eagerly",
                batch.spec.name,
                row["contender"],
                describe_error(exc),
            )
            torch.cuda.synchronize()
            row["reason"] = f"graph capture failed: {describe_error(exc)}"
    row["timing"] = "eager"
    row["rotations"] = 1
    return time_eager(contender.launches[0], rep_ms=ctx.rep_ms)


def record_timing(row: dict[str, Any], timing: Timing, ctx: RunContext) -> None:
    row.update(
        status="ok",
        median_us=timing.median_us,
        p20_us=timing.p20_us,
        p80_us=timing.p80_us,
        timing=timing.mode,
        launches_per_replay=timing.launches_per_replay,
        replays=timing.replays,
    )
    row.update(metrics(timing.median_us, Work(row["bytes"], row["flops"]), ctx.ceilings))


def balanced_rounds(rounds: int, contenders: int) -> int:
    """``rounds`` rounded up to a multiple of ``contenders``: each
    contender starts as many rounds."""
    contenders = max(contenders, 1)
    return -(-rounds // contenders) * contenders


def time_interleaved(
    ready: list[tuple[dict[str, Any], Contender]], batch: Batch, ctx: RunContext
) -> None:
    """Time the checked contenders in rounds, round r starting with
    contender r, ctx.rounds of them rounded up to a multiple of the
    contenders, so that each starts as many rounds; pools each one's
    replays into its row. (With 3 rounds, two contenders and the first
    starting two, the first led by 1-4% where both ran the same code.)"""
    rounds: dict[int, list[Timing]] = {id(row): [] for row, _ in ready}
    for r in range(balanced_rounds(ctx.rounds, len(ready))):
        start = r % len(ready)
        for row, contender in ready[start:] + ready[:start]:
            if row["status"] == "error":
                continue
            try:
                rounds[id(row)].append(time_contender(contender, batch, ctx, row))
            except Exception as exc:
                logger.exception("%s %s: error", batch.spec.name, row["contender"])
                row.update(status="error", reason=describe_error(exc))
                if not _cuda_healthy(ctx.device):
                    raise
    for row, _ in ready:
        if row["status"] != "error":
            record_timing(row, pool_timings(rounds[id(row)]), ctx)


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """tuned_speedup = t_contender / t_tuned (> 1: tuned is faster)."""
    tuned = next((r for r in rows if r["contender"] == "tuned" and r["status"] == "ok"), None)
    for r in rows:
        if tuned is not None and r["status"] == "ok":
            r["tuned_speedup"] = r["median_us"] / tuned["median_us"]


def run_shape(spec: ShapeSpec, ctx: RunContext) -> list[dict[str, Any]]:
    prefix_lens = prefix_lengths(spec)
    rotations, slots = plan_pool(
        prefix_lens,
        spec.draft_len,
        l2_bytes=ctx.l2_bytes,
        pool_min_bytes=ctx.pool_min_bytes,
        max_rotations=ctx.max_rotations,
        kv_bytes=spec.kv_bytes,
        width=spec.head_dims[0],
    )
    rows = []
    for name in ctx.contenders:
        row = _base_row(spec, prefix_lens, ctx)
        row["contender"] = name
        rows.append(row)
    flashmla = "flashmla" in ctx.contenders and ctx.flashmla.available
    need = estimate_bytes(spec, prefix_lens, slots, rotations, flashmla=flashmla)
    if need > ctx.mem_cap_bytes:
        reason = f"needs ~{need / 2**30:.1f} GiB > --mem-cap-gb {ctx.mem_cap_bytes / 2**30:.0f}"
        for row in rows:
            row.update(status="skipped", reason=reason)
        return rows

    batch = build_batch(
        spec, prefix_lens, rotations=rotations, slots=slots, device=ctx.device, seed=ctx.seed
    )
    if ctx.device.type == "cuda":
        # Before capture: graphs must not allocate.
        mla_verify.prepare_workspace(
            spec.batch_size,
            spec.num_heads,
            spec.draft_len,
            batch.k_buffer.dtype,
            device=ctx.device,
            head_dims=spec.head_dims,
        )
        if batch.paged:
            mla_verify.prepare_paged_workspace(
                spec.batch_size,
                spec.num_heads,
                spec.draft_len,
                max(block_table.shape[1] for _, block_table, _ in batch.paged),
                spec.page_size,
                batch.k_buffer.dtype,
                device=ctx.device,
            )
    ref = batch.sets[0].reference()
    logger.info(
        "%s: %d prefix tokens (min %d, max %d), pool %.2f GB, %d rotation set(s)",
        spec.name,
        sum(prefix_lens),
        min(prefix_lens),
        max(prefix_lens),
        batch.pool_bytes / 1e9,
        rotations,
    )
    ready = []
    for row in rows:
        name = row["contender"]
        try:
            contender = prepare_contender(name, batch, ref, ctx, row)
        except Exception as exc:
            logger.exception("%s %s: error", spec.name, name)
            row.update(status="error", reason=describe_error(exc))
            if not _cuda_healthy(ctx.device):
                raise
            continue
        if contender is not None:
            ready.append((row, contender))
    if ready:
        time_interleaved(ready, batch, ctx)
    for row in rows:
        _log_row(row)
    add_speedups(rows)
    return rows


def describe_error(exc: BaseException, limit: int = 400) -> str:
    """One line for a row's reason (a failed JIT build's log can be pages
    long; the full traceback goes to the log)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cuda_healthy(device: torch.device) -> bool:
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        return True
    except Exception:
        return False


def _log_row(row: dict[str, Any]) -> None:
    if row["status"] == "ok":
        logger.info(
            "  %-10s %9.1f us  (p20 %.1f, p80 %.1f)  %s%% roofline  err %.2e  %s",
            row["contender"],
            row["median_us"],
            row["p20_us"],
            row["p80_us"],
            pct(row["frac_roofline"]),
            row["rel_err"],
            config_text(row),
        )
    else:
        logger.info("  %-10s %s: %s", row["contender"], row["status"], row["reason"])


# --- main -------------------------------------------------------------------------------


def git_commit() -> str:
    """The checkout's commit; ``MLA_VERIFY_COMMIT`` names it where the tree
    was copied without its history (as on a lent GPU machine)."""
    if os.environ.get("MLA_VERIFY_COMMIT"):
        return os.environ["MLA_VERIFY_COMMIT"]
    try:
        result = run_git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = result.stdout.decode().strip()
    return commit if result.returncode == 0 and commit else "unknown"


def run_metadata(device: torch.device, flashinfer_version: str, flashmla_version: str) -> dict:
    """The columns every row of one run shares."""
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.hip or torch.version.cuda or "n/a",
        "mla_verify": mla_verify.__version__,
        "flashinfer": flashinfer_version,
        "flash_mla": flashmla_version,
        "git_commit": git_commit(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def select_shapes(args: argparse.Namespace) -> list[ShapeSpec]:
    if args.shapes:
        shapes = [parse_shape(s) for s in args.shapes]
    elif args.quick:
        shapes = [parse_shape(s) for s in QUICK_SHAPES]
    elif args.extra:
        shapes = [parse_shape(s) for s in EXTRA_SHAPES]
    else:
        shapes = full_grid()
    if args.shard:
        m = re.fullmatch(r"(\d+)/(\d+)", args.shard)
        if m is None or not 0 <= int(m.group(1)) < int(m.group(2)):
            raise ValueError(f"--shard {args.shard!r}: expected K/N with 0 <= K < N, e.g. 0/4")
        k, n = int(m.group(1)), int(m.group(2))
        shapes = shapes[k::n]
    return shapes


def contender_arg(text: str) -> str:
    """A --contenders value: a fixed name, or ``rev:<git rev>`` (or
    ``rev:<directory>`` holding one's mla_verify/ and configs/), imported now
    (before any GPU work) and named by its commit (the directory's name)."""
    if text.startswith(REV_PREFIX):
        rev, kernel, step = text.removeprefix(REV_PREFIX), None, False
        if rev.endswith(REV_TRITON_SUFFIX):
            rev, kernel = rev.removesuffix(REV_TRITON_SUFFIX), "triton"
        elif rev.endswith(REV_STEP_SUFFIX):
            rev, step = rev.removesuffix(REV_STEP_SUFFIX), True
        try:
            revision = load_revision(rev)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text}: {exc}") from None
        if kernel is not None or step:
            revision = dataclasses.replace(revision, kernel=kernel, step=step)
            bench_revisions.loaded_revisions[revision.name] = revision
        return revision.name
    if text not in CONTENDERS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected one of {', '.join(CONTENDERS)} or rev:<git rev>"
        )
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "shape specs: H<heads>L<drafts>B<batch> + C<ctx> | Rlognormal<mean> | "
            f"Rlong<long>[x<short>], then optional suffixes {SUFFIXES}, e.g. "
            "H16L4B32C16384, H16L4B32Rlognormal16K-tree, H16L4B64Rlong65536x512-page64."
            "\nquick set: " + " ".join(QUICK_SHAPES) + "\nextra set: " + " ".join(EXTRA_SHAPES)
        ),
    )
    parser.add_argument(
        "--csv",
        type=Path,
        default=DEFAULT_CSV,
        help="the tidy CSV every run appends to (default: results/results.csv in the checkout)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="also write this run alone here: results.csv, results.json, summary.md, plot",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--quick", action="store_true", help=f"the {len(QUICK_SHAPES)}-shape subset (a few minutes)"
    )
    which.add_argument(
        "--extra",
        action="store_true",
        help=f"the {len(EXTRA_SHAPES)}-shape set of tree, ragged, 256/256, int64-index and "
        "paged rows (about 4 minutes at --rep-ms 10 --rounds 2, most of it first compiles)",
    )
    which.add_argument("--shapes", nargs="+", metavar="SPEC", help="explicit shape specs")
    parser.add_argument(
        "--shard",
        metavar="K/N",
        help="run every N-th selected shape starting at K (split the full grid)",
    )
    parser.add_argument(
        "--contenders",
        nargs="+",
        type=contender_arg,
        default=list(CONTENDERS),
        metavar="NAME",
        help=f"contenders to run, among {', '.join(CONTENDERS)} (the default: all), and "
        "rev:<git rev>: tuned as this package was at that commit (its own code and shipped "
        "tables), timed side by side with the working tree's, e.g. rev:HEAD~2; or "
        "rev:<directory> holding a revision's mla_verify/ and configs/ (where there is no "
        "git history); rev:<rev>:triton: that revision's portable kernel, as triton; "
        "rev:<rev>:step: its paged call given the step's metadata, as paged_step. "
        "tuned is the baseline of the ratios",
    )
    parser.add_argument("--no-flashinfer", action="store_true", help="skip FlashInfer")
    parser.add_argument(
        "--sglang-src",
        type=Path,
        metavar="DIR",
        help=f"an SGLang checkout's python folder (holding {SGLANG_VERIFY}): times SGLang's "
        "verify kernel as the sglang contender",
    )
    parser.add_argument(
        "--rep-ms",
        type=float,
        default=50.0,
        help="replay time per contender, shape and round (default 50)",
    )
    parser.add_argument(
        "--pool-mb",
        type=float,
        default=512.0,
        help="minimum KV pool size; several times the L2 (default 512)",
    )
    parser.add_argument(
        "--max-rotations",
        type=int,
        default=32,
        help="most KV slot sets cycled through so launches miss L2 (default 32)",
    )
    parser.add_argument(
        "--mem-cap-gb",
        type=float,
        default=40.0,
        help="skip shapes whose tensors exceed this (default 40)",
    )
    parser.add_argument(
        "--torch-ref-max-tokens",
        type=int,
        default=2 << 20,
        help="time torch_ref only up to this many prefix tokens (default 2M)",
    )
    parser.add_argument(
        "--copy-mb",
        type=float,
        default=1024.0,
        help="size of each buffer of the copy-bandwidth ceiling (default 1024)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved timing rounds per shape, rounded up to a multiple of its "
        "contenders so each starts as many; each contender's replays pooled (default 3)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--list-shapes",
        action="store_true",
        help="print the selected shapes and exit (no GPU needed)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    args.contenders = list(dict.fromkeys(args.contenders))  # rev:<sha> once, however named
    try:
        args.shape_list = select_shapes(args)
        check_csv(args.csv)
    except ValueError as exc:
        parser.error(str(exc))
    if args.max_rotations < 1:
        parser.error("--max-rotations must be >= 1")
    if args.rounds < 1:
        parser.error(f"--rounds: expected an int >= 1, got {args.rounds}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if args.list_shapes:
        print("\n".join(s.name for s in args.shape_list))
        return 0
    if not torch.cuda.is_available():
        logger.error(
            "no CUDA GPU is visible (torch %s, cuda %s): this benchmark times GPU "
            "kernels and needs one; nothing was run",
            torch.__version__,
            torch.version.cuda,
        )
        return 2

    device = torch.device("cuda", torch.cuda.current_device())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    flashinfer = FlashInfer(
        enabled="flashinfer" in args.contenders and not args.no_flashinfer, device=device
    )
    if flashinfer.available:
        logger.info(
            "flashinfer %s: the first plan JIT-compiles the fa3 MLA module", flashinfer.version
        )
    else:
        logger.info("flashinfer skipped: %s", flashinfer.reason)
    flashmla = FlashMLA(enabled="flashmla" in args.contenders)
    if not flashmla.available:
        logger.info("flashmla skipped: %s", flashmla.reason)
    sglang = SGLangVerify("sglang" in args.contenders, args.sglang_src)
    if not sglang.available:
        logger.info("sglang skipped: %s", sglang.reason)
    meta = run_metadata(device, flashinfer.version, flashmla.version)
    arch = mla_verify.current_arch(device)
    props = torch.cuda.get_device_properties(device)
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or (50 << 20))
    logger.info(
        "%s (%s), L2 %.0f MB, %d shapes, contenders %s",
        meta["device"],
        arch,
        l2_bytes / 2**20,
        len(args.shape_list),
        " ".join(args.contenders),
    )
    for name in args.contenders:
        if name in bench_revisions.loaded_revisions:
            rev = bench_revisions.loaded_revisions[name]
            logger.info("%s: rev %s, imported as %s", name, rev.given, rev.module.__name__)

    ceilings = measure_ceilings(device, args.rep_ms, int(args.copy_mb * 2**20))
    logger.info("ceilings: %s", ", ".join(f"{k} {fmt(v)}" for k, v in ceilings.details.items()))
    ctx = RunContext(
        device=device,
        arch=arch,
        ceilings=ceilings,
        flashinfer=flashinfer,
        flashmla=flashmla,
        sglang=sglang,
        contenders=tuple(args.contenders),
        meta=meta,
        rep_ms=args.rep_ms,
        rounds=args.rounds,
        pool_min_bytes=int(args.pool_mb * 2**20),
        l2_bytes=l2_bytes,
        max_rotations=args.max_rotations,
        mem_cap_bytes=int(args.mem_cap_gb * 2**30),
        torch_ref_max_tokens=args.torch_ref_max_tokens,
        seed=args.seed,
    )
    rows: list[dict[str, Any]] = []
    aborted = False
    for i, spec in enumerate(args.shape_list):
        logger.info("[%d/%d] %s", i + 1, len(args.shape_list), spec.name)
        try:
            shape_rows = run_shape(spec, ctx)
        except Exception as exc:
            logger.exception("%s: shape failed", spec.name)
            if not _cuda_healthy(device):
                logger.error("the CUDA context is broken (%s); stopping after %d shapes", exc, i)
                aborted = True
                break
            shape_rows = []
            for name in ctx.contenders:
                row = _base_row(spec, prefix_lengths(spec), ctx)
                row.update(contender=name, status="error", reason=describe_error(exc))
                shape_rows.append(row)
        rows += shape_rows
        append_csv(shape_rows, args.csv)  # shape by shape: a crash keeps what was measured
        torch.cuda.empty_cache()
        if args.out is not None:
            write_outputs(rows, meta, ceilings, args.out, plot=False)
    logger.info("appended %d rows to %s", len(rows), args.csv)
    if args.out is not None:
        write_outputs(rows, meta, ceilings, args.out, plot=not args.no_plot)
        logger.info(
            "wrote %s",
            ", ".join(str(args.out / n) for n in ("results.csv", "results.json", "summary.md")),
        )
    logging.shutdown()
    sys.stderr.flush()
    print(stdout_table(rows, ceilings), flush=True)
    return 1 if aborted else 0


if __name__ == "__main__":
    sys.exit(main())
