"""scripts/profile_call.py on CPU: its draft-count syntax, what it refuses,
and a small ragged shape's call under the interpreter with counts of its
own. What it is for, profiling a GPU call, needs a GPU and a profiler."""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import profile_call  # noqa: E402  (scripts/ is not a package)


def test_draft_counts_repeat_and_list():
    assert profile_call.parse_counts("4*3,1,2*2") == [4, 4, 4, 1, 2, 2]


@pytest.mark.parametrize(
    "argv, match",
    [
        (["H8L2B2C100", "--draft-counts", "2"], "expected 2 counts, got 1"),
        (["H8L2B2C100", "--draft-counts", "2,3"], r"expected counts in 1..2, got \[2, 3\]"),
        (["H8L2B2C100", "--draft-counts", "2,x"], "expected counts like 4\\*31,3, got 'x'"),
        (["H8L2B2C100", "--contender", "paged"], "H8L2B2C100: only on -page<N> rows"),
        (["H8L2B2C100-ragged", "--contender", "flashmla"], "H8L2B2C100-ragged: not this call"),
        (["H8L2B2C100-page16", "--contender", "flashmla"], "FlashMLA's dense decode reads 64"),
        (["H8L2B2C100-fp8", "--contender", "flashmla"], "times FlashMLA on bf16 KV only"),
        (
            ["H8L2B2C100-page16", "--contender", "paged", "--draft-counts", "2,2"],
            "--draft-counts: expected --contender tuned, got paged",
        ),
        (["H8L2B2C100", "--calls", "0"], "--calls: expected 1 or more, got 0"),
    ],
)
def test_bad_input_names_the_argument(cli_error, argv, match):
    assert re.search(match, cli_error(profile_call.main, argv))


def test_calls_with_the_counts_given(caplog):
    with caplog.at_level(logging.INFO, logger="profile_call"):
        status = profile_call.main(["H8L2B2C100-ragged", "--calls", "1", "--draft-counts", "1,2"])
    assert status == 0
    assert "H8L2B2C100-ragged: 1 calls of tuned, draft counts [1, 2]" in caplog.text


def test_paged_calls_on_the_shapes_pages(caplog):
    with caplog.at_level(logging.INFO, logger="profile_call"):
        status = profile_call.main(["H8L2B2C100-page16", "--contender", "paged", "--calls", "1"])
    assert status == 0
    assert "H8L2B2C100-page16: 1 calls of paged" in caplog.text


@pytest.mark.skipif(
    importlib.util.find_spec("flash_mla") is not None, reason="FlashMLA is importable here"
)
def test_flashmla_without_flash_mla_says_why(caplog):
    with caplog.at_level(logging.ERROR, logger="profile_call"):
        status = profile_call.main(["H8L2B2C100", "--contender", "flashmla"])
    assert status == 1
    assert "import flash_mla failed" in caplog.text
