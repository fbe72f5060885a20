"""Test set-up: without a GPU, kernels run in Triton's CPU interpreter.

TRITON_INTERPRET must be set before Triton decorates the kernels, i.e.
before the first ``import mla_verify``: this module is imported first.
"""

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_GPU else "cpu"


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
