"""Test set-up: without a GPU, kernels run in Triton's CPU interpreter.

TRITON_INTERPRET must be set before Triton decorates the kernels, i.e.
before the first ``import mla_verify``: this module is imported first.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_GPU else "cpu"
REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture(autouse=True)
def _calls_prepared_afresh():
    """Every test starts with no call signature kept (mla_verify.prepared):
    tests that patch the planning functions must see their patch, not a plan
    an earlier test kept."""
    import mla_verify.prepared

    mla_verify.prepared.clear()


@pytest.fixture
def cli_error(capsys):
    """Runs a CLI's ``main(argv)`` that must refuse its input: exit status 2,
    nothing on stdout, one line on stderr, which it returns."""

    def run(main, argv: list[str]) -> str:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert len(captured.err.splitlines()) == 1, captured.err
        return captured.err

    return run


@pytest.fixture
def run_compiling():
    """Runs ``python -c code`` (or a script path, ``script=True``) with
    ``args`` in a process of its own, without Triton's interpreter (so that
    kernels compile for real targets), the repository first on its path
    and its working directory; returns its stdout, failing the test with
    its stderr's end on a non-zero exit."""

    def run(code: str, *args: str, script: bool = False, timeout: int = 600) -> str:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        command = [sys.executable, code] if script else [sys.executable, "-c", code]
        proc = subprocess.run(
            [*command, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    return run
