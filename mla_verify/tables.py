"""Tuned-config tables on disk: the JSON format, validating, reading, writing
and loading them from every config directory. The only module that touches
table files; the tuner writes through ``write_entries`` and the runtime reads
through ``load_tables``, so writer and reader cannot drift.

One file per arch, ``<arch>.json``::

    {"schema_version": 1, "arch": "sm90",
     "metadata": {"kernel_hash": "<16 hex>", "measured": true, ...free-form},
     "entries": {"H128_L4_bf16": {"num_heads": 128, "draft_len": 4, "kv_dtype": "bf16",
                 "buckets": {"32": {"config": {...VerifyConfig.to_dict()},
                                    "kernel_hash": "<16 hex>",
                                    "tuned_us": 12.3, "default_us": 15.0,
                                    "context_lens": [2048, 16384],
                                    "tuned_us_by_context": [8.1, 18.7],
                                    "default_us_by_context": [9.9, 22.7],
                                    "triton": {"config": {...}, "tuned_us": 20.5, ...}}}}}}

An entry of head dims other than absorbed MLA's (576, 512) names them,
``"head_dims": [256, 256]``, and its key says so: ``H16_L4_bf16_D256``;
entries without the field are MLA's.

Bucket keys are batch sizes as decimal strings; ``tuned_us``/``default_us``
(geometric means over the contexts) may be null (unmeasured configs).
``context_lens`` and the per-context times, one per length, are optional.
``triton``, optional, is the Triton kernel's own winner where the bucket's
config is another kernel (the Hopper one on sm90), with the same fields
(its default: the Triton kernel's built-in config); tables without it read
as before. ``Record`` is the one serialiser of a config and its times, for
the tuner writing and the runtime reading.

Staleness is per record. A record's ``kernel_hash`` (optional) is the hash
of the code its config's kernel family ran when it was measured
(``code_hash.KERNEL_HASHES``, the family per ``config.kernel_family``): the
record is stale where that family's code has changed since. A record
without one (tables written before records carried it) dates from
``metadata.kernel_hash``, the combined hash of every kernel
(``code_hash.KERNEL_HASH``) the table was last written with, and is stale
where any kernel has changed. When a write changes ``metadata.kernel_hash``,
the records it keeps that carry no hash get the old one, so they keep
their meaning. Records of an unmeasured table (``"measured": false``) are
never stale: they are not timings of a particular build.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock
import platformdirs

from .config import VerifyConfig, kernel_family
from .problem import MLA_HEAD_DIMS, check_head_dims, head_dims_suffix, kv_dtype_name

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
ENV_VAR = "MLA_VERIFY_CONFIG_DIR"

_TOP_KEYS = {"schema_version", "arch", "metadata", "entries"}
_ENTRY_KEYS = {"num_heads", "draft_len", "kv_dtype", "buckets"}
_ENTRY_OPTIONAL = {"head_dims"}
_RECORD_KEYS = {"config", "tuned_us", "default_us"}
_RECORD_OPTIONAL = {"context_lens", "tuned_us_by_context", "default_us_by_context", "kernel_hash"}
TRITON_KEY = "triton"  # a bucket's Triton winner beside its config
# Dates the records of a measured table that named no kernel hash, once a
# write gives the table one: stale against any code.
UNKNOWN_KERNEL_HASH = "0" * 16


class TableError(ValueError):
    """A table file's content does not follow the format."""


@dataclass(frozen=True)
class LoadedEntry:
    """One (H, L, kv dtype, head dims) entry of a loaded table, ready for lookup."""

    num_heads: int
    draft_len: int
    kv_dtype: str
    buckets: dict[int, VerifyConfig]  # batch size -> config, ascending
    times: dict[int, tuple[float | None, float | None]]  # batch -> (tuned_us, default_us)
    source: str  # path of the file it came from
    head_dims: tuple[int, int] = MLA_HEAD_DIMS  # (q/k, v)
    # batch size -> the Triton kernel's config, in the buckets that know one
    # (their "triton" record, or their config where it is the Triton kernel's)
    triton: dict[int, VerifyConfig] = field(default_factory=dict)
    stale_buckets: frozenset[int] = frozenset()  # buckets whose config is stale
    stale_triton: frozenset[int] = frozenset()  # buckets whose Triton config is stale

    @property
    def stale(self) -> bool:
        """Some record measured with other kernel code than this one's."""
        return bool(self.stale_buckets or self.stale_triton)


@dataclass(frozen=True)
class Record:
    """One config and its times, as a bucket (or its Triton winner) holds
    them. Times in microseconds, None where not measured; per-context times
    follow ``context_lens``; ``kernel_hash``: the code the times were
    measured with (its config's family's hash), None where not known."""

    config: VerifyConfig
    tuned_us: float | None = None
    default_us: float | None = None
    context_lens: tuple[int, ...] = ()
    tuned_us_by_context: tuple[float, ...] = ()
    default_us_by_context: tuple[float, ...] = ()
    kernel_hash: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.config.to_dict()}
        if self.kernel_hash is not None:
            out["kernel_hash"] = self.kernel_hash
        out["tuned_us"] = _round(self.tuned_us)
        out["default_us"] = _round(self.default_us)
        if self.context_lens:
            out["context_lens"] = list(self.context_lens)
            out["tuned_us_by_context"] = [_round(t) for t in self.tuned_us_by_context]
            out["default_us_by_context"] = [_round(t) for t in self.default_us_by_context]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """A validated record (``validate_table`` has seen it)."""
        return cls(
            config=VerifyConfig.from_dict(data["config"]),
            tuned_us=data["tuned_us"],
            default_us=data["default_us"],
            context_lens=tuple(data.get("context_lens", ())),
            tuned_us_by_context=tuple(data.get("tuned_us_by_context", ())),
            default_us_by_context=tuple(data.get("default_us_by_context", ())),
            kernel_hash=data.get("kernel_hash"),
        )


def bucket_json(record: Record, triton: Record | None = None) -> dict[str, Any]:
    """A bucket in the file format: its config and times, and the Triton
    kernel's winner beside them where that is another config."""
    out = record.to_json()
    if triton is not None:
        out[TRITON_KEY] = triton.to_json()
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def entry_key(
    num_heads: int,
    draft_len: int,
    kv_dtype: str,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> str:
    """Table key of one shape, e.g. ``H128_L4_bf16`` (MLA) or
    ``H16_L4_bf16_D256`` (q/k = v = 256)."""
    return f"H{num_heads}_L{draft_len}_{kv_dtype}{head_dims_suffix(head_dims)}"


# --- validation ---------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, where: str, reason: str) -> None:
    if not ok:
        raise TableError(f"{where}: {reason}")


def _check_keys(data: Any, required: set[str], optional: set[str], where: str) -> None:
    _check(isinstance(data, dict), where, f"expected an object, got {type(data).__name__}")
    missing = required - set(data)
    _check(not missing, where, f"missing keys {sorted(missing)}")
    unknown = set(data) - required - optional
    _check(not unknown, where, f"unknown keys {sorted(unknown)}")


def _check_time(value: Any, where: str, nullable: bool = True) -> None:
    """A time in microseconds; null only where nullable (a reported config's
    unmeasured time)."""
    positive = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
    expected = "a positive number or null" if nullable else "a positive number"
    _check(positive or (nullable and value is None), where, f"expected {expected}, got {value!r}")


def _validate_bucket(key: Any, bucket: Any, where: str) -> None:
    # Canonical decimal only ("32", not "032" or " 32"), so keys never collide.
    ok = (
        isinstance(key, str)
        and key.isascii()
        and key.isdigit()
        and str(int(key)) == key
        and int(key) >= 1
    )
    _check(ok, where, f"bucket key {key!r} is not a positive integer in decimal")
    where = f"{where}.buckets[{key}]"
    _check_keys(bucket, _RECORD_KEYS, _RECORD_OPTIONAL | {TRITON_KEY}, where)
    _validate_record(bucket, where)
    if TRITON_KEY in bucket:
        where = f"{where}.{TRITON_KEY}"
        triton = bucket[TRITON_KEY]
        _check_keys(triton, _RECORD_KEYS, _RECORD_OPTIONAL, where)
        _validate_record(triton, where)
        kernel = triton["config"].get("kernel", "triton")
        _check(kernel == "triton", f"{where}.config.kernel", f"expected 'triton', got {kernel!r}")


def _validate_record(record: dict[str, Any], where: str) -> None:
    config = record["config"]
    _check(isinstance(config, dict), f"{where}.config", "expected an object")
    for name, value in config.items():
        if name == "kernel":  # the one field that is a name
            ok, expected = isinstance(value, str), "a string"
        else:
            ok, expected = _is_int(value), "an integer"
        _check(ok, f"{where}.config.{name}", f"expected {expected}, got {value!r}")
    try:
        VerifyConfig.from_dict(config)
    except (TypeError, ValueError) as exc:
        raise TableError(f"{where}.config: {exc}") from None
    if "kernel_hash" in record:
        value = record["kernel_hash"]
        ok = isinstance(value, str) and re.fullmatch("[0-9a-f]{16}", value) is not None
        _check(ok, f"{where}.kernel_hash", f"expected 16 hex digits, got {value!r}")
    _check_time(record["tuned_us"], f"{where}.tuned_us")
    _check_time(record["default_us"], f"{where}.default_us")
    if "context_lens" in record:
        lens = record["context_lens"]
        ok = isinstance(lens, list) and all(_is_int(n) and n >= 0 for n in lens)
        _check(ok, f"{where}.context_lens", f"expected a list of lengths, got {lens!r}")
    for name in ("tuned_us_by_context", "default_us_by_context"):
        if name in record:
            times, lens = record[name], record.get("context_lens")
            ok = isinstance(times, list) and isinstance(lens, list) and len(times) == len(lens)
            _check(ok, f"{where}.{name}", f"expected one time per context_lens, got {times!r}")
            for i, t in enumerate(times):  # measured: the tuner writes no null here
                _check_time(t, f"{where}.{name}[{i}]", nullable=False)


def _validate_entry(key: Any, entry: Any) -> None:
    where = f"entries[{key!r}]"
    _check_keys(entry, _ENTRY_KEYS, _ENTRY_OPTIONAL, where)
    for name in ("num_heads", "draft_len"):
        value = entry[name]
        _check(
            _is_int(value) and value >= 1, f"{where}.{name}", f"expected an int >= 1, got {value!r}"
        )
    try:
        kv_dtype_name(entry["kv_dtype"])
    except ValueError as exc:
        raise TableError(f"{where}.{exc}") from None
    head_dims = entry.get("head_dims", list(MLA_HEAD_DIMS))
    _check(
        isinstance(head_dims, list) and all(_is_int(d) for d in head_dims),
        f"{where}.head_dims",
        f"expected a list [qk, v], got {head_dims!r}",
    )
    try:
        head_dims = check_head_dims(head_dims)
    except ValueError as exc:
        raise TableError(f"{where}.{exc}") from None
    expected = entry_key(entry["num_heads"], entry["draft_len"], entry["kv_dtype"], head_dims)
    _check(key == expected, where, f"key does not match its fields (expected {expected!r})")
    buckets = entry["buckets"]
    _check(isinstance(buckets, dict) and buckets, f"{where}.buckets", "expected a non-empty object")
    for bucket_key, bucket in buckets.items():
        _validate_bucket(bucket_key, bucket, where)


def validate_table(data: Any, *, expected_arch: str | None = None) -> None:
    """Raise ``TableError`` naming the first thing in ``data`` that breaks the
    format; ``expected_arch`` is the arch the file name promises."""
    _check(isinstance(data, dict), "table", f"expected an object, got {type(data).__name__}")
    version = data.get("schema_version")
    _check(
        version == SCHEMA_VERSION and _is_int(version),
        "schema_version",
        f"expected {SCHEMA_VERSION}, got {version!r}",
    )
    _check_keys(data, _TOP_KEYS, set(), "table")
    arch = data["arch"]
    _check(isinstance(arch, str) and arch != "", "arch", f"expected a name, got {arch!r}")
    if expected_arch is not None:
        _check(arch == expected_arch, "arch", f"{arch!r} in a file for {expected_arch!r}")
    metadata = data["metadata"]
    _check(isinstance(metadata, dict), "metadata", "expected an object")
    meta_arch = metadata.get("arch", arch)
    _check(meta_arch == arch, "metadata.arch", f"{meta_arch!r} differs from arch {arch!r}")
    hash_ = metadata.get("kernel_hash")
    _check(hash_ is None or isinstance(hash_, str), "metadata.kernel_hash", "expected a string")
    measured = metadata.get("measured", True)
    _check(isinstance(measured, bool), "metadata.measured", f"expected a bool, got {measured!r}")
    _check(isinstance(data["entries"], dict), "entries", "expected an object")
    for key, entry in data["entries"].items():
        _validate_entry(key, entry)


# --- reading and writing ------------------------------------------------------


_warned: set[str] = set()  # config-dir and stale-table warnings already given


def _warn_once(msg: str, *args: object) -> None:
    # Once per process: the import reads every table, and --check or the
    # tuner reading the same bad file again, or a reload finding the same
    # stale table, must not repeat it.
    text = msg % args
    if text not in _warned:
        _warned.add(text)
        logger.warning(text)


def read_table(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The validated table in ``path``, or None (with a warning naming the
    file and the reason, once per process) when it is missing, unreadable,
    corrupt, of another schema, of a foreign arch or otherwise invalid.
    Never raises for content."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        validate_table(data, expected_arch=path.stem)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TableError) as exc:
        _warn_once("mla_verify: ignoring config table %s: %s", path, exc)
        return None
    return data


def bucket_records(bucket: dict[str, Any]) -> dict[str | None, dict[str, Any]]:
    """A bucket's records in the file format, by the tuner's search that
    writes them: its own (None), then its Triton winner's ("triton") where
    it has one."""
    records: dict[str | None, dict[str, Any]] = {None: bucket}
    if TRITON_KEY in bucket:
        records["triton"] = bucket[TRITON_KEY]
    return records


def kept_entries(table: dict[str, Any], kernel_hash: str | None) -> dict[str, Any]:
    """A validated table's entries as a write that sets its
    ``metadata.kernel_hash`` to ``kernel_hash`` keeps them: where that
    changes a measured table's hash, every record without a hash of its own
    gets the old one (``UNKNOWN_KERNEL_HASH`` where there was none), which
    it dates from; so it stays stale, not current under the new hash."""
    old = table["metadata"].get("kernel_hash")
    if not _measured(table["metadata"]) or old == kernel_hash:
        return table["entries"]
    out = json.loads(json.dumps(table["entries"]))  # a deep copy
    for entry in out.values():
        for bucket in entry["buckets"].values():
            for record in bucket_records(bucket).values():
                record.setdefault("kernel_hash", old or UNKNOWN_KERNEL_HASH)
    return out


def _merge_entries(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Per entry and per bucket: new buckets replace old ones of the same
    batch size; every other bucket and entry is kept."""
    merged = dict(old)
    for key, entry in new.items():
        buckets = dict(old[key]["buckets"]) if key in old else {}
        buckets.update(entry["buckets"])
        merged[key] = {**entry, "buckets": buckets}
    return merged


def _canonical(arch: str, metadata: dict[str, Any], entries: dict[str, Any]) -> dict[str, Any]:
    """Sorted for stable diffs: entries by key, buckets by batch size."""
    ordered = {
        key: {
            **entries[key],
            "buckets": dict(sorted(entries[key]["buckets"].items(), key=lambda kv: int(kv[0]))),
        }
        for key in sorted(entries)
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "arch": arch,
        "metadata": metadata,
        "entries": ordered,
    }


def _atomic_write(path: Path, text: str) -> None:
    # Temp file in the same directory, so os.replace is an atomic rename:
    # readers see the old table or the new one, never half of one.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; tables are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_entries(
    path: str | os.PathLike[str],
    arch: str,
    metadata: dict[str, Any],
    entries: dict[str, Any],
) -> None:
    """Merge ``entries`` (entry key -> entry, in the file format) into the
    table at ``path`` and set its metadata to ``metadata``; measured entries
    replace an unmeasured table whole, and the other way round. Safe for
    several processes writing the same file: the read-merge-write runs under
    a lock file ``<path>.lock`` and the write is atomic. Raises
    ``TableError`` if the result would not be a valid table."""
    path = Path(path)
    _check(path.stem == arch, "write_entries", f"file {path.name} must be named {arch}.json")
    new = {"schema_version": SCHEMA_VERSION, "arch": arch, "metadata": metadata, "entries": entries}
    validate_table(new, expected_arch=arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(f"{path}.lock"):
        old = read_table(path) if path.exists() else None
        if old and _measured(old["metadata"]) != _measured(metadata):
            old = None  # measured and unmeasured buckets never share a table
        old_entries = kept_entries(old, metadata.get("kernel_hash")) if old else {}
        merged = _merge_entries(old_entries, entries)
        table = _canonical(arch, metadata, merged)
        _atomic_write(path, json.dumps(table, indent=2) + "\n")


# --- directories and loading --------------------------------------------------


def user_table_dir() -> Path:
    """Per-user tables, written by ``python -m mla_verify.tune`` by default."""
    return Path(platformdirs.user_data_dir("mla_verify")) / "configs"


def shipped_table_dir() -> Path:
    """Tables shipped inside the package (``mla_verify.configs``); in a source
    checkout, the top-level ``configs/`` next to the package."""
    try:
        spec = importlib.util.find_spec("mla_verify.configs")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parent.parent / "configs"


def config_dirs() -> list[tuple[str, Path]]:
    """(source label, directory), highest precedence first: each path of
    ``$MLA_VERIFY_CONFIG_DIR`` (os.pathsep-separated), the user dir, the
    shipped dir."""
    env = os.environ.get(ENV_VAR, "")
    dirs = [("env", Path(p)) for p in env.split(os.pathsep) if p]
    dirs.append(("user", user_table_dir()))
    dirs.append(("shipped", shipped_table_dir()))
    return dirs


def _measured(metadata: dict[str, Any]) -> bool:
    return metadata.get("measured", True) is not False


def record_is_stale(
    record: dict[str, Any],
    metadata: dict[str, Any],
    kernel_hash: str,
    family_hashes: Mapping[str, str],
) -> bool:
    """Whether a record's timings may no longer hold (the module docstring):
    its own kernel hash differs from its config's family's in
    ``family_hashes``, or, where it has none, its table's from the combined
    ``kernel_hash``. Never for an unmeasured table."""
    if not _measured(metadata):
        return False  # reported configs, not timings of a particular kernel build
    own = record.get("kernel_hash")
    if own is None:
        return metadata.get("kernel_hash") != kernel_hash
    return own != family_hashes.get(kernel_family(record["config"].get("kernel", "triton")))


def stale_records(
    table: dict[str, Any], kernel_hash: str, family_hashes: Mapping[str, str]
) -> dict[str, tuple[int, int]]:
    """Kernel family -> (its stale records, its records) in a validated table."""
    counts: dict[str, tuple[int, int]] = {}
    for entry in table["entries"].values():
        for bucket in entry["buckets"].values():
            for record in bucket_records(bucket).values():
                family = kernel_family(record["config"].get("kernel", "triton"))
                stale, total = counts.get(family, (0, 0))
                is_stale = record_is_stale(record, table["metadata"], kernel_hash, family_hashes)
                counts[family] = (stale + is_stale, total + 1)
    return counts


def describe_stale(counts: dict[str, tuple[int, int]], family_hashes: Mapping[str, str]) -> str:
    """``stale_records``' counts in words, e.g. "3 of 30 triton records
    (this code: triton 0123456789abcdef)"; empty where none is stale."""
    stale = {family: n for family, n in sorted(counts.items()) if n[0]}
    if not stale:
        return ""
    parts = ", ".join(f"{n} of {total} {family} records" for family, (n, total) in stale.items())
    code = ", ".join(f"{family} {family_hashes.get(family)}" for family in stale)
    return f"{parts} (this code: {code})"


def _loaded_entries(
    path: Path, table: dict[str, Any], kernel_hash: str, family_hashes: Mapping[str, str]
) -> dict[str, LoadedEntry]:
    def stale(record: dict[str, Any]) -> bool:
        return record_is_stale(record, table["metadata"], kernel_hash, family_hashes)

    out = {}
    for key, entry in table["entries"].items():
        buckets = sorted(((int(b), v) for b, v in entry["buckets"].items()), key=lambda bv: bv[0])
        # The record of each bucket's Triton config: its Triton winner, or
        # itself where its config is the Triton kernel's.
        tritons = {
            b: v.get(TRITON_KEY, v)
            for b, v in buckets
            if TRITON_KEY in v or v["config"].get("kernel", "triton") == "triton"
        }
        stale_buckets = frozenset(b for b, v in buckets if stale(v))
        stale_triton = frozenset(b for b, v in tritons.items() if stale(v))
        records = {b: Record.from_json(v) for b, v in buckets}
        out[key] = LoadedEntry(
            num_heads=entry["num_heads"],
            draft_len=entry["draft_len"],
            kv_dtype=entry["kv_dtype"],
            buckets={b: r.config for b, r in records.items()},
            times={b: (r.tuned_us, r.default_us) for b, r in records.items()},
            source=str(path),
            head_dims=tuple(entry.get("head_dims", MLA_HEAD_DIMS)),
            triton={b: VerifyConfig.from_dict(v["config"]) for b, v in tritons.items()},
            stale_buckets=stale_buckets,
            stale_triton=stale_triton,
        )
    return out


STALE_WARNING = (
    "mla_verify: config table %s has stale records, measured with other kernel code: %s; "
    "their configs are still used but their timings may no longer hold: re-tune to refresh"
)


class LoadedTables(dict[str, dict[str, LoadedEntry]]):
    """``load_tables``' result: arch -> entry key -> entry, and in ``stale``
    arch -> path -> ``describe_stale``'s words, per table with stale records."""

    def __init__(self) -> None:
        super().__init__()
        self.stale: dict[str, dict[str, str]] = {}

    def arch_entries(self, arch: str) -> dict[str, LoadedEntry]:
        """The entries of ``arch``, for a lookup; warns about each of its
        tables with stale records, once per process."""
        # At the first lookup, not at load: every process that imports the
        # package loads every arch's tables (each of the tuner's compile
        # workers too), but only the arch it looks up can use stale records.
        for path, stale in self.stale.get(arch, {}).items():
            _warn_once(STALE_WARNING, path, stale)
        return self.get(arch, {})


def _table_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.glob("*.json") if p.is_file())
    except OSError as exc:
        logger.warning("mla_verify: cannot list config dir %s: %s", directory, exc)
        return []


def load_tables(kernel_hash: str, family_hashes: Mapping[str, str]) -> LoadedTables:
    """arch -> entry key -> entry, from every table in every config dir;
    ``kernel_hash`` is this code's combined hash (``code_hash.KERNEL_HASH``),
    ``family_hashes`` its hash per kernel family (``code_hash.KERNEL_HASHES``).

    Merged per entry by precedence: an entry of a higher-precedence dir wins
    whole over the same key lower down; entries it lacks come from below.
    Bad files are skipped with a warning; records measured with other kernel
    code are still used, marked stale, and loading says nothing of them:
    ``LoadedTables.arch_entries`` warns, once per table that holds them,
    counting them by family. Never raises."""
    merged = LoadedTables()
    for label, directory in reversed(config_dirs()):  # lowest first; higher overwrite
        if label == "env" and not directory.is_dir():
            _warn_once("mla_verify: ignoring %s entry %s: no such directory", ENV_VAR, directory)
        for path in _table_files(directory):
            table = read_table(path)
            if table is None:
                continue
            counts = stale_records(table, kernel_hash, family_hashes)
            stale = describe_stale(counts, family_hashes)
            if stale:
                merged.stale.setdefault(table["arch"], {})[str(path)] = stale
            entries = _loaded_entries(path, table, kernel_hash, family_hashes)
            merged.setdefault(table["arch"], {}).update(entries)
    return merged
