"""Runtime config lookup: (arch, heads, draft length, batch size, KV dtype,
head dims) -> ``VerifyConfig`` for one launch.

The tables are loaded once, at import (``tables.load_tables``). After that a
lookup is pure: no file access, no tuning, no GPU sync; results are memoized,
so a launch pays a dict hit. This module never imports the tuner.

Lookup rules
------------
Tables are keyed by arch (``sm90``, ``gfx950``, ...), per-rank head count H,
draft length L, KV dtype and head dims (absorbed MLA's 576/512 unless an
entry names others), with batch-size buckets inside each entry. Entries of
other head dims never stand in for each other. Lookup never fails; it takes
the first rule that applies:

a. Exact entry (arch, H, L, KV dtype, head dims): the bucket nearest to the batch size
   in log2 distance; a tie (e.g. batch 32 between buckets 16 and 64) goes to
   the larger bucket. Its config is used as tuned.
b. No exact entry, but the arch has tuned entries: the nearest one.
   Candidates are the entries of the same KV dtype; if the arch has none of
   that dtype, fp16 and fp8 (e4m3, e4m3fnuz) fall back to the bf16 entries.
   Among candidates the same H is preferred, with the nearest L (ties: the
   larger L); without the same H, the nearest H in log2 distance (ties: the
   larger H), and within it the nearest L. Its nearest batch bucket (rule a)
   is then adapted to the requested shape:
       BLOCK_H' = max(1, min(H, BLOCK_H * L_tuned // L))
   so a program's rows (BLOCK_H x L) stay within the tuned tile (for the
   Hopper kernel, whose tile is always 64 rows: as many heads as fill it), and
       NUM_KV_SPLITS' = clamp(round(NUM_KV_SPLITS * ceil(H_tuned / BLOCK_H)
                                    / ceil(H / BLOCK_H')), 1, 64)
   (halves round up) so the grid keeps about the tuned number of programs.
   BLOCK_N, num_warps, num_stages and the AMD options are kept. Logged once
   per (arch, H, L, dtype) at INFO. A Triton-kernel config carries over only
   where it keeps its rows per program (padded BLOCK_H x L): its warps and
   stages were tuned for that tile. Otherwise rule c.
c. No entry for the arch at all (or no candidate under rule b): the built-in
   ``default_config(H, L, batch, arch, dtype)``, with one warning per
   (arch, H, L, dtype) naming the command that tunes it.

``kernel="triton"`` asks for the portable Triton kernel's best config
instead of the arch's best: the same rules over the Triton configs the
tables hold (a bucket's ``triton`` winner, or its config where that is the
Triton kernel's), then ``triton_default_config`` (on sm90 the Triton
kernel's own tile, not the Hopper kernel's).

Where tables come from: each dir of ``$MLA_VERIFY_CONFIG_DIR`` (os.pathsep-
separated), then the user dir (``platformdirs.user_data_dir("mla_verify")/
configs``), then the tables shipped in the package. Merged per entry: the
first dir holding an (arch, H, L, dtype) entry supplies all of its buckets;
entries it lacks still come from the dirs below.

Records measured with other code of their kernel family than this one's
(stale: ``tables.py``) are still used (their configs are valid launches;
only their timings may be off); the first lookup of an arch warns, once per
table of that arch holding them, and a source names them. Loading does not:
tables of other arches are never looked up.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

import torch

from . import hopper, prepared, tables
from .code_hash import KERNEL_HASH, KERNEL_HASHES
from .config import (
    HOPPER_KERNELS,
    MAX_KV_SPLITS,
    VerifyConfig,
    default_config,
    rows_per_program,
    triton_default_config,
)
from .device import check_arch, current_arch
from .problem import MLA_HEAD_DIMS, check_head_dims, check_shape, kv_dtype_name
from .tables import LoadedEntry, entry_key

logger = logging.getLogger(__name__)

# KV dtypes that may borrow bf16 tuning when their own is missing: the tile
# shapes that pay are the same, only the bytes streamed differ.
_DTYPE_FALLBACK = {"fp16": "bf16", "fp8_e4m3": "bf16", "fp8_e4m3fnuz": "bf16"}
TUNE_COMMAND = "python -m mla_verify.tune --heads {H} --draft-lens {L} --kv-dtype {dtype}{dims}"
# What ``kernel=`` may ask for: the arch's best (None), or the Triton kernel.
LOOKUP_KERNELS = (None, "triton")

_tables: tables.LoadedTables = tables.load_tables(KERNEL_HASH, KERNEL_HASHES)
_reported: set[tuple[str, str, str | None]] = set()  # (arch, key, kernel) logged once


def reload_tables() -> None:
    """Re-read every table (after tuning, or in tests). Reads files: never
    call it on the launch path."""
    global _tables
    _tables = tables.load_tables(KERNEL_HASH, KERNEL_HASHES)
    _reported.clear()
    _resolve.cache_clear()
    prepared.clear()


# --- lookup ---------------------------------------------------------------------


def resolve_config(
    num_heads: int,
    draft_len: int,
    batch_size: int,
    kv_dtype: torch.dtype | str = torch.bfloat16,
    arch: str | None = None,
    kernel: str | None = None,
    *,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> tuple[VerifyConfig, str]:
    """The config for one launch and where it came from, in words (a table
    entry and bucket, ``nearest: ...`` or ``built-in default``). See the
    module docstring for the rules. ``arch=None`` detects the current GPU;
    ``kernel=None`` gives the arch's best config, ``kernel="triton"`` the
    best config of the portable Triton kernel; ``head_dims`` is (q/k, v),
    absorbed MLA's by default."""
    if kernel not in LOOKUP_KERNELS:
        raise ValueError(f"kernel: expected one of {LOOKUP_KERNELS}, got {kernel!r}")
    num_heads, draft_len, batch_size = check_shape(num_heads, draft_len, batch_size)
    dtype = kv_dtype_name(kv_dtype)
    head_dims = check_head_dims(head_dims)
    if arch is None:
        arch = current_arch()
    elif arch not in _tables:  # a loaded table's arch is one by definition
        check_arch(arch)
    return _resolve(arch, num_heads, draft_len, batch_size, dtype, head_dims, kernel)


def block_config(
    num_heads: int,
    draft_len: int,
    batch_size: int,
    kv_dtype: torch.dtype | str = torch.bfloat16,
    arch: str | None = None,
    kernel: str | None = None,
    *,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> VerifyConfig:
    """The config for one launch (``resolve_config`` without the source)."""
    config, _ = resolve_config(
        num_heads, draft_len, batch_size, kv_dtype, arch, kernel, head_dims=head_dims
    )
    return config


@functools.cache  # an lru_cache without bound: shapes x batch sizes are few
def _resolve(
    arch: str,
    num_heads: int,
    draft_len: int,
    batch_size: int,
    dtype: str,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
    kernel: str | None = None,
) -> tuple[VerifyConfig, str]:
    entries = {key: _view(entry, kernel) for key, entry in _tables.arch_entries(arch).items()}
    entries = {key: entry for key, entry in entries.items() if entry.buckets}
    key = entry_key(num_heads, draft_len, dtype, head_dims)
    what = "" if kernel is None else f" {kernel}"
    once = (arch, key, kernel)
    if key in entries:
        entry = entries[key]
        bucket = _nearest_bucket(entry.buckets, batch_size)
        return entry.buckets[bucket], _describe(entry, bucket, kernel)
    same_dims = [e for e in entries.values() if e.head_dims == head_dims]
    near = _nearest_entry(same_dims, num_heads, draft_len, dtype)
    if near is not None:
        bucket = _nearest_bucket(near.buckets, batch_size)
        tuned = near.buckets[bucket]
        config = adapt_config(tuned, near.num_heads, near.draft_len, num_heads, draft_len)
        if _keeps_tile(tuned, near.draft_len, config, draft_len):
            source = f"nearest: {_describe(near, bucket, kernel)}, adapted to {key}"
            _report_once(
                logging.INFO,
                once,
                "mla_verify: no %s%s entry %s; using %s",
                arch,
                what,
                key,
                source,
            )
            return config, source
    dims = "" if head_dims == MLA_HEAD_DIMS else " --head-dims {}x{}".format(*head_dims)
    command = TUNE_COMMAND.format(H=num_heads, L=draft_len, dtype=dtype, dims=dims)
    _report_once(
        logging.WARNING,
        once,
        "mla_verify: no tuned%s config for %s %s; using the built-in default, which may "
        "be slow. Tune it on a GPU of that arch with: %s",
        what,
        arch,
        key,
        command,
    )
    if kernel == "triton":
        config = triton_default_config(num_heads, draft_len, batch_size, arch, dtype, head_dims)
        return config, "built-in default (triton)"
    default = default_config(num_heads, draft_len, batch_size, arch, dtype, head_dims)
    return default, "built-in default"


def _keeps_tile(
    tuned: VerifyConfig, tuned_draft_len: int, adapted: VerifyConfig, draft_len: int
) -> bool:
    """Whether an adapted Triton config keeps the tuned rows per program:
    its warps and stages were chosen for that tile. On the H200 a 64-row
    winner carried to 16 or 32 rows ran 1.11-1.48x slower than the built-in
    default (H8L2B64C64K: 1880 against 1266 us); kept at 64 rows it ran
    1.09-1.20x faster. The Hopper tile is always 64 rows."""
    if adapted.kernel in HOPPER_KERNELS:
        return True
    return rows_per_program(adapted.BLOCK_H, draft_len) == rows_per_program(
        tuned.BLOCK_H, tuned_draft_len
    )


def _view(entry: LoadedEntry, kernel: str | None) -> LoadedEntry:
    """The entry as ``kernel`` sees it: the Triton kernel's configs only,
    for ``kernel="triton"``."""
    if kernel is None:
        return entry
    return dataclasses.replace(entry, buckets=entry.triton, stale_buckets=entry.stale_triton)


def _log2_distance(a: int, b: int) -> Fraction:
    """Orders like |log2 a - log2 b|, but exact (ties stay ties)."""
    return Fraction(max(a, b), min(a, b))


def _nearest_bucket(buckets: Iterable[int], batch_size: int) -> int:
    # Ties go to the larger bucket.
    return min(buckets, key=lambda b: (_log2_distance(b, batch_size), -b))


def _nearest_entry(
    entries: Iterable[LoadedEntry], num_heads: int, draft_len: int, dtype: str
) -> LoadedEntry | None:
    entries = list(entries)
    candidates = [e for e in entries if e.kv_dtype == dtype]
    if not candidates and dtype in _DTYPE_FALLBACK:
        candidates = [e for e in entries if e.kv_dtype == _DTYPE_FALLBACK[dtype]]
    if not candidates:
        return None
    # Same H has distance 1, the minimum, so it is preferred by construction.
    return min(
        candidates,
        key=lambda e: (
            _log2_distance(e.num_heads, num_heads),
            -e.num_heads,
            abs(e.draft_len - draft_len),
            -e.draft_len,
        ),
    )


def adapt_config(
    config: VerifyConfig, tuned_heads: int, tuned_draft_len: int, num_heads: int, draft_len: int
) -> VerifyConfig:
    """A config tuned for (tuned_heads, tuned_draft_len) carried over to
    (num_heads, draft_len): rows per program at or below the tuned tile, and
    about the tuned grid size."""
    if config.kernel in HOPPER_KERNELS:
        # The Hopper tile is always 64 rows and the tuner gives it as many
        # heads as fill them; an entry tuned at few heads has BLOCK_H capped
        # by its head count, which would leave rows empty at more heads.
        block_h = hopper.block_heads(num_heads, draft_len)
    else:
        block_h = max(1, min(num_heads, config.BLOCK_H * tuned_draft_len // draft_len))
    tuned_blocks = math.ceil(tuned_heads / config.BLOCK_H)
    blocks = math.ceil(num_heads / block_h)
    # round(splits * tuned_blocks / blocks), halves up, in exact integers.
    splits = (2 * config.NUM_KV_SPLITS * tuned_blocks + blocks) // (2 * blocks)
    splits = max(1, min(MAX_KV_SPLITS, splits))
    return dataclasses.replace(config, BLOCK_H=block_h, NUM_KV_SPLITS=splits)


def _describe(entry: LoadedEntry, bucket: int, kernel: str | None = None) -> str:
    key = entry_key(entry.num_heads, entry.draft_len, entry.kv_dtype, entry.head_dims)
    stale = ", stale" if bucket in entry.stale_buckets else ""
    what = "" if kernel is None else f" ({kernel})"
    name = Path(entry.source).name
    return f"{name} entry {key}, bucket {bucket}{what} ({entry.source}{stale})"


def _report_once(level: int, once: tuple[str, str, str | None], msg: str, *args: object) -> None:
    # Once per shape, not per batch size: a server sees many batch sizes.
    if once not in _reported:
        _reported.add(once)
        logger.log(level, msg, *args)


# --- inspection -----------------------------------------------------------------


def describe_tables() -> str:
    """Loaded arches, entries, source files and stale flags (for ``--show``).
    Lists the config dirs too, which touches the file system."""
    lines = ["config dirs, highest precedence first:"]
    lines += [f"  {label}: {directory}" for label, directory in tables.config_dirs()]
    if not _tables:
        lines.append("no tables loaded")
    for arch in sorted(_tables):
        entries = _tables[arch]
        lines.append(f"{arch}: {_count(len(entries))}")
        by_source: dict[str, list[LoadedEntry]] = {}
        for entry in entries.values():
            by_source.setdefault(entry.source, []).append(entry)
        for source in sorted(by_source):
            group = sorted(
                by_source[source], key=lambda e: (e.head_dims, e.kv_dtype, e.num_heads, e.draft_len)
            )
            lines.append(f"  {source}: {_count(len(group))}{_stale_note(group)}")
            for e in group:
                key = entry_key(e.num_heads, e.draft_len, e.kv_dtype, e.head_dims)
                stale = sorted(e.stale_buckets | e.stale_triton)
                note = f" (stale: {', '.join(map(str, stale))})" if stale else ""
                lines.append(f"    {key}: buckets {', '.join(map(str, e.buckets))}{note}")
    return "\n".join(lines)


def table_archs() -> set[str]:
    """The archs the loaded tables cover."""
    return set(_tables)


def _stale_note(group: list[LoadedEntry]) -> str:
    """A table's note: "(stale)" where every entry has stale records, "(k
    with stale records)" where some have."""
    stale = sum(e.stale for e in group)
    if not stale:
        return ""
    return " (stale)" if stale == len(group) else f" ({stale} with stale records)"


def _count(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"
