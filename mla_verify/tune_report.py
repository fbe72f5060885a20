"""``--show`` and ``--check`` of ``python -m mla_verify.tune``: what the
loaded tables hold, which config a shape gets, and whether a table still
fits this machine and software."""

from __future__ import annotations

import argparse
import logging
import sys

import torch
import triton
from tqdm import tqdm

from . import lookup, tables
from .code_hash import KERNEL_HASH, KERNEL_HASHES
from .config import VerifyConfig
from .device import SM_COUNT, current_arch
from .problem import MLA_HEAD_DIMS, kv_dtype_from_name

logger = logging.getLogger("mla_verify.tune")


def show(args: argparse.Namespace) -> int:
    """Without shapes, what the loaded tables hold; with shapes (--heads,
    --draft-lens, --batch-sizes), only the config each one gets and where
    from."""
    if not args.shapes_given:
        print(lookup.describe_tables())
        print("\n(add --heads, --draft-lens or --batch-sizes to see the config a shape gets)")
        return 0
    arch = args.arch or current_arch()  # parse_args asks for --arch without a GPU
    print(f"configs for arch {arch}:")
    for dtype_name in args.kv_dtypes:
        for heads in args.heads:
            for draft_len in args.draft_lens:
                for bs in args.batch_sizes:
                    config, source = lookup.resolve_config(heads, draft_len, bs, dtype_name, arch)
                    print(
                        f"  H{heads} L{draft_len} bs{bs} {dtype_name}: "
                        f"{config.to_dict()}  <- {source}"
                    )
    return 0


def known_archs() -> set[str]:
    """The archs --arch accepts: those the package knows the size of, and
    those of the loaded tables."""
    return set(SM_COUNT) | lookup.table_archs()


def _metadata_fit(table: dict, device_name: str | None) -> tuple[list[str], list[str]]:
    """(what was compared, what differs) between a table and this machine
    and software: its records' kernel code (stale records, per kernel
    family), its versions and its device."""
    metadata = table["metadata"]
    compared, differs = [], []
    if metadata.get("measured", True):
        compared.append("kernel")
        counts = tables.stale_records(table, KERNEL_HASH, KERNEL_HASHES)
        stale = tables.describe_stale(counts, KERNEL_HASHES)
        if stale:
            differs.append(f"stale: {stale}")
    compared += ["triton", "torch"]
    if metadata.get("triton") != triton.__version__:
        differs.append(f"triton {metadata.get('triton')} != {triton.__version__}")
    if metadata.get("torch") != torch.__version__:
        differs.append(f"torch {metadata.get('torch')} != {torch.__version__}")
    if device_name:
        compared.append("device")
        if metadata.get("device") != device_name:
            differs.append(f"device {metadata.get('device')!r} != {device_name!r}")
    return compared, differs


def check(args: argparse.Namespace) -> int:
    """Report each table's fit, saying what was compared; on a GPU, run
    every config of this arch's tables against the reference. Exit status
    1 when a table is unreadable or a config fails."""
    on_gpu = torch.cuda.is_available()
    arch = current_arch() if on_gpu else None
    device_name = torch.cuda.get_device_name() if on_gpu else None
    not_run_reason = f"this GPU is {arch}" if on_gpu else "no GPU here"
    read, unreadable, failures, ran = 0, 0, 0, 0
    differ, not_run = [], []
    for label, directory in tables.config_dirs():
        for path in sorted(directory.glob("*.json")):
            table = tables.read_table(path)
            if table is None:
                print(f"[{label}] {path}: UNREADABLE (see the warning above)")
                unreadable += 1
                continue
            read += 1
            compared, differs = _metadata_fit(table, device_name if table["arch"] == arch else None)
            if differs:
                differ.append(path.name)
            fit = "; ".join(differs) if differs else f"{', '.join(compared)} as installed here"
            print(f"[{label}] {path}: {len(table['entries'])} entries; {fit}")
            if table["arch"] != arch:
                print(f"  configs not run ({not_run_reason})")
                not_run.append(path.name)
                continue
            compile_ahead(table, arch, args.jobs)
            table_ran, table_failures = run_configs(table, path.name)
            print(f"  {table_ran} configs run against the reference, {table_failures} failed")
            ran += table_ran
            failures += table_failures
    summary = [
        f"{read} table(s) read, {unreadable} unreadable",
        f"{ran} config(s) run against the reference, {failures} failed",
    ]
    if not_run:
        summary.append(f"configs not run ({not_run_reason}): {', '.join(not_run)}")
    if differ:
        summary.append(f"made with another kernel or software: {', '.join(differ)}")
    print("check: " + "; ".join(summary))
    return 1 if failures or unreadable else 0


def compile_ahead(table: dict, arch: str, jobs: int | None) -> None:
    """Compile every config of ``table`` (this GPU's arch) in parallel
    processes (``--jobs``, read as the tuner reads it), as the tuner does
    before it times (tune.precompile), so that run_configs, which runs them
    one at a time, finds its kernels in Triton's cache. An sm90 table's 918
    configs compiled in turn ran at about 1.5 configs a second on an H100."""
    from . import tune

    entries = [
        (
            entry["num_heads"],
            entry["draft_len"],
            entry["kv_dtype"],
            tuple(entry.get("head_dims", MLA_HEAD_DIMS)),
            (),  # no kernel's default and no search: the table's configs alone
            (),
            [VerifyConfig.from_dict(bucket["config"]) for bucket in entry["buckets"].values()],
        )
        for entry in table["entries"].values()
    ]
    try:
        tune.precompile(entries, arch, tune.compile_workers(jobs))
    except Exception as exc:  # only a head start: run_configs compiles what is missing
        logger.warning("compiling ahead failed (%s); the configs compile as they run", exc)


def run_configs(table: dict, name: str, device: str = "cuda") -> tuple[int, int]:
    """Every config of ``table`` (this GPU's arch) run once on ``device``
    against the float reference, on a small batch of its bucket's size (at
    most 4 requests), each failure printed; the configs run and those that
    failed. A progress bar on stderr: an sm90 table holds about a thousand
    configs, minutes of work."""
    from .testing import check_close, make_batch

    buckets = [
        (key, entry, bs_key, bucket)
        for key, entry in table["entries"].items()
        for bs_key, bucket in entry["buckets"].items()
    ]
    failures = 0
    for key, entry, bs_key, bucket in tqdm(
        buckets, desc=f"checking {name}", unit="config", file=sys.stderr
    ):
        config = VerifyConfig.from_dict(bucket["config"])
        batch = make_batch(
            entry["num_heads"],
            entry["draft_len"],
            [1500, 1, 0, 700][: min(int(bs_key), 4)],
            kv_dtype=kv_dtype_from_name(entry["kv_dtype"]),
            device=device,
            seed=0,
            head_dims=tuple(entry.get("head_dims", MLA_HEAD_DIMS)),
            separate_v="head_dims" in entry,
        )
        out = batch.new_output()
        try:
            batch.run(out, config)
            check_close(out, batch.reference(), what=f"{key} bucket {bs_key}")
        except Exception as exc:
            failures += 1
            tqdm.write(f"  FAILED {key} bucket {bs_key}: {exc}", file=sys.stdout)
    return len(buckets), failures
