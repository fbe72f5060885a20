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
puts ``scripts/`` first on the import path, which is how the optional plot
module beside it, ``bench_plot``, is found; the package itself is imported
as installed (``pip install -e .``).

Measures, in one run on one GPU:

- the ceilings: device-to-device copy bandwidth (an SM-kernel copy timed
  inside a CUDA graph, read + write bytes; a graph-captured ``copy_`` becomes a
  copy-engine memcpy and is not a valid ceiling) and the bf16 ``torch.mm``
  rate on random 8192^3 operands;
- per shape, the contenders: ``tuned`` (the shipped table, launched as an
  engine launches it), ``paged`` (``verify_mla_paged`` on a paged copy of
  the same values, -page rows only), ``paged_seesaw`` and
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
  ``rev:<git rev>:triton``: that revision's ``triton``. All read the
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
- ``-page{1,16,32,64,128}``: the paged entry point, ``verify_mla_paged``,
  on a cache of that page size holding each request's prefix and then its
  L drafts' K, pages scattered (MLA, uniform causal drafts, bf16 only);
- ``-fp8``: the KV cache in fp8 e4m3 (k_scale = v_scale = 1; q, the drafts
  and the output stay bf16). FlashInfer and FlashMLA are timed on bf16 KV only.

A shape's tree, ragged, head-dim and paged variants get its plain row's
prefix lengths. Work per shape (``shape_work``): bytes are the prefix KV
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
import atexit
import csv
import dataclasses
import datetime
import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import types
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

import mla_verify
from mla_verify.config import (
    HOPPER_KERNELS,
    VerifyConfig,
    default_num_kv_splits,
    rows_per_program,
)
from mla_verify.paged import PAGE_SIZES
from mla_verify.plan import plan_call
from mla_verify.problem import kv_columns, kv_dtype_name
from mla_verify.tables import ENV_VAR as CONFIG_DIR_VAR
from mla_verify.testing import (
    Q_DIM,
    V_DIM,
    VerifyBatch,
    check_close,
    make_batch,
    make_pool,
    relative_error,
)
from mla_verify.timing import eager_samples_us, graph_replays, percentile

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = REPO_ROOT / "results" / "results.csv"

logger = logging.getLogger("bench")

ROPE_DIM = Q_DIM - V_DIM
ACT_DTYPE = torch.bfloat16  # q, the drafts, the output, and the KV cache unless fp8
ELEM = 2  # bytes of a bf16 element
FLASHMLA_PAGE = 64  # tokens a page of FlashMLA's dense-decode cache


@dataclass(frozen=True)
class KVCacheDtype:
    """A KV cache dtype a shape can name, by the suffix of its spec."""

    torch_dtype: torch.dtype
    bytes: int
    suffix: str


KV_CACHE_DTYPES = {
    "bf16": KVCacheDtype(torch.bfloat16, 2, ""),
    "fp8_e4m3": KVCacheDtype(torch.float8_e4m3fn, 1, "-fp8"),
}

CONTENDERS = (
    "tuned",
    "paged",
    "paged_seesaw",
    "paged_translated",
    "default",
    "triton",
    "mha",
    "torch_ref",
    "flashinfer",
    "flashmla",
    "sglang",
)
PLOT_CONTENDERS = ("tuned", "paged", "triton", "flashinfer", "flashmla")

QUICK_SHAPES = (
    "H8L2B64C65536",  # memory-bound, H*L = 16
    "H8L2B8C2048",  # small, short contexts
    "H16L4B64C16384",  # H*L = 64, at the ridge
    "H16L4B32Rlognormal16384",  # ragged: lognormal lengths
    "H16L4B64Rlong65536x512",  # ragged: one long request among short ones
    "H16L4B1C16384",  # one request
    "H64L4B32C16384",  # compute-bound, H*L = 256
    "H64L4B8Rlognormal16384",
    "H128L2B32C16384",  # compute-bound, H*L = 256
    "H128L4B32C16384",  # compute-bound, H*L = 512
    "H128L4B1C65536",  # one long request, many heads
    "H128L4B64C2048",
)
# Every kind of call besides the plain one, next to the plain rows it is
# compared with (the same shape and values): tree masks and ragged drafts
# (issue 25: within 10% of the plain row's efficiency), ordinary attention
# at 256/256 for 16/8/4 local heads (Qwen3.5 at TP 2/4/8), and the paged
# entry point at page 64 (against FlashMLA on the same pages) and page 1
# (against the token-indexed call on the same values; issue 26). The plain
# rows of H16L4B32C16K and H128L4B32C16K are their -page rows' `tuned`.
EXTRA_SHAPES = (
    "H64L4B32C16384",  # the plain row of the H64 tree/ragged rows
    "H16L4B32C16384-tree",
    "H16L4B32C16384-treefull",  # the prefix mask bits read: their cost against -tree
    "H16L4B32C16384-ragged",
    "H64L4B32C16384-tree",
    "H64L4B32C16384-ragged",
    "H128L4B32C16384-ragged-tree",
    "H4L4B32C16384-d256",
    "H8L4B32C16384-d256",
    "H16L4B32C16384-d256",
    "H16L4B32C16384-page64",
    "H16L4B32C16384-page1",
    "H128L4B32C16384-page64",
    "H128L4B32C16384-page1",
    "H8L2B64C65536-page64",
    "H8L2B64C65536-page1",
)
GRID_HEADS = (8, 16, 32, 64, 128)
GRID_DRAFTS = (1, 2, 4, 8)
GRID_BATCHES = (1, 8, 32, 64)
GRID_CONTEXTS = (2048, 16384, 65536)
LONG_CTX, SHORT_CTX = 65536, 512

# The tidy CSV: one row per shape x contender, the same columns in every
# run, so runs append to one file. Rates in bytes/s and FLOP/s; frac_* are
# fractions (0..1) of the run's own ceilings.
CSV_FIELDS = (
    # the run
    "date_utc",
    "git_commit",
    "device",
    "arch",
    "torch",
    "triton",
    "cuda",
    "mla_verify",
    "flashinfer",
    "flash_mla",
    # the shape
    "shape",
    "num_heads",
    "draft_len",
    "batch_size",
    "ctx_kind",
    "ctx",
    "kv_dtype",
    "prefix_tokens",
    "prefix_min",
    "prefix_max",
    # the contender and its config
    "contender",
    "status",
    "reason",
    "config_source",
    "kernel",
    "BLOCK_H",
    "BLOCK_N",
    "NUM_KV_SPLITS",
    "num_warps",
    "num_stages",
    "MIN_SHARE",
    "config",
    # the measurement
    "timing",
    "launches_per_replay",
    "replays",
    "rotations",
    "median_us",
    "p20_us",
    "p80_us",
    "bytes",
    "flops",
    "bytes_per_s",
    "flop_per_s",
    "copy_bytes_per_s",
    "matmul_flop_per_s",
    "frac_copy_bw",
    "frac_matmul",
    "frac_roofline",
    "bound",
    "tuned_speedup",
    "rel_err",
    "max_abs_err",
)
CONFIG_FIELDS = (
    "BLOCK_H",
    "BLOCK_N",
    "NUM_KV_SPLITS",
    "num_warps",
    "num_stages",
    "kernel",
    "MIN_SHARE",
)


# --- shapes -------------------------------------------------------------------------


MLA_DIMS = (Q_DIM, V_DIM)  # absorbed MLA: q/k 576 (512 latent + 64 rope), v 512
HEAD_DIM_SUFFIXES = {(256, 256): "-d256", (128, 128): "-d128"}  # ordinary attention, V = K
MASKS = {"causal": "", "tree": "-tree", "treefull": "-treefull"}


@dataclass(frozen=True)
class ShapeSpec:
    """One benchmark shape. ``ctx`` is the uniform length, the lognormal
    mean, or the long request's length; ``short`` only for kind 'long'.

    The call's kind, each from a suffix of the spec: ``head_dims`` (q/k, v);
    ``ragged``: request b has E_b drafts, 1..L (``draft_counts``);
    ``mask``: 'causal' (no custom mask), 'tree' (SGLang's tree mask, the
    prefix visible: skip_prefix_custom_mask=True) or 'treefull' (the same
    tree, every prefix bit set and read); ``page_size``: 0 for the
    token-indexed entry point, else the paged one's page."""

    num_heads: int
    draft_len: int
    batch_size: int
    kind: str  # 'uniform' | 'lognormal' | 'long'
    ctx: int
    short: int = SHORT_CTX
    kv_dtype: str = "bf16"  # a key of KV_CACHE_DTYPES
    head_dims: tuple[int, int] = MLA_DIMS
    ragged: bool = False
    mask: str = "causal"  # a key of MASKS
    page_size: int = 0

    @property
    def name(self) -> str:
        head = f"H{self.num_heads}L{self.draft_len}B{self.batch_size}"
        if self.kind == "uniform":
            lens = f"C{self.ctx}"
        elif self.kind == "lognormal":
            lens = f"Rlognormal{self.ctx}"
        else:
            lens = f"Rlong{self.ctx}x{self.short}"
        return (
            head
            + lens
            + HEAD_DIM_SUFFIXES.get(self.head_dims, "")
            + ("-ragged" if self.ragged else "")
            + MASKS[self.mask]
            + (f"-page{self.page_size}" if self.page_size else "")
            + KV_CACHE_DTYPES[self.kv_dtype].suffix
        )

    @property
    def kv_bytes(self) -> int:
        """Bytes of one KV cache element."""
        return KV_CACHE_DTYPES[self.kv_dtype].bytes

    @property
    def mla(self) -> bool:
        return self.head_dims == MLA_DIMS

    @property
    def plain(self) -> bool:
        """Absorbed MLA, every request L causal drafts: the call FlashInfer
        and FlashMLA compute too."""
        return self.mla and not self.ragged and self.mask == "causal"


_SPEC_RE = re.compile(
    r"^H(\d+)L(\d+)B(\d+)"
    r"(?:C(\d+K?)|Rlognormal(\d+K?)|Rlong(\d+K?)(?:x(\d+K?))?)"
    r"((?:-[a-z0-9]+)*)$",
    re.IGNORECASE,
)
SUFFIXES = (
    "-d256, -d128, -ragged, -tree, -treefull, -page{" + ",".join(map(str, PAGE_SIZES)) + "}, -fp8"
)


def _length(text: str) -> int:
    text = text.upper()
    return int(text[:-1]) * 1024 if text.endswith("K") else int(text)


def _suffixes(text: str, given: str) -> dict[str, Any]:
    """The ShapeSpec fields a spec's suffixes set, in any order, each once."""
    fields: dict[str, Any] = {}
    set_by: dict[str, str] = {}  # field -> the suffix that set it
    for token in given.lower().split("-")[1:]:
        suffix = f"-{token}"
        if suffix == "-fp8":
            field_name, value = "kv_dtype", "fp8_e4m3"
        elif suffix in HEAD_DIM_SUFFIXES.values():
            field_name = "head_dims"
            value = next(d for d, x in HEAD_DIM_SUFFIXES.items() if x == suffix)
        elif suffix == "-ragged":
            field_name, value = "ragged", True
        elif suffix in ("-tree", "-treefull"):
            field_name, value = "mask", token
        elif re.fullmatch(r"page\d+", token) and int(token[4:]) in PAGE_SIZES:
            field_name, value = "page_size", int(token[4:])
        else:
            raise ValueError(f"shape {text!r}: unknown suffix {suffix!r}; expected {SUFFIXES}")
        if field_name in set_by:
            what = "given twice" if set_by[field_name] == suffix else f"with {set_by[field_name]}"
            raise ValueError(f"shape {text!r}: {suffix} {what} (one {field_name} a shape)")
        fields[field_name], set_by[field_name] = value, suffix
    return fields


def parse_shape(text: str) -> ShapeSpec:
    """``H16L4B32C16384`` / ``H16L4B32Rlognormal16384`` / ``H16L4B64Rlong65536x512``,
    then optional suffixes in any order (``-d256``, ``-ragged``, ``-tree``,
    ``-page64``, ``-fp8``, ...; see the module docstring)."""
    m = _SPEC_RE.match(text.strip())
    if m is None:
        raise ValueError(
            f"shape {text!r}: expected H<heads>L<drafts>B<batch> then C<ctx>, "
            f"Rlognormal<mean> or Rlong<long>[x<short>], then optional suffixes ({SUFFIXES}), "
            "e.g. H16L4B32C16384-tree"
        )
    heads, drafts, batch = (int(m.group(i)) for i in (1, 2, 3))
    short = SHORT_CTX
    if m.group(4):
        kind, ctx = "uniform", _length(m.group(4))
    elif m.group(5):
        kind, ctx = "lognormal", _length(m.group(5))
    else:
        kind, ctx = "long", _length(m.group(6))
        short = _length(m.group(7)) if m.group(7) else SHORT_CTX
    spec = ShapeSpec(heads, drafts, batch, kind, ctx, short, **_suffixes(text, m.group(8)))
    if min(spec.num_heads, spec.draft_len, spec.batch_size, spec.ctx, spec.short) < 1:
        raise ValueError(f"shape {text!r}: every number must be >= 1")
    if spec.ragged and spec.draft_len < 2:
        raise ValueError(f"shape {text!r}: -ragged needs L >= 2 (counts 1..L)")
    if spec.page_size and not spec.plain:
        raise ValueError(
            f"shape {text!r}: -page{spec.page_size} is the paged entry point "
            "(verify_mla_paged): absorbed MLA 576/512, L causal drafts a request; "
            "it takes no -d256/-d128, -ragged, -tree or -treefull"
        )
    if spec.page_size and spec.kv_dtype != "bf16":
        raise ValueError(
            f"shape {text!r}: paged rows are bf16 (the drafts live in the cache, so an fp8 "
            "cache would hold other draft values than the token-indexed call's)"
        )
    return spec


def full_grid() -> list[ShapeSpec]:
    """Uniform contexts for every (H, L, bs); for bs > 1 also lognormal
    lengths of each mean and one long request among short ones."""
    shapes = []
    for h in GRID_HEADS:
        for l in GRID_DRAFTS:
            for b in GRID_BATCHES:
                for c in GRID_CONTEXTS:
                    shapes.append(ShapeSpec(h, l, b, "uniform", c))
                if b > 1:
                    for c in GRID_CONTEXTS:
                        shapes.append(ShapeSpec(h, l, b, "lognormal", c))
                    shapes.append(ShapeSpec(h, l, b, "long", LONG_CTX, SHORT_CTX))
    return shapes


def _plain_name(spec: ShapeSpec) -> str:
    """The name without the call-kind suffixes (-fp8 kept): what seeds the
    random lengths, so a shape's tree, ragged, head-dim and paged rows get
    the prefix lengths of its plain row."""
    return dataclasses.replace(
        spec, head_dims=MLA_DIMS, ragged=False, mask="causal", page_size=0
    ).name


def prefix_lengths(spec: ShapeSpec) -> list[int]:
    """Per-request prefix lengths, deterministic per shape name."""
    bs = spec.batch_size
    if spec.kind == "uniform":
        return [spec.ctx] * bs
    if spec.kind == "long":
        return [spec.ctx] + [spec.short] * (bs - 1)
    rng = random.Random(zlib.crc32(_plain_name(spec).encode()))
    sigma = 1.0
    draws = [rng.lognormvariate(math.log(spec.ctx) - sigma * sigma / 2, sigma) for _ in range(bs)]
    # Rescale to the exact mean, then give the rounding remainder to the longest.
    scale = spec.ctx * bs / sum(draws)
    lens = [max(1, round(x * scale)) for x in draws]
    longest = max(range(bs), key=lens.__getitem__)
    lens[longest] = max(1, lens[longest] + spec.ctx * bs - sum(lens))
    return lens


def draft_counts(spec: ShapeSpec) -> list[int]:
    """Per-request draft counts E_b: L each, or for -ragged uniform in
    1..L, deterministic per shape name (a fixed seed)."""
    if not spec.ragged:
        return [spec.draft_len] * spec.batch_size
    rng = random.Random(zlib.crc32(f"{_plain_name(spec)} drafts".encode()))
    return [rng.randint(1, spec.draft_len) for _ in range(spec.batch_size)]


# --- work and metrics ---------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    bytes: int  # prefix KV read once + q + out + the drafts' K/V (+ mask bytes read)
    flops: int  # 2 * H * sum_b(E_b * P_b) * (Dqk + Dv)


def shape_work(
    num_heads: int,
    draft_len: int,
    prefix_lens: Sequence[int],
    kv_bytes: int = ELEM,
    *,
    head_dims: tuple[int, int] = MLA_DIMS,
    draft_counts: Sequence[int] | None = None,
    mask: str = "causal",
    paged: bool = False,
) -> Work:
    """The bytes a verify call must move and the FLOPs of its prefix products.

    Bytes: the prefix KV read once: Dqk elements a token for MLA (V is a
    view of K's first 512 columns), Dqk + Dv for 256/256 and 128/128 (V a
    cache of its own, ``problem.kv_columns``), q and
    out in bf16, and the drafts' K and V: k_extend + v_extend in bf16, or in
    a paged call the drafts' cache rows (Dqk cache elements each). A custom
    mask adds the bytes the kernel must read: the E_b x E_b draft block with
    the prefix visible ('tree'), every row's P_b + E_b bits ('treefull').
    FLOPs: 2 H sum_b(E_b P_b) (Dqk + Dv), the two products over the prefix;
    E_b = L unless ``draft_counts`` says otherwise (ragged)."""
    dqk, dv = head_dims
    counts = list(draft_counts) if draft_counts is not None else [draft_len] * len(prefix_lens)
    rows = sum(counts)
    prefix = sum(prefix_lens)
    drafts = kv_bytes * rows * dqk if paged else ELEM * rows * (dqk + dv)
    prefix_kv = kv_bytes * prefix * kv_columns(head_dims)
    nbytes = prefix_kv + drafts + ELEM * rows * num_heads * (dqk + dv)  # q + out
    if mask == "tree":
        nbytes += sum(e * e for e in counts)
    elif mask == "treefull":
        nbytes += sum(e * (p + e) for e, p in zip(counts, prefix_lens))
    flops = 2 * num_heads * sum(e * p for e, p in zip(counts, prefix_lens)) * (dqk + dv)
    return Work(nbytes, flops)


def spec_work(spec: ShapeSpec, prefix_lens: Sequence[int]) -> Work:
    """``shape_work`` of one shape's call (its kind from its suffixes)."""
    return shape_work(
        spec.num_heads,
        spec.draft_len,
        prefix_lens,
        spec.kv_bytes,
        head_dims=spec.head_dims,
        draft_counts=draft_counts(spec),
        mask=spec.mask,
        paged=spec.page_size > 0,
    )


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


# --- correctness ----------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    ok: bool
    rel_err: float
    max_abs_err: float
    reason: str


def check_output(out: torch.Tensor, ref: torch.Tensor) -> Check:
    """The package's test tolerance (``mla_verify.testing.check_close``):
    every element close and the whole within its relative error; NaN
    anywhere fails."""
    diff = out.float() - ref
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    try:
        return Check(True, check_close(out, ref), max_abs, "")
    except AssertionError as exc:
        return Check(False, relative_error(out, ref), max_abs, str(exc))


# --- batches ------------------------------------------------------------------------


@dataclass
class Batch:
    """The tensors of one shape: ``sets[r]`` is the batch of rotation set r,
    which differ only in their prefix slots (``kv_indices``) in one shared
    pool. ``fi_kv_indices[r]`` is set r's prefix plus the request's L draft
    slots (which hold k_extend) for FlashInfer's paged cache (plain shapes
    only). ``paged[r]`` is set r's values in a paged cache of
    ``spec.page_size`` (``paged_kv_with_drafts``: kv_cache, block_table,
    cache_seqlens), on -page rows only."""

    spec: ShapeSpec
    prefix_lens: list[int]
    sets: list[VerifyBatch]
    fi_kv_indptr: torch.Tensor | None  # [bs+1] int32, prefix + L per request
    fi_kv_indices: list[torch.Tensor]  # per rotation set, [sum(prefix) + bs*L] int32
    fi_kv_lens: torch.Tensor | None  # [bs] int32
    paged: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @property
    def rotations(self) -> int:
        return len(self.sets)

    @property
    def q(self) -> torch.Tensor:  # [sum(E_b), H, Dqk]
        return self.sets[0].q

    @property
    def k_buffer(self) -> torch.Tensor:  # [slots, 1, Dqk], shared by every set
        return self.sets[0].k_buffer

    @property
    def qo_indptr(self) -> torch.Tensor:
        return self.sets[0].qo_indptr

    @property
    def sm_scale(self) -> float:
        return self.sets[0].sm_scale

    @property
    def pool_bytes(self) -> int:
        """The KV pools' bytes: K's, and V's where it is a cache of its own."""
        k, v = self.k_buffer, self.sets[0].v_buffer
        own_v = v.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()
        return sum(t.numel() * t.element_size() for t in ((k, v) if own_v else (k,)))


def plan_pool(
    prefix_lens: Sequence[int],
    draft_len: int,
    *,
    l2_bytes: int,
    pool_min_bytes: int,
    max_rotations: int,
    kv_bytes: int = ELEM,
    width: int = Q_DIM,
) -> tuple[int, int]:
    """(rotation sets, pool slots): enough disjoint slot sets that one cycle
    through them reads about 4x the L2, and a pool larger than the used slots
    and than ``pool_min_bytes``. ``width``: elements of a pool row (Dqk)."""
    per_set = sum(prefix_lens) + len(prefix_lens) * draft_len
    set_bytes = per_set * width * kv_bytes
    rotations = max(1, min(max_rotations, math.ceil(4 * l2_bytes / set_bytes)))
    needed = rotations * per_set
    slots = max(math.ceil(pool_min_bytes / (width * kv_bytes)), math.ceil(1.25 * needed))
    return rotations, slots


def cache_pages(prefix_lens: Sequence[int], draft_len: int, page_size: int = FLASHMLA_PAGE) -> int:
    """Pages of a paged cache for one rotation set: prefix + drafts, per request."""
    return sum(-(-(p + draft_len) // page_size) for p in prefix_lens)


def estimate_bytes(
    spec: ShapeSpec,
    prefix_lens: Sequence[int],
    slots: int,
    rotations: int,
    *,
    flashmla: bool = False,
) -> int:
    """Device bytes the shape's tensors take (pool, q/o copies, indices, a
    custom mask, and the paged copies of the KV: FlashMLA's 64-token pages
    where it runs, the shape's own pages on -page rows, shared at page 64)."""
    dqk, dv = spec.head_dims
    tokens = spec.batch_size * spec.draft_len
    per_set = sum(prefix_lens) + tokens
    page_sizes = {spec.page_size} - {0}
    if flashmla and spec.plain and spec.page_size in (0, FLASHMLA_PAGE):
        page_sizes.add(FLASHMLA_PAGE)
    paged = 0
    for page in page_sizes:
        pages = cache_pages(prefix_lens, spec.draft_len, page)
        most = -(-(max(prefix_lens) + spec.draft_len) // page)
        paged += rotations * (pages * page * Q_DIM * spec.kv_bytes + spec.batch_size * most * 4)
    mask = spec.draft_len * (sum(prefix_lens) + tokens) if spec.mask != "causal" else 0
    return (
        slots * kv_columns(spec.head_dims) * spec.kv_bytes
        + slots * 8  # the slot permutation
        + 2 * rotations * per_set * 4  # our indices + FlashInfer's
        + paged
        + mask
        + tokens * spec.num_heads * (dqk * ELEM + 5 * dv * 4)  # q, outputs, fp32 reference
    )


def paged_indices_with_drafts(
    prefix_slots: torch.Tensor,
    draft_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    draft_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Page lists in which request b's prefix pages are followed by its L
    draft pages: (indptr [bs+1], indices [sum(prefix) + bs*L]), int32."""
    device = prefix_slots.device
    lens = prefix_lens.to(device=device, dtype=torch.int64)
    bs = lens.numel()
    total = lens + draft_len
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    kv_indptr[1:] = torch.cumsum(lens, 0)
    fi_indptr = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    fi_indptr[1:] = torch.cumsum(total, 0)
    n = int(fi_indptr[-1])
    req = torch.repeat_interleave(torch.arange(bs, device=device), total)
    local = torch.arange(n, device=device) - fi_indptr[req]
    is_prefix = local < lens[req]
    pre_idx = (kv_indptr[req] + local).clamp(0, max(prefix_slots.numel() - 1, 0))
    draft_idx = (req * draft_len + local - lens[req]).clamp(0, draft_slots.numel() - 1)
    pre = prefix_slots[pre_idx] if prefix_slots.numel() else draft_slots[draft_idx]
    indices = torch.where(is_prefix, pre, draft_slots[draft_idx])
    return fi_indptr.to(torch.int32), indices.to(torch.int32)


def paged_kv_with_drafts(
    k_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    k_extend: torch.Tensor,
    draft_len: int,
    *,
    page_size: int = FLASHMLA_PAGE,
    scatter: torch.Generator | None = None,
    chunk_rows: int = 1 << 18,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same K values in FlashMLA's dense-decode layout.

    Request b's sequence is its prefix rows ``k_buffer[kv_indices[kv_indptr[b]:
    kv_indptr[b+1]]]`` followed by its L drafts' K ``k_extend[b*L:(b+1)*L]``,
    cut into pages of ``page_size`` tokens; the drafts are the sequence's last
    L positions, so a bottom-right causal mask is the verify mask. Returns
    ``kv_cache`` [pages, page_size, 1, 576] (rows past a sequence's end are
    NaN, so reading them shows), ``block_table`` [bs, most pages a request]
    int32 (unused entries 0) and ``cache_seqlens`` [bs] int32 = prefix + L.
    With ``scatter``, pages lie in a random order of the cache, as in a real
    pool; without it, in request order. bf16/fp16 caches.
    """
    if k_buffer.element_size() != 2:
        raise ValueError(f"k_buffer: expected a bf16 or fp16 cache, got {k_buffer.dtype}")
    device = k_buffer.device
    indptr = kv_indptr.to(device=device, dtype=torch.int64)
    lens = indptr[1:] - indptr[:-1]
    bs = lens.numel()
    seqlens = lens + draft_len
    pages = (seqlens + page_size - 1) // page_size
    first_page = torch.zeros(bs + 1, dtype=torch.int64, device=device)
    first_page[1:] = torch.cumsum(pages, 0)
    total_pages, most_pages = int(first_page[-1]), int(pages.max())
    if scatter is None:
        order = torch.arange(total_pages, device=device)
    else:
        order = torch.randperm(total_pages, generator=scatter, device=device)

    j = torch.arange(most_pages, device=device)
    logical = (first_page[:-1, None] + j).clamp(max=total_pages - 1)
    block_table = torch.where(j < pages[:, None], order[logical], 0).to(torch.int32)

    kv_cache = torch.full(
        (total_pages, page_size, 1, Q_DIM), float("nan"), dtype=k_buffer.dtype, device=device
    )
    rows = kv_cache.view(total_pages * page_size, Q_DIM)

    def row_of(req: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return order[first_page[req] + pos // page_size] * page_size + pos % page_size

    # The prefixes, in chunks: a real-size prefix is GBs.
    prefix_req = torch.repeat_interleave(torch.arange(bs, device=device), lens)
    indices = kv_indices.to(device=device, dtype=torch.int64)
    for start in range(0, indices.numel(), chunk_rows):
        req = prefix_req[start : start + chunk_rows]
        token = torch.arange(start, start + req.numel(), device=device)
        rows[row_of(req, token - indptr[req])] = k_buffer[indices[token], 0]
    # The drafts: request b's draft i at position prefix_b + i.
    draft = torch.arange(bs * draft_len, device=device)
    req = draft // draft_len
    rows[row_of(req, lens[req] + draft % draft_len)] = k_extend[draft, 0].to(k_buffer.dtype)
    return kv_cache, block_table, seqlens.to(torch.int32)


def kv_pool(
    slots: int, width: int, kv_dtype: torch.dtype, device: torch.device, seed: int
) -> torch.Tensor:
    """A random [slots, 1, width] pool: ``make_pool``'s for MLA's 576, the
    same values' law in a pool of the model's own width otherwise (256/256
    and 128/128: K's, and V's of its own)."""
    if width == Q_DIM:
        return make_pool(slots, kv_dtype, device, seed=seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    pool = torch.empty(slots, 1, width, dtype=kv_dtype, device=device)
    for start in range(0, slots, 1 << 18):
        chunk = pool[start : start + (1 << 18)]
        chunk.copy_((torch.rand(chunk.shape, generator=gen, device=device) * 4 - 2).to(kv_dtype))
    return pool


def build_batch(
    spec: ShapeSpec,
    prefix_lens: list[int],
    *,
    rotations: int,
    slots: int,
    device: torch.device,
    seed: int,
    counts: Sequence[int] | None = None,
) -> Batch:
    """Random non-zero data (``mla_verify.testing``) in one pool: each
    rotation set's prefixes and drafts at slots of one random permutation,
    disjoint between sets. v_extend holds k_extend's first Dv columns in a
    tensor of its own (as SGLang passes it) and V is a view of the pool's K
    (MLA), so every contender reads the same values; 256/256 and 128/128
    take V from a pool of its own at the same slots, as SGLang passes it.
    Plain shapes: the drafts' slots hold k_extend, for FlashInfer. Tree shapes: one SGLang tree mask
    (``make_batch(mask="tree")``, every prefix bit set), shared by the sets.
    Paged shapes: each set also copied into a cache of ``spec.page_size``
    pages, prefix then drafts, pages scattered. ``counts``: the requests'
    draft counts instead of the shape's (``draft_counts``)."""
    bs, L = spec.batch_size, spec.draft_len
    if counts is None and spec.ragged:
        counts = draft_counts(spec)
    prefix = sum(prefix_lens)
    per_set = prefix + bs * L
    kv_dtype = KV_CACHE_DTYPES[spec.kv_dtype].torch_dtype
    pool = kv_pool(slots, spec.head_dims[0], kv_dtype, device, seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)
    perm = torch.randperm(slots, generator=gen, device=device)[: rotations * per_set]
    perm = perm.view(rotations, per_set)
    first = make_batch(
        spec.num_heads,
        L,
        prefix_lens,
        dtype=ACT_DTYPE,
        kv_dtype=kv_dtype,
        device=device,
        pool=pool,
        v_extend_from_k=True,
        seed=seed + 2,
        kv_slots=perm[0, :prefix],
        head_dims=spec.head_dims,
        draft_counts=None if counts is None else list(counts),
        mask=None if spec.mask == "causal" else "tree",
        skip_prefix_custom_mask=spec.mask != "treefull",
    )
    first = dataclasses.replace(first, v_extend=first.v_extend.contiguous())
    if not spec.mla:
        v_pool = kv_pool(slots, spec.head_dims[1], kv_dtype, device, seed + 4)
        first = dataclasses.replace(first, v_buffer=v_pool)
    lens = torch.tensor(prefix_lens, dtype=torch.int64, device=device)
    sets = [
        dataclasses.replace(first, kv_indices=perm[r, :prefix].to(torch.int32))
        for r in range(rotations)
    ]
    batch = Batch(spec, list(prefix_lens), sets, None, [], None)
    if spec.plain and not spec.page_size:
        for r in range(rotations):
            draft_slots = perm[r, prefix:]
            pool[draft_slots] = first.k_extend.to(kv_dtype)  # the drafts, as FlashInfer sees them
            batch.fi_kv_indptr, fi_idx = paged_indices_with_drafts(
                perm[r, :prefix], draft_slots, lens, L
            )
            batch.fi_kv_indices.append(fi_idx)
        batch.fi_kv_lens = (lens + L).to(torch.int32)
    if spec.page_size:
        scatter = torch.Generator(device=device)
        scatter.manual_seed(seed + 3)
        batch.paged = [
            paged_kv_with_drafts(
                vb.k_buffer,
                vb.kv_indptr,
                vb.kv_indices,
                vb.k_extend,
                L,
                page_size=spec.page_size,
                scatter=scatter,
            )
            for vb in sets
        ]
    return batch


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


# --- contenders -------------------------------------------------------------------------


@dataclass
class Contender:
    """``launches[r]`` computes rotation set r; ``launches[0]`` is checked
    against the reference. ``out`` is the buffer every launch writes
    (poisoned before the check); a contender that allocates its output per
    call has none and gives ``result``, its latest output."""

    name: str
    launches: list[Callable[[], None]]
    out: torch.Tensor | None
    graphable: bool = True
    config: Any = None  # VerifyConfig for the package's kernels
    config_source: str = ""
    result: Callable[[], torch.Tensor] | None = None

    def output(self) -> torch.Tensor:
        """[bs*L, H, 512]: what the latest launch wrote."""
        return self.out if self.out is not None else self.result()


def _kernel_launches(
    batch: Batch,
    out: torch.Tensor,
    config: Any,
    fwd: Callable[..., bool] = mla_verify.verify_mla_fwd,
) -> list[Callable[[], None]]:
    def make(vb: VerifyBatch) -> Callable[[], None]:
        def launch() -> None:
            if not vb.run(out, config, fwd=fwd):
                raise RuntimeError(f"{fwd.__name__} refused the call (its gate said no)")

        return launch

    return [make(vb) for vb in batch.sets]


def triton_config(config: VerifyConfig) -> VerifyConfig:
    """``config``'s tile on the portable Triton kernel (a Hopper config's
    fields are its Triton fallback's tile too)."""
    return dataclasses.replace(config, kernel="triton", MIN_SHARE=None)


def _planned_kernel(vb: VerifyBatch, config: VerifyConfig) -> str:
    """The stage-1 kernel the package runs for this call with ``config``:
    a Hopper config runs the Triton kernel on calls the Hopper kernel does
    not take (ragged drafts, custom masks, other head dims, off sm90)."""
    plan = plan_call(
        vb.q,
        vb.k_extend,
        vb.v_extend,
        vb.k_buffer,
        vb.v_buffer,
        batch_size=vb.batch_size,
        draft_len=vb.draft_len,
        config=config,
        masked=vb.custom_mask is not None,
        skip_prefix_mask=vb.skip_prefix_custom_mask,
    )
    return config.kernel if plan.hopper or config.kernel not in HOPPER_KERNELS else "triton"


def _source(source: str, vb: VerifyBatch, config: VerifyConfig) -> str:
    kernel = _planned_kernel(vb, config)
    return source if kernel == config.kernel else f"{source}; runs on the {kernel} kernel"


def kernel_contender(name: str, batch: Batch, arch: str) -> Contender:
    """tuned (the table's config), default (the built-in one), triton (the
    portable kernel's config, ``block_config(..., kernel="triton")``) or mha
    (BLOCK_H=1)."""
    s = batch.spec
    vb = batch.sets[0]
    out = vb.new_output()
    kv_dtype = kv_dtype_name(batch.k_buffer.dtype)
    default = mla_verify.default_config(
        s.num_heads, s.draft_len, s.batch_size, arch, kv_dtype, head_dims=s.head_dims
    )
    if name in ("tuned", "triton"):
        # triton: the portable kernel's best config for the arch (its tuned
        # winner, else the built-in default), what an AMD GPU runs.
        config, source = mla_verify.resolve_config(
            s.num_heads,
            s.draft_len,
            s.batch_size,
            batch.k_buffer.dtype,
            arch,
            kernel="triton" if name == "triton" else None,
            head_dims=s.head_dims,
        )
        if name == "tuned":
            # Launched through the table (config=None), exactly as an engine does.
            launches = _kernel_launches(batch, out, None)
            return Contender(name, launches, out, True, config, _source(source, vb, config))
        launches = _kernel_launches(batch, out, config)
        return Contender(name, launches, out, True, config, source)
    if name == "default":
        launches = _kernel_launches(batch, out, default)
        return Contender(name, launches, out, True, default, _source("default_config", vb, default))
    if name == "mha":
        splits = default_num_kv_splits(
            s.num_heads, s.batch_size, 1, rows_per_program(1, s.draft_len), arch
        )
        # Always the Triton kernel: the Hopper one holds 64 rows by design.
        config = dataclasses.replace(
            triton_config(default), BLOCK_H=1, num_warps=4, NUM_KV_SPLITS=splits
        )
        launches = _kernel_launches(batch, out, config)
        return Contender(name, launches, out, True, config, "default_config, BLOCK_H=1")
    raise ValueError(f"unknown kernel contender {name!r}")


REV_PREFIX = "rev:"
# rev:<git rev>:triton: that revision's portable Triton kernel with its own
# block_config(..., kernel="triton"), as the ``triton`` contender is.
REV_TRITON_SUFFIX = ":triton"


def _rev_name(commit: str, kernel: str | None = None) -> str:
    """A revision contender's name: its commit (or directory name), so that
    rows keep their meaning after branches move; ``:triton`` for its
    portable kernel."""
    return f"{REV_PREFIX}{commit[:12]}" + (REV_TRITON_SUFFIX if kernel == "triton" else "")


@dataclass(frozen=True)
class Revision:
    """The package as it was at ``commit`` (its sha, or the name of the
    directory it was exported to), imported beside the working tree's as
    ``module``; ``given``: the rev as the command line named it."""

    given: str
    commit: str
    module: types.ModuleType
    kernel: str | None = None  # "triton": its portable kernel, not ``tuned``

    @property
    def name(self) -> str:
        return _rev_name(self.commit, self.kernel)


_revisions: dict[str, Revision] = {}  # contender name -> its revision, imported once

# What the package names absolutely (its imports are relative), rewritten
# to a revision's own package name: its torch.library namespace
# (registered process-wide in ops.py, called by name in paged.py: a second
# registration of a name fails) and the package of its shipped tables
# (tables.py: else the working tree's tables would fill its gaps).
_ABSOLUTE_NAMES = re.compile(r"\bmla_verify(?=::|\.configs\b)|(?<=torch\.ops\.)mla_verify\b")


def _git(*args: str) -> subprocess.CompletedProcess:
    """git in this script's repository, output as bytes."""
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, timeout=60)


def resolve_commit(rev: str) -> str:
    """The full sha of the commit ``rev`` names in the repository of this
    script; ValueError if none (or no git history here)."""
    try:
        result = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"not a commit of {REPO_ROOT} ({exc})") from None
    if result.returncode != 0:
        why = " ".join(result.stderr.decode(errors="replace").split())
        raise ValueError(f"not a commit of {REPO_ROOT}" + (f" ({why})" if why else ""))
    return result.stdout.decode().strip()


@functools.cache
def _export_root() -> Path:
    """The temporary directory of this process's exports, removed at exit."""
    root = Path(tempfile.mkdtemp(prefix="mla_verify_revs_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def _export(commit: str) -> Path:
    """``mla_verify/`` and (where it has one) ``configs/`` of ``commit`` in a
    fresh directory, the package renamed to ``mla_verify_rev_<sha>`` and
    its absolute names rewritten to that; returns the package directory."""
    dest = Path(tempfile.mkdtemp(prefix=f"{commit[:12]}_", dir=_export_root()))
    has_configs = _git("cat-file", "-e", f"{commit}:configs").returncode == 0
    archive = _git("archive", commit, "mla_verify", *(["configs"] if has_configs else []))
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {commit}: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return _as_package(dest, commit[:12])


def _copy(source: Path, label: str) -> Path:
    """``_export`` of a directory holding ``mla_verify/`` (and ``configs/``):
    a revision exported beforehand, where the checkout has no git history
    (the lent GPU machines get a copy of the working tree without it)."""
    dest = Path(tempfile.mkdtemp(prefix=f"{label}_", dir=_export_root()))
    for part in ("mla_verify", "configs"):
        if (source / part).is_dir():
            shutil.copytree(
                source / part, dest / part, ignore=shutil.ignore_patterns("__pycache__")
            )
    return _as_package(dest, label)


def _as_package(dest: Path, label: str) -> Path:
    """``dest/mla_verify`` renamed to ``mla_verify_rev_<label>``, its absolute
    names rewritten to that; returns the package directory."""
    package = dest / f"mla_verify_rev_{label}"
    (dest / "mla_verify").rename(package)
    for path in package.rglob("*.py"):
        path.write_text(_ABSOLUTE_NAMES.sub(package.name, path.read_text()))
    return package


def load_revision(rev: str) -> Revision:
    """The package at ``rev`` (a git rev, or a directory holding the
    ``mla_verify/`` and ``configs/`` of one, e.g. from ``git archive``),
    exported and imported under its own name, once per commit (directory).
    Tables load at import: the revision's are its own shipped ones,
    $MLA_VERIFY_CONFIG_DIR pointing at its ``configs/`` while it imports
    (the user dir still below them, as for ``tuned``)."""
    source = Path(rev)
    if (source / "mla_verify").is_dir():
        commit = re.sub(r"\W", "_", source.resolve().name)
        export = functools.partial(_copy, source, commit)
    else:
        commit = resolve_commit(rev)
        export = functools.partial(_export, commit)
    name = _rev_name(commit)
    if name not in _revisions:
        package = export()
        configs = package.parent / "configs"
        previous = os.environ.get(CONFIG_DIR_VAR)
        os.environ[CONFIG_DIR_VAR] = str(configs) if configs.is_dir() else ""
        sys.path.insert(0, str(package.parent))
        try:
            module = importlib.import_module(package.name)
        finally:
            sys.path.remove(str(package.parent))
            if previous is None:
                del os.environ[CONFIG_DIR_VAR]
            else:
                os.environ[CONFIG_DIR_VAR] = previous
        _revisions[name] = Revision(rev, commit, module)
    return _revisions[name]


def rev_contender(rev: Revision, batch: Batch, arch: str) -> Contender:
    """``tuned`` of another revision: its own ``verify_mla_fwd`` through its
    own tables (config=None, as an engine calls it) on the same rotation
    sets; the config its own ``resolve_config`` names. With ``kernel``
    "triton": its portable kernel with its own ``resolve_config(...,
    kernel="triton")``, as the ``triton`` contender."""
    s = batch.spec
    package = rev.module
    if s.page_size:
        return paged_contender(batch, arch, package, rev.name, f"rev:{rev.given}")
    kv_dtype = batch.k_buffer.dtype
    config, source = package.resolve_config(
        s.num_heads,
        s.draft_len,
        s.batch_size,
        kv_dtype,
        arch,
        head_dims=s.head_dims,
        **({"kernel": "triton"} if rev.kernel else {}),
    )
    if batch.q.device.type == "cuda":  # its own workspace, before capture
        package.prepare_workspace(
            s.batch_size,
            s.num_heads,
            s.draft_len,
            kv_dtype,
            device=batch.q.device,
            head_dims=s.head_dims,
        )
    out = batch.sets[0].new_output()
    launches = _kernel_launches(batch, out, config if rev.kernel else None, package.verify_mla_fwd)
    return Contender(rev.name, launches, out, True, config, f"{source}; rev:{rev.given}")


def paged_contender(
    batch: Batch,
    arch: str,
    package=mla_verify,
    name: str = "paged",
    given: str = "",
    seesaw: bool | None = None,
) -> Contender:
    """``verify_mla_paged`` (this package's, or a revision's for ``rev:``
    contenders) on each rotation set's paged cache (``batch.paged``: the
    token-indexed contenders' values, drafts as each sequence's last L
    positions); the tables' config, as ``tuned``. ``seesaw``: None, the
    package's rule (``paged.seesaw_shape``); True, the seesaw kernel at
    every batch size where it can serve the call; False, never (the
    translated call). The rule is set while each launch is captured."""
    s = batch.spec
    bs, L, H = s.batch_size, s.draft_len, s.num_heads
    q = batch.q.view(bs, L, H, Q_DIM)
    out = batch.sets[0].new_output()  # [bs*L, H, 512]
    out4 = out.view(bs, L, H, V_DIM)
    config, source = package.resolve_config(H, L, bs, batch.k_buffer.dtype, arch)

    def make(kv_cache: torch.Tensor, block_table: torch.Tensor, seqlens: torch.Tensor):
        def launch() -> None:
            package.verify_mla_paged(
                q, kv_cache, block_table, seqlens, sm_scale=batch.sm_scale, out=out4
            )

        def launch_ruled() -> None:
            paged = mla_verify.paged
            rule = paged.SEESAW_MAX_BATCH, paged.SEESAW_MIN_ROWS
            paged.SEESAW_MAX_BATCH, paged.SEESAW_MIN_ROWS = (
                (bs, rule[1]) if seesaw else (0, sys.maxsize)
            )
            try:
                launch()
            finally:
                paged.SEESAW_MAX_BATCH, paged.SEESAW_MIN_ROWS = rule

        return launch if seesaw is None else launch_ruled

    return Contender(
        name,
        [make(*cache) for cache in batch.paged],
        out,
        True,
        config,
        "; ".join(filter(None, (source, f"verify_mla_paged, {s.page_size}-token pages", given))),
    )


def torch_ref_contender(batch: Batch) -> Contender:
    vb = batch.sets[0]
    out = torch.empty(
        vb.q.shape[0], vb.num_heads, vb.v_buffer.shape[-1], dtype=torch.float32, device=vb.q.device
    )

    def launch() -> None:
        out.copy_(vb.reference())

    return Contender("torch_ref", [launch], out, graphable=False, config_source="reference")


class FlashInfer:
    """FlashInfer's MLA wrapper (fa3), if importable; ``reason`` says why not."""

    def __init__(self, enabled: bool, device: torch.device | None) -> None:
        self.module: Any = None
        self.version = "n/a"
        self.reason = ""
        self._workspace: torch.Tensor | None = None
        if not enabled:
            self.reason = "disabled by --no-flashinfer"
            return
        try:
            import flashinfer
            import flashinfer.mla
        except Exception as exc:  # any import failure means: skip it
            self.reason = f"import flashinfer failed: {type(exc).__name__}: {exc}"
            return
        self.version = getattr(flashinfer, "__version__", "unknown")
        if device is not None and device.type == "cuda" and not torch.version.hip:
            major, minor = torch.cuda.get_device_capability(device)
            if (major, minor) != (9, 0):
                self.reason = f"the fa3 backend needs sm90; this GPU is sm{major}{minor}"
                return
        self.module = flashinfer

    @property
    def available(self) -> bool:
        return self.module is not None and not self.reason

    def disable(self, reason: str) -> None:
        self.reason = reason

    def contender(self, batch: Batch) -> Contender:
        """One planned wrapper per rotation set (planning is outside timing);
        the drafts are the last L pages of each request, so FlashInfer's
        causal mask (aligned to the end of the KV) is the verify mask."""
        s = batch.spec
        device = batch.q.device
        if self._workspace is None or self._workspace.device != device:
            self._workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)
        q_nope = batch.q[..., :V_DIM]
        q_pe = batch.q[..., V_DIM:]
        ckv = batch.k_buffer[..., :V_DIM]  # [slots, 1, 512], page size 1
        kpe = batch.k_buffer[..., V_DIM:]  # [slots, 1, 64]
        out = torch.empty(
            s.batch_size * s.draft_len, s.num_heads, V_DIM, dtype=ACT_DTYPE, device=device
        )
        wrappers = []
        for fi_indices in batch.fi_kv_indices:
            wrapper = self.module.mla.BatchMLAPagedAttentionWrapper(self._workspace, backend="fa3")
            wrapper.plan(
                batch.qo_indptr,
                batch.fi_kv_indptr,
                fi_indices,
                batch.fi_kv_lens,
                num_heads=s.num_heads,
                head_dim_ckv=V_DIM,
                head_dim_kpe=ROPE_DIM,
                page_size=1,
                causal=True,
                sm_scale=batch.sm_scale,
                q_data_type=batch.q.dtype,
                kv_data_type=batch.k_buffer.dtype,
            )
            wrappers.append(wrapper)

        def make(wrapper: Any) -> Callable[[], None]:
            return lambda: wrapper.run(q_nope, q_pe, ckv, kpe, out=out)

        return Contender(
            "flashinfer",
            [make(w) for w in wrappers],
            out,
            config_source=f"flashinfer {self.version} fa3",
        )


class FlashMLA:
    """FlashMLA's dense decode (``flash_mla_with_kvcache``, SM90), used only
    where ``import flash_mla`` succeeds; ``reason`` says why not. This
    project ships no FlashMLA code: ``scripts/build_flashmla.py`` builds
    the bf16 dense decode in a FlashMLA checkout fetched outside it and
    prints the PYTHONPATH that puts that checkout's ``flash_mla`` here."""

    def __init__(self, enabled: bool) -> None:
        self.module: Any = None
        self.version = "n/a"
        self.reason = ""
        if not enabled:
            self.reason = "not among --contenders"
            return
        try:
            import flash_mla
        except Exception as exc:  # not installed, or built for another GPU
            self.reason = (
                f"import flash_mla failed: {type(exc).__name__}: {exc} "
                "(scripts/build_flashmla.py builds it)"
            )
            return
        self.module = flash_mla
        self.version = getattr(flash_mla, "__version__", "unknown")

    @property
    def available(self) -> bool:
        return self.module is not None

    def contender(self, batch: Batch, seed: int) -> Contender:
        """Each rotation set's KV copied into a 64-token-page cache of its
        own (pages scattered), the drafts' K appended to each sequence: on
        -page64 rows the very caches ``paged`` reads (``batch.paged``);
        scheduling metadata made once per batch, outside the timed call
        (every set has the same lengths). FlashMLA allocates its output
        per call, so it cannot be poisoned before the check."""
        s = batch.spec
        bs, L, H = s.batch_size, s.draft_len, s.num_heads
        q = batch.q.view(bs, L, H, Q_DIM)
        if s.page_size == FLASHMLA_PAGE:
            caches = batch.paged
        else:
            gen = torch.Generator(device=batch.q.device)
            gen.manual_seed(seed)
            caches = [
                paged_kv_with_drafts(
                    vb.k_buffer, vb.kv_indptr, vb.kv_indices, vb.k_extend, L, scatter=gen
                )
                for vb in batch.sets
            ]
        cache_seqlens = caches[0][2]
        # (metadata, splits) in FlashMLA's first interface; (metadata, None)
        # in the later one, which plans on its first call.
        metadata, num_splits = self.module.get_mla_metadata(cache_seqlens, L * H, 1)
        latest: dict[str, torch.Tensor] = {}

        def make(kv_cache: torch.Tensor, block_table: torch.Tensor) -> Callable[[], None]:
            def launch() -> None:
                latest["out"] = self.module.flash_mla_with_kvcache(
                    q,
                    kv_cache,
                    block_table,
                    cache_seqlens,
                    V_DIM,
                    metadata,
                    num_splits,
                    softmax_scale=batch.sm_scale,
                    causal=True,
                )[0]

            return launch

        return Contender(
            "flashmla",
            [make(kv_cache, block_table) for kv_cache, block_table, _ in caches],
            None,
            config_source=f"flash_mla {self.version}, {FLASHMLA_PAGE}-token pages",
            result=lambda: latest["out"].view(bs * L, H, V_DIM),
        )


SGLANG_VERIFY = Path("sglang/kernels/ops/attention/verify_mla.py")
# Pool elements SGLang's kernel can address: it computes slot x row stride
# in int32 (kv_indices' type).
SGLANG_MAX_POOL = 2**31


class SGLangVerify:
    """SGLang's grouped-head verify kernel, the one this package grew from
    (``verify_shared_kv_fwd`` of ``verify_mla.py``: 4 heads a program,
    BLOCK_N 64, 8 warps, 1 stage, ``512 // (batch x head blocks)`` splits
    up to 32), used only where ``--sglang-src`` names an SGLang checkout's
    ``python`` folder. This project ships no SGLang code: the file is read
    from that checkout alone (``load_sglang_verify``), so its version is
    the file's hash."""

    def __init__(self, enabled: bool, src: Path | None = None) -> None:
        self.fwd: Callable[..., bool] | None = None
        self.version = "n/a"
        self.reason = ""
        if not enabled:
            self.reason = "not among --contenders"
            return
        if src is None:
            self.reason = f"--sglang-src not given (a folder holding {SGLANG_VERIFY})"
            return
        path = src / SGLANG_VERIFY
        try:
            self.fwd = load_sglang_verify(path)
        except Exception as exc:  # missing, or not the file this loader knows
            self.reason = f"loading {path} failed: {type(exc).__name__}: {exc}"
            return
        self.version = f"verify_mla.py sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"

    @property
    def available(self) -> bool:
        return self.fwd is not None

    def contender(self, batch: Batch) -> Contender:
        """Called as SGLang's verify launcher calls it, with the arguments
        ``verify_mla_fwd`` gets (it has the same convention)."""
        fwd = self.fwd

        @functools.wraps(fwd)  # its name in a refusal's message
        def sglang_fwd(*args: Any, config: Any = None, **kwargs: Any) -> bool:
            return fwd(*args, **kwargs)

        out = batch.sets[0].new_output()
        launches = _kernel_launches(batch, out, None, fwd=sglang_fwd)
        return Contender("sglang", launches, out, True, None, f"SGLang {self.version}")


def load_sglang_verify(path: Path) -> Callable[..., bool]:
    """``verify_shared_kv_fwd`` of SGLang's ``verify_mla.py`` at ``path``,
    loaded alone. It imports two SGLang names, which are given the values
    SGLang itself gives them on an NVIDIA GPU: ``dot_in_kv_dtype`` True (it
    is False only for fp8 pools on gfx950) and ``_AMD_LAUNCH_KWARGS`` empty
    (set only on ROCm); the rest of SGLang then need not be importable.
    ``sys.modules`` is left as it was."""
    package = "sglang.kernels.ops.attention"
    given = {
        f"{package}.fp8_dot_support": {"dot_in_kv_dtype": lambda kv_dtype, width: True},
        f"{package}.verify_splitkv": {"_AMD_LAUNCH_KWARGS": {}},
    }
    names = ["sglang", "sglang.kernels", "sglang.kernels.ops", package, *given]
    saved = {name: sys.modules.get(name) for name in names}
    try:
        for name in names:
            module = types.ModuleType(name)
            module.__path__ = []  # a package, so that the names below it resolve
            module.__dict__.update(given.get(name, {}))
            sys.modules[name] = module
        spec = importlib.util.spec_from_file_location("mla_verify_bench_sglang_verify", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module.verify_shared_kv_fwd


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


# verify_mla_paged as shipped, with the seesaw kernel forced on, and off.
PAGED_CALLS = {"paged": None, "paged_seesaw": True, "paged_translated": False}
PAGED_CONTENDERS = (*PAGED_CALLS, "tuned", "flashmla")


# The contenders timed on bf16 KV alone (their builds or their gates).
BF16_ONLY = {"flashinfer": "FlashInfer", "flashmla": "FlashMLA", "sglang": "SGLang's kernel"}


def not_applicable(name: str, spec: ShapeSpec) -> str | None:
    """Why contender ``name`` does not run on ``spec``'s kind of call, or
    None. FlashInfer and FlashMLA compute plain shapes only (MLA 576/512,
    every request L causal drafts); -page rows compare the paged entry
    point with the token-indexed one on the same values, and FlashMLA at
    page 64; tree, ragged and head-dim rows the package's kernels and the
    reference, head-dim rows SGLang's kernel too (every request L causal
    drafts). A ``rev:`` contender runs where ``tuned`` does."""
    if name.startswith(REV_PREFIX):
        name = "tuned"
    kind = ", ".join(
        what
        for what, on in (
            (f"head dims {spec.head_dims[0]}/{spec.head_dims[1]}", not spec.mla),
            ("ragged drafts", spec.ragged),
            (f"{spec.mask} mask", spec.mask != "causal"),
        )
        if on
    )
    if spec.kv_dtype != "bf16" and name in BF16_ONLY:
        return f"this benchmark times {BF16_ONLY[name]} on bf16 KV only"
    if spec.page_size:
        if name not in PAGED_CONTENDERS:
            return f"-page rows time {', '.join(PAGED_CONTENDERS)}"
        if name == "flashmla" and spec.page_size != FLASHMLA_PAGE:
            return f"FlashMLA's dense decode reads {FLASHMLA_PAGE}-token pages"
        if name == "paged_seesaw" and spec.page_size % 64:
            return "the seesaw kernel reads pages of a multiple of 64 tokens"
        return None
    if name in PAGED_CALLS:
        return "only on -page<N> rows"
    if kind and name in ("flashinfer", "flashmla", "mha"):
        return f"not this call ({kind})"
    if name == "sglang" and (spec.ragged or spec.mask != "causal"):
        # Its gate refuses ragged drafts; it reads no mask (causal only).
        return f"not this call ({kind})"
    return None


def _make_contender(name: str, batch: Batch, ctx: RunContext) -> Contender | str:
    """The contender, or why it is skipped."""
    reason = not_applicable(name, batch.spec)
    if reason is not None:
        return reason
    if name in ("tuned", "default", "triton", "mha"):
        return kernel_contender(name, batch, ctx.arch)
    if name.startswith(REV_PREFIX):
        return rev_contender(_revisions[name], batch, ctx.arch)
    if name in PAGED_CALLS:
        return paged_contender(batch, ctx.arch, name=name, seesaw=PAGED_CALLS[name])
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
            _pct(row["frac_roofline"]),
            row["rel_err"],
            _config_text(row),
        )
    else:
        logger.info("  %-10s %s: %s", row["contender"], row["status"], row["reason"])


# --- output -----------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(fraction: float | None, digits: int = 1) -> str:
    return _fmt(None if fraction is None else 100.0 * fraction, digits)


def _scaled(value: float | None, scale: float, digits: int = 1) -> str:
    return _fmt(None if value is None else value / scale, digits)


def _config_text(row: dict[str, Any]) -> str:
    if row.get("BLOCK_H") is None:
        return ""
    text = "H{BLOCK_H}/N{BLOCK_N}/S{NUM_KV_SPLITS}/w{num_warps}/s{num_stages}".format(**row)
    if row.get("MIN_SHARE") is not None:
        text += f"/f{row['MIN_SHARE']}"
    return text if row.get("kernel", "triton") == "triton" else f"{text}/{row['kernel']}"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _csv_cells(row: dict[str, Any]) -> dict[str, Any]:
    return {k: ("" if row.get(k) is None else row.get(k)) for k in CSV_FIELDS}


def check_csv(path: Path) -> None:
    """Raise ValueError if ``path`` exists with columns other than CSV_FIELDS
    (rows appended to it would not line up)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), [])
    if tuple(header) != CSV_FIELDS:
        raise ValueError(
            f"{path}: its columns are not this benchmark's ({len(header)} vs "
            f"{len(CSV_FIELDS)}; first difference at "
            f"{next((a, b) for a, b in zip([*header, ''], [*CSV_FIELDS, '']) if a != b)}); "
            "pass another --csv"
        )


def append_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Append one line per row to the tidy CSV, with the header if the file is new."""
    check_csv(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(_csv_cells(row) for row in rows)


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """This run alone, in the tidy CSV's columns."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(_csv_cells(row) for row in rows)


def write_json(
    rows: Sequence[dict[str, Any]], meta: dict[str, Any], ceilings: Ceilings, path: Path
) -> None:
    data = {
        "meta": meta,
        "ceilings": {k: _json_safe(v) for k, v in ceilings.details.items()},
        "rows": [{k: _json_safe(row.get(k)) for k in CSV_FIELDS} for row in rows],
    }
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def _by_shape(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    shapes: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        shapes.setdefault(row["shape"], {})[row["contender"]] = row
    return shapes


def compared(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The contenders set against tuned: the fixed ones, then each rev:
    contender of ``rows``."""
    revs = dict.fromkeys(r["contender"] for r in rows if r["contender"].startswith(REV_PREFIX))
    return [c for c in CONTENDERS if c != "tuned"] + list(revs)


def tuned_geomeans(rows: Sequence[dict[str, Any]]) -> dict[str, tuple[float | None, int]]:
    """Per contender: geomean of t_contender / t_tuned over shapes where both
    are ok (> 1: tuned faster), and the number of shapes."""
    out = {}
    for name in compared(rows):
        ratios = [
            c[name]["tuned_speedup"]
            for c in _by_shape(rows).values()
            if name in c and c[name]["status"] == "ok" and c[name].get("tuned_speedup")
        ]
        out[name] = (geomean(ratios), len(ratios))
    return out


def describe_call(spec: ShapeSpec) -> str:
    """The kind of call a shape times, in words."""
    dqk, dv = spec.head_dims
    parts = ["absorbed MLA 576/512" if spec.mla else f"head dims {dqk}/{dv}, V a cache of its own"]
    if spec.ragged:
        counts = draft_counts(spec)
        parts.append(f"ragged drafts 1..{spec.draft_len} ({sum(counts)} in all)")
    else:
        parts.append(f"{spec.draft_len} drafts a request")
    parts.append(
        {
            "causal": "causal",
            "tree": "tree mask, prefix visible (skip_prefix_custom_mask=True)",
            "treefull": "tree mask, every prefix bit read (skip_prefix_custom_mask=False)",
        }[spec.mask]
    )
    if spec.page_size:
        parts.append(f"paged cache, {spec.page_size}-token pages")
    parts.append(f"{spec.kv_dtype} KV")
    return ", ".join(parts)


def paged_vs_flashmla(rows: Sequence[dict[str, Any]]) -> list[tuple[str, float]]:
    """(shape, t_flashmla / t_paged) on every -page64 shape where both are
    ok (> 1: the package's paged call is faster; issue 26's target)."""
    out = []
    for shape, c in _by_shape(rows).items():
        paged, flashmla = c.get("paged"), c.get("flashmla")
        if paged and flashmla and paged["status"] == flashmla["status"] == "ok":
            out.append((shape, flashmla["median_us"] / paged["median_us"]))
    return out


def kind_vs_plain(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, float]]:
    """(shape, plain shape, its tuned % roofline over the plain row's) for
    every tree or ragged shape whose plain row ran (the plain shape's own
    row, or the tuned row of one of its -page rows: the same call on the
    same values); 1 means as efficient (issue 25: within 10%)."""
    tuned = {
        shape: c["tuned"]
        for shape, c in _by_shape(rows).items()
        if "tuned" in c and c["tuned"]["status"] == "ok" and c["tuned"]["frac_roofline"]
    }
    plain: dict[str, dict[str, Any]] = {}
    for shape, row in tuned.items():
        spec = parse_shape(shape)
        if spec.plain:
            plain.setdefault(_plain_name(spec), row)
    out = []
    for shape, row in tuned.items():
        spec = parse_shape(shape)
        base = plain.get(_plain_name(spec))
        if spec.mla and not spec.plain and base is not None:
            ratio = row["frac_roofline"] / base["frac_roofline"]
            out.append((shape, base["shape"], ratio))
    return out


def summary_markdown(
    rows: Sequence[dict[str, Any]], meta: dict[str, Any], ceilings: Ceilings
) -> str:
    lines = [
        "# mla_verify benchmark",
        "",
        f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, "
        f"CUDA {meta['cuda']}, flashinfer {meta['flashinfer']}, flash_mla {meta['flash_mla']}, "
        f"commit {meta['git_commit']}, {meta['date_utc']}",
        "",
        "Ceilings measured in this run: copy bandwidth "
        f"{_scaled(ceilings.copy_bw, 1e12, 2)} TB/s (best SM copy in a "
        "CUDA graph, read + write), bf16 matmul "
        f"{_scaled(ceilings.matmul_rate, 1e12, 0)} TFLOP/s "
        "(8192^3 torch.mm). Details: "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in ceilings.details.items()),
        "",
        "Times are microseconds per launch (median, p20-p80 over CUDA-graph replays; "
        "`eager` rows are per-call event timings). % roofline = max(bytes / copy BW, "
        "FLOPs / matmul rate) / time. t/t_tuned > 1 means tuned is faster.",
        "",
        "## Overview",
        "",
        "```",
        stdout_table(rows, ceilings),
        "```",
        "",
        "## Geomean of t_contender / t_tuned",
        "",
        "| contender | geomean t/t_tuned | shapes |",
        "|---|---|---|",
    ]
    for name, (gm, n) in tuned_geomeans(rows).items():
        lines.append(f"| {name} | {_fmt(gm, 3)} | {n} |")
    pairs = paged_vs_flashmla(rows)
    if pairs:
        lines += [
            "",
            "## Paged: t_flashmla / t_paged on the same pages",
            "",
            f"Geomean {_fmt(geomean([r for _, r in pairs]), 3)}, "
            f"lowest {_fmt(min(r for _, r in pairs), 3)} (> 1: verify_mla_paged is faster).",
            "",
            "| shape | t_flashmla / t_paged |",
            "|---|---|",
        ]
        lines += [f"| {shape} | {_fmt(ratio, 3)} |" for shape, ratio in pairs]
    kinds = kind_vs_plain(rows)
    if kinds:
        lines += [
            "",
            "## Tree and ragged rows: tuned % roofline over the plain row's",
            "",
            "| shape | plain row | ratio |",
            "|---|---|---|",
        ]
        lines += [f"| {shape} | {base} | {_fmt(ratio, 3)} |" for shape, base, ratio in kinds]
    for shape, contenders in _by_shape(rows).items():
        any_row = next(iter(contenders.values()))
        lines += [
            "",
            f"## {shape}",
            "",
            f"H={any_row['num_heads']} L={any_row['draft_len']} bs={any_row['batch_size']}, "
            f"{any_row['ctx_kind']} prefixes: {any_row['prefix_tokens']} tokens "
            f"(min {any_row['prefix_min']}, max {any_row['prefix_max']}); "
            f"{_fmt(any_row['bytes'] / 1e6, 1)} MB, {_fmt(any_row['flops'] / 1e12, 3)} TFLOP; "
            f"{describe_call(parse_shape(shape))}",
            "",
            "| contender | status | median us | p20-p80 us | % copy BW | TFLOP/s | % roofline "
            "| t/t_tuned | rel err | config |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in contenders.items():
            if r["status"] == "ok":
                lines.append(
                    f"| {name} | ok ({r['timing']}) | {_fmt(r['median_us'], 1)} "
                    f"| {_fmt(r['p20_us'], 1)}-{_fmt(r['p80_us'], 1)} "
                    f"| {_pct(r['frac_copy_bw'])} | {_scaled(r['flop_per_s'], 1e12)} "
                    f"| {_pct(r['frac_roofline'])} | {_fmt(r['tuned_speedup'], 3)} "
                    f"| {_fmt(r['rel_err'], 5)} | {_config_text(r) or r['config_source'] or ''} |"
                )
            else:
                reason = str(r["reason"]).replace("|", "/").replace("\n", " ")[:200]
                lines.append(
                    f"| {name} | {r['status']} | - | - | - | - | - | - "
                    f"| {_fmt(r['rel_err'], 5)} | {reason} |"
                )
    return "\n".join(lines) + "\n"


def stdout_table(rows: Sequence[dict[str, Any]], ceilings: Ceilings) -> str:
    """The short table printed last: tuned time and roofline share, and how
    many times slower each other contender is."""
    others = {c: max(13, len(c) + 3) for c in compared(rows)}  # name -> column width
    width = max([26] + [len(shape) + 2 for shape in _by_shape(rows)])
    header = f"{'shape':<{width}}{'tuned us':>10}{'%roof':>7}{'%BW':>7}" + "".join(
        f"{c + '/t':>{w}}" for c, w in others.items()
    )
    lines = [header, "-" * len(header)]
    for shape, contenders in _by_shape(rows).items():
        t = contenders.get("tuned")
        ok = t is not None and t["status"] == "ok"
        cells = [
            f"{shape:<{width}}",
            f"{_fmt(t['median_us'], 1) if ok else (t['status'] if t else '-'):>10}",
            f"{_pct(t['frac_roofline']) if ok else '-':>7}",
            f"{_pct(t['frac_copy_bw']) if ok else '-':>7}",
        ]
        for c, w in others.items():
            r = contenders.get(c)
            if r is None:
                text = "-"
            elif r["status"] == "ok":
                text = _fmt(r["tuned_speedup"], 2) if r["tuned_speedup"] else "ok"
            else:
                text = r["status"]
            cells.append(f"{text:>{w}}")
        lines.append("".join(cells))
    lines.append("")
    lines.append(
        "x/t = t_x / t_tuned (> 1: tuned is faster). Geomeans: "
        + ", ".join(
            f"{name} {_fmt(gm, 3)} ({n} shapes)" for name, (gm, n) in tuned_geomeans(rows).items()
        )
    )
    pairs = paged_vs_flashmla(rows)
    if pairs:
        lines.append(
            f"paged vs FlashMLA (page 64, same pages): t_flashmla / t_paged geomean "
            f"{_fmt(geomean([r for _, r in pairs]), 3)}, lowest "
            f"{_fmt(min(r for _, r in pairs), 3)} ({len(pairs)} shapes)"
        )
    lines.append(
        f"ceilings: copy {_scaled(ceilings.copy_bw, 1e12, 2)} TB/s, "
        f"matmul {_scaled(ceilings.matmul_rate, 1e12, 0)} TFLOP/s"
    )
    return "\n".join(lines)


def write_outputs(
    rows: Sequence[dict[str, Any]],
    meta: dict[str, Any],
    ceilings: Ceilings,
    out_dir: Path,
    *,
    plot: bool,
) -> None:
    """This run's own files under ``out_dir``."""
    write_csv(rows, out_dir / "results.csv")
    write_json(rows, meta, ceilings, out_dir / "results.json")
    (out_dir / "summary.md").write_text(summary_markdown(rows, meta, ceilings), encoding="utf-8")
    if plot:
        try:
            # The module beside this script (run as a script, scripts/ is on the path).
            from bench_plot import plot_roofline
        except ImportError as exc:
            logger.info("no plot: %s", exc)
            return
        title = f"{meta['device']}, commit {meta['git_commit']}, {meta['date_utc']}"
        try:
            for path in plot_roofline(rows, out_dir, title=title, contenders=PLOT_CONTENDERS):
                logger.info("wrote %s", path)
        except Exception:  # a broken plot must not cost the tables
            logger.exception("plotting failed")


# --- main -------------------------------------------------------------------------------


def git_commit() -> str:
    """The checkout's commit; ``MLA_VERIFY_COMMIT`` names it where the tree
    was copied without its history (as on a lent GPU machine)."""
    if os.environ.get("MLA_VERIFY_COMMIT"):
        return os.environ["MLA_VERIFY_COMMIT"]
    try:
        result = _git("rev-parse", "--short", "HEAD")
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
        rev, kernel = text.removeprefix(REV_PREFIX), None
        if rev.endswith(REV_TRITON_SUFFIX):
            rev, kernel = rev.removesuffix(REV_TRITON_SUFFIX), "triton"
        try:
            revision = load_revision(rev)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text}: {exc}") from None
        if kernel is not None:
            revision = dataclasses.replace(revision, kernel=kernel)
            _revisions[revision.name] = revision
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
        help=f"the {len(EXTRA_SHAPES)}-shape set of tree, ragged, 256/256 and paged rows "
        "(about 4 minutes at --rep-ms 10 --rounds 2, most of it first compiles)",
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
        "git history); rev:<rev>:triton: that revision's portable kernel, as triton. "
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
        if name in _revisions:
            rev = _revisions[name]
            logger.info("%s: rev %s, imported as %s", name, rev.given, rev.module.__name__)

    ceilings = measure_ceilings(device, args.rep_ms, int(args.copy_mb * 2**20))
    logger.info("ceilings: %s", ", ".join(f"{k} {_fmt(v)}" for k, v in ceilings.details.items()))
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
