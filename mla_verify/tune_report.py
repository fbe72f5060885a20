"""``--show`` and ``--check`` of ``python -m mla_verify.tune``: what the
loaded tables hold, which config a shape gets, and whether a table still
fits this machine and software."""

from __future__ import annotations

import argparse
import logging

import torch
import triton

from . import lookup, tables
from .config import VerifyConfig
from .device import current_arch
from .kernel import KERNEL_HASH
from .problem import MLA_HEAD_DIMS, kv_dtype_from_name

logger = logging.getLogger("mla_verify.tune")


def show(args: argparse.Namespace) -> int:
    print(lookup.describe_tables())
    arch = args.arch or (current_arch() if torch.cuda.is_available() else None)
    if arch is None:
        print("(no GPU: pass --arch to look shapes up)")
        return 0
    print(f"\nconfigs for arch {arch}:")
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


def _metadata_mismatches(metadata: dict, device_name: str | None) -> list[str]:
    found = []
    if metadata.get("kernel_hash") != KERNEL_HASH and metadata.get("measured", True):
        found.append(f"kernel hash {metadata.get('kernel_hash')} != {KERNEL_HASH} (stale)")
    if metadata.get("triton") != triton.__version__:
        found.append(f"triton {metadata.get('triton')} != {triton.__version__}")
    if metadata.get("torch") != torch.__version__:
        found.append(f"torch {metadata.get('torch')} != {torch.__version__}")
    if device_name and metadata.get("device") != device_name:
        found.append(f"device {metadata.get('device')!r} != {device_name!r}")
    return found


def check(args: argparse.Namespace) -> int:
    """Report each table's fit; on a GPU, run every config of this arch's
    tables against the reference. Exit status 1 on a wrong or failing one."""
    from .testing import check_close, make_batch

    on_gpu = torch.cuda.is_available()
    arch = current_arch() if on_gpu else None
    device_name = torch.cuda.get_device_name() if on_gpu else None
    failures = 0
    for label, directory in tables.config_dirs():
        for path in sorted(directory.glob("*.json")):
            table = tables.read_table(path)
            if table is None:
                print(f"[{label}] {path}: UNREADABLE (see the warning above)")
                failures += 1
                continue
            notes = _metadata_mismatches(
                table["metadata"], device_name if table["arch"] == arch else None
            )
            print(
                f"[{label}] {path}: {len(table['entries'])} entries; "
                + ("; ".join(notes) if notes else "matches this machine and software")
            )
            if table["arch"] != arch:
                continue
            for key, entry in table["entries"].items():
                for bs_key, bucket in entry["buckets"].items():
                    config = VerifyConfig.from_dict(bucket["config"])
                    batch = make_batch(
                        entry["num_heads"],
                        entry["draft_len"],
                        [1500, 1, 0, 700][: min(int(bs_key), 4)],
                        kv_dtype=kv_dtype_from_name(entry["kv_dtype"]),
                        device="cuda",
                        head_dims=tuple(entry.get("head_dims", MLA_HEAD_DIMS)),
                        separate_v="head_dims" in entry,
                    )
                    out = batch.new_output()
                    try:
                        batch.run(out, config)
                        check_close(out, batch.reference(), what=f"{key} bucket {bs_key}")
                    except Exception as exc:
                        failures += 1
                        print(f"  FAILED {key} bucket {bs_key}: {exc}")
    print("check: " + (f"{failures} problem(s)" if failures else "all good"))
    return 1 if failures else 0
