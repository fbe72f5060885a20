"""Every config of every shipped table compiles for its arch and fits its
shared memory / LDS, checked ahead of time on a machine without that GPU."""

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
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from mla_verify.aot import TARGETS, compile_prefix_kernel
    from mla_verify.config import VerifyConfig
    arch, path = sys.argv[1], sys.argv[2]
    table = json.load(open(path))
    kernels = set()
    for entry in table["entries"].values():
        for bucket in entry["buckets"].values():
            # Split count and share floor are runtime values: one compile.
            config = VerifyConfig.from_dict(bucket["config"]).with_splits(1).with_min_share(None)
            dims = tuple(entry.get("head_dims", (576, 512)))
            kernels.add((entry["draft_len"], entry["kv_dtype"], config, dims))
    for draft_len, kv_dtype, config, dims in sorted(kernels, key=repr):
        shared = compile_prefix_kernel(config, draft_len, kv_dtype, arch, dims)
        print(json.dumps([draft_len, kv_dtype, config.to_dict(), shared]))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("arch", SHIPPED)
def test_shipped_configs_compile_and_fit(arch):
    assert arch in TARGETS, f"no compile target known for shipped table {arch}.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, arch, str(REPO / "configs" / f"{arch}.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert rows, "no kernels compiled"
    limit = TARGETS[arch][1]
    too_big = [r for r in rows if r[3] > limit]
    assert not too_big, f"over {limit} B of shared memory: {too_big}"


VARIANTS_SCRIPT = textwrap.dedent(
    """
    import sys
    from mla_verify.aot import compile_prefix_kernel
    from mla_verify.config import default_config
    from mla_verify.problem import HEAD_DIMS
    arch = sys.argv[1]
    for dims in HEAD_DIMS:
        config = default_config(16, 4, 8, arch, "bf16", dims)
        for prefix_mask in (False, True):
            compile_prefix_kernel(config, 4, "bf16", arch, dims, prefix_mask=prefix_mask)
            print(dims, prefix_mask, "ok")
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(TARGETS))
def test_every_head_dims_and_mask_variant_compiles(arch):
    """Stage 1 for each supported head-dims pair, reading prefix mask bits
    or not, compiles for each arch (the Triton kernel, or the Hopper one
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
    assert proc.stdout.count("ok") == 6
