"""Every public entry point checks its sizes, dtype, arch and device against
problem.py's ranges and device.py's arch names, with a ValueError naming the
argument, the allowed values and the value; and they agree with the gate.
CPU only."""

from __future__ import annotations

import logging

import pytest
import torch

import mla_verify
from mla_verify import problem

# name -> call(num_heads, draft_len, batch_size), each spelled as the entry
# point takes it; the batch argument's name as the entry point spells it.
ENTRY_POINTS = {
    "block_config": (lambda h, l, b: mla_verify.block_config(h, l, b, arch="sm90"), "batch_size"),
    "resolve_config": (
        lambda h, l, b: mla_verify.resolve_config(h, l, b, arch="gfx950"),
        "batch_size",
    ),
    "default_config": (lambda h, l, b: mla_verify.default_config(h, l, b, "sm90"), "batch_size"),
    "workspace_bytes": (
        lambda h, l, b: mla_verify.workspace_bytes(b, h, l, arch="sm90"),
        "max_batch_size",
    ),
    "prepare_workspace": (
        lambda h, l, b: mla_verify.prepare_workspace(b, h, l, device="cpu"),
        "max_batch_size",
    ),
}
GOOD = {"num_heads": 8, "draft_len": 4, "batch": 2}
BAD = {
    "num_heads": [0, -3, 1025, True, 2.0],
    "draft_len": [0, 17, -1],
    "batch": [0, -1, -5, 65536, 100000],
}
RANGES = {
    "num_heads": (problem.MIN_HEADS, problem.MAX_HEADS),
    "draft_len": (problem.MIN_DRAFT_LEN, problem.MAX_DRAFT_LEN),
    "batch": (problem.MIN_BATCH_SIZE, problem.MAX_BATCH_SIZE),
}
CASES = [
    pytest.param(point, arg, value, id=f"{point}-{arg}={value!r}")
    for point in ENTRY_POINTS
    for arg, values in BAD.items()
    for value in values
]


@pytest.mark.parametrize("point, arg, value", CASES)
def test_bad_sizes_name_the_argument_range_and_value(point, arg, value):
    call, batch_name = ENTRY_POINTS[point]
    sizes = GOOD | {arg: value}
    name = batch_name if arg == "batch" else arg
    low, high = RANGES[arg]
    with pytest.raises(ValueError) as info:
        call(sizes["num_heads"], sizes["draft_len"], sizes["batch"])
    assert str(info.value) == f"{name}: expected an int in {low}..{high}, got {value!r}"


@pytest.mark.parametrize("point", list(ENTRY_POINTS))
def test_range_ends_are_accepted(point):
    call, _ = ENTRY_POINTS[point]
    call(problem.MIN_HEADS, problem.MAX_DRAFT_LEN, 1)
    call(problem.MAX_HEADS, problem.MIN_DRAFT_LEN, 1)


def test_lookups_take_the_largest_batch():
    mla_verify.block_config(16, 4, problem.MAX_BATCH_SIZE, arch="sm90")


def _gate(num_heads: int, draft_len: int, batch_size: int) -> bool:
    t = lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, dtype=dtype, device="meta")  # noqa: E731
    rows = batch_size * draft_len
    k_buffer = t(100, 1, 576)
    return mla_verify.can_handle(
        t(rows, num_heads, 576),
        t(rows, 1, 576),
        t(rows, 1, 512),
        k_buffer,
        k_buffer[..., :512],
        t(batch_size + 1, dtype=torch.int32),
        t(batch_size + 1, dtype=torch.int32),
        t(50, dtype=torch.int32),
        None,
        True,
        None,
        draft_len,
    )


@pytest.mark.parametrize(
    "sizes",
    [(8, problem.MAX_DRAFT_LEN, 2), (8, problem.MAX_DRAFT_LEN + 1, 2), (8, 4, 1)],
    ids=["longest_drafts", "drafts_past_the_range", "one_request"],
)
def test_the_gate_and_the_lookup_agree(sizes):
    heads, draft_len, bs = sizes
    try:
        mla_verify.block_config(heads, draft_len, bs, arch="sm90")
        looked_up = True
    except ValueError:
        looked_up = False
    assert _gate(heads, draft_len, bs) is looked_up


@pytest.mark.parametrize("call", ["block_config", "workspace_bytes"])
def test_bad_arch_names_the_known_ones(call):
    with pytest.raises(ValueError, match=r"arch: expected an arch name like 'sm90'.*got 'bogus'"):
        if call == "block_config":
            mla_verify.block_config(16, 4, 8, arch="bogus")
        else:
            mla_verify.workspace_bytes(8, 16, 4, arch="bogus")


def test_bad_kv_dtype_and_sms():
    with pytest.raises(ValueError, match=r"kv_dtype: expected one of .*got torch.int8"):
        mla_verify.prepare_workspace(8, 16, 4, torch.int8, device="cpu")
    with pytest.raises(ValueError, match=r"kv_dtype: expected one of .*got torch.float32"):
        mla_verify.workspace_bytes(8, 16, 4, torch.float32, arch="sm90")
    with pytest.raises(ValueError, match=r"sms: expected an int in 1\.\.\d+, got 0"):
        mla_verify.workspace_bytes(8, 16, 4, arch="sm90", sms=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_prepare_workspace_without_a_gpu_names_its_device_argument():
    """No 'pass arch=...' advice: prepare_workspace takes a device, not an arch."""
    with pytest.raises(ValueError) as info:
        mla_verify.prepare_workspace(8, 8, 4)
    message = str(info.value)
    assert message.startswith("device: expected a CUDA/ROCm device, or 'cpu'")
    assert "no CUDA or ROCm GPU is visible" in message and message.endswith("got the default, cuda")
    assert "arch=" not in message


@pytest.mark.parametrize("device", ["meta", "bogus"])
def test_prepare_workspace_refuses_devices_it_cannot_serve(device):
    expected = rf"device: expected a CUDA/ROCm device, or 'cpu'.*got '?{device}'?$"
    with pytest.raises(ValueError, match=expected):
        mla_verify.prepare_workspace(8, 8, 4, device=device)


def test_prepare_workspace_on_cpu_sizes_the_interpreters_config_without_a_tune_warning(caplog):
    with caplog.at_level(logging.INFO, logger="mla_verify"):
        nbytes = mla_verify.prepare_workspace(8, 8, 4, device="cpu")
    assert nbytes > 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert nbytes == mla_verify.workspace_bytes(8, 8, 4, arch="cpu")
