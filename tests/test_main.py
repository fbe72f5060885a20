"""``python -m mla_verify``, the first command a newcomer runs: a PASS or
FAIL verdict against the stated tolerance, a fixed seed, every size checked
(0 prefix tokens is a case, not the default), and bad input answered with one
line and a nonzero status. CPU only (the interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mla_verify import __main__ as cli
from mla_verify import testing

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--heads", "2", "--draft-len", "2", "--context", "10"]


def run_main(capsys, argv):
    rc = cli.main(argv)
    return rc, capsys.readouterr().out


def test_the_readme_command_prints_pass_in_a_fresh_process():
    """Verbatim, without TRITON_INTERPRET: the command switches it on itself."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "mla_verify"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("PASS     relative error ")
    assert f"at most {testing.MAX_RELATIVE_ERROR:.0e}" in last and "seed 0" in last
    assert "Traceback" not in proc.stderr and "NumPy" not in proc.stderr


def test_context_zero_runs_a_prefix_of_zero(capsys):
    rc, out = run_main(capsys, SMALL[:-1] + ["0"])
    assert rc == 0
    assert "context=0" in out and out.splitlines()[-1].startswith("PASS")


def test_fp8_runs_state_their_tolerance_not_bf16s(capsys):
    rc, out = run_main(capsys, [*SMALL, "--kv-dtype", "fp8_e4m3"])
    assert rc == 0 and out.splitlines()[-1].startswith("PASS")
    assert "bf16" not in out


@pytest.mark.parametrize("dims", ["256", "128x128"])
def test_shared_kv_head_dims_run_with_v_a_cache_of_its_own(capsys, dims):
    rc, out = run_main(capsys, [*SMALL, "--head-dims", dims, "--kv-dtype", "fp8_e4m3"])
    assert rc == 0 and out.splitlines()[-1].startswith("PASS")
    qk = dims.partition("x")[0]
    assert f"head dims {qk}/{qk}" in out


def test_the_seed_makes_the_figure_reproducible(capsys):
    first = run_main(capsys, SMALL)[1].splitlines()[-1]
    second = run_main(capsys, SMALL)[1].splitlines()[-1]
    other = run_main(capsys, [*SMALL, "--seed", "1"])[1].splitlines()[-1]
    assert first == second
    assert first != other and other.endswith("seed 1)")


def test_a_wrong_result_prints_fail_and_exits_1(capsys, monkeypatch):
    def wrong(out, ref, **kwargs):
        raise AssertionError("output: relative error 0.5")

    monkeypatch.setattr(testing, "check_close", wrong)
    rc, out = run_main(capsys, SMALL)
    assert rc == 1
    assert out.splitlines()[-1].startswith("FAIL     output: relative error 0.5 against the")


BAD = {
    "heads_0": (["--heads", "0"], "--heads: expected an int in 1..1024, got 0"),
    "heads_negative": (["--heads", "-3"], "--heads: expected an int in 1..1024, got -3"),
    "heads_too_many": (["--heads", "1025"], "--heads: expected an int in 1..1024, got 1025"),
    "draft_len_17": (["--draft-len", "17"], "--draft-len: expected an int in 1..16, got 17"),
    "draft_len_0": (["--draft-len", "0"], "--draft-len: expected an int in 1..16, got 0"),
    "batch_size_0": (["--batch-size", "0"], "--batch-size: expected an int in 1..65535, got 0"),
    "context_negative": (
        ["--context", "-5"],
        "--context: expected an int in 0..1073741823, got -5",  # int32 indices, 2 requests
    ),
    "seed_negative": (["--seed", "-1"], "--seed: expected an int in 0.."),
    "kv_dtype_int8": (["--kv-dtype", "int8"], "argument --kv-dtype: invalid choice: 'int8'"),
    "heads_not_a_number": (["--heads", "x"], "argument --heads: invalid int value: 'x'"),
    "head_dims_192": (["--head-dims", "192x128"], "--head-dims: expected head dims among"),
    "head_dims_word": (["--head-dims", "mla"], "--head-dims: expected head dims among"),
}


@pytest.mark.parametrize("argv, message", BAD.values(), ids=BAD.keys())
def test_bad_input_is_one_line_and_exit_status_2(cli_error, argv, message):
    assert cli_error(cli.main, argv).startswith(f"python -m mla_verify: error: {message}")


def test_every_option_has_help():
    parser = cli._parser()
    for action in parser._actions:
        assert action.help, action.option_strings
    batch = next(a for a in parser._actions if "--batch-size" in a.option_strings)
    assert batch.help == "requests in the batch (default 32 on a GPU, 2 on CPU)"
