"""Every config of every shipped table compiles for its arch and fits its
shared memory / LDS, and on AMD spills no register (nor does the Triton
kernel's built-in AMD default), checked ahead of time on a machine without
that GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mla_verify.aot import TARGETS

REPO = Path(__file__).resolve().parent.parent
SHIPPED = [p.stem for p in sorted((REPO / "configs").glob("*.json"))]

# Runs without TRITON_INTERPRET: compiling needs real (not interpreted) kernels.
# Prints one JSON line per distinct compiled kernel: [draft_len, kv_dtype,
# config, resources or the compile error]. Jobs that compile alike (split
# count, share floor, head count) compile once, on every core.
SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, os, sys
    from mla_verify import aot
    from mla_verify.config import VerifyConfig, triton_default_config
    from mla_verify.device import is_amd_arch
    arch, path = sys.argv[1], sys.argv[2]
    table = json.load(open(path))
    jobs = set()
    for entry in table["entries"].values():
        dims = tuple(entry.get("head_dims", (576, 512)))
        shape = (entry["draft_len"], entry["kv_dtype"], arch, dims)
        for bucket in entry["buckets"].values():
            for record in (bucket, bucket.get("triton")):
                if record is not None:
                    config = VerifyConfig.from_dict(record["config"])
                    jobs.add((config.with_splits(1).with_min_share(None), *shape))
            if is_amd_arch(arch):  # where no entry applies, the default runs
                config = triton_default_config(entry["num_heads"], entry["draft_len"], 1, arch)
                jobs.add((config.with_splits(1), *shape))
    jobs = sorted(jobs, key=repr)
    for (config, draft_len, kv_dtype, _, _), found in zip(
        jobs, aot.resources_many(jobs, workers=os.cpu_count() or 1)
    ):
        found = found if isinstance(found, str) else dataclasses.asdict(found)
        print(json.dumps([draft_len, kv_dtype, config.to_dict(), found]))
    """
)


def _compile(arch: str, path: Path) -> list[list]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, arch, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("arch", SHIPPED)
def test_shipped_configs_compile_fit_and_do_not_spill(arch):
    assert arch in TARGETS, f"no compile target known for shipped table {arch}.json"
    rows = _compile(arch, REPO / "configs" / f"{arch}.json")
    assert rows, "no kernels compiled"
    errors = [r for r in rows if isinstance(r[3], str)]
    assert not errors, f"do not compile: {errors}"
    limit = TARGETS[arch][1]
    too_big = [r for r in rows if r[3]["shared"] > limit]
    assert not too_big, f"over {limit} B of shared memory: {too_big}"
    spilling = [r for r in rows if r[3]["spills"] or r[3]["scratch"]]
    if arch.startswith("gfx"):  # tables we derive, unmeasured: a spill is never a choice
        assert not spilling, f"spill registers: {spilling}"
    else:  # measured tables: a spilling kernel may still be the fastest, so say so
        print(f"{arch}: {len(spilling)} of {len(rows)} kernels spill (measured, kept)")


def test_spills_and_lds_are_read_from_the_compiled_kernel():
    """The configuration reported for MI355X (4 heads, BLOCK_N 64, 8 warps,
    1 stage) spills hundreds of VGPRs on gfx950; 16-token tiles on 4 waves
    do not. The check reads both from the compiled kernel's metadata."""
    script = textwrap.dedent(
        """
        from mla_verify import aot
        from mla_verify.config import reported_amd_config, triton_default_config
        reported = aot.compile_prefix_kernel(reported_amd_config(16, 32), 2, "bf16", "gfx950")
        default = triton_default_config(16, 2, 32, "gfx950")
        print(reported)
        assert reported.spills > 100 and reported.scratch > 0, reported
        assert aot.problems(reported_amd_config(16, 32), 2, "bf16", "gfx950")
        assert aot.fits(default, 2, "bf16", "gfx950"), aot.problems(default, 2, "bf16", "gfx950")
        assert 0 < aot.compile_prefix_kernel(default, 2, "bf16", "gfx950").shared <= 163840
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


VARIANTS_SCRIPT = textwrap.dedent(
    """
    import sys
    from mla_verify.aot import MASKS, compile_prefix_kernel
    from mla_verify.config import default_config
    from mla_verify.problem import HEAD_DIMS
    arch = sys.argv[1]
    for dims in HEAD_DIMS:
        config = default_config(16, 4, 8, arch, "bf16", dims)
        for mask in MASKS:
            compile_prefix_kernel(config, 4, "bf16", arch, dims, mask=mask)
            print(dims, mask, "ok")
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(TARGETS))
def test_every_head_dims_and_mask_variant_compiles(arch):
    """Stage 1 for each supported head-dims pair, with no mask, a draft-block
    mask or prefix mask bits too, compiles for each arch (the Triton kernel, or the Hopper one
    where the default picks it)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", VARIANTS_SCRIPT, arch],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("ok") == 9
