"""Kernel launches with Triton's binding kept per signature
(mla_verify.launcher): what a signature tells apart, and on a GPU that a
kept signature launches the kernel Triton would have picked."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from mla_verify import launcher


@triton.jit
def _scaled_copy(X, Y, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(Y + offs, tl.load(X + offs, mask=mask) * alpha, mask=mask)


@dataclasses.dataclass
class _Descriptor:  # the fields of a TMA descriptor the key reads
    base: torch.Tensor
    shape: list
    block_shape: list


def _key(*args, **kwargs):
    return launcher._signature(args, kwargs)


def test_signature_tells_apart_what_triton_specialises_on():
    x = torch.zeros(64)
    assert _key(x, 16, 1.5, BLOCK=64) == _key(torch.zeros(64), 16, 1.5, BLOCK=64)
    others = [
        _key(x[1:], 16, 1.5, BLOCK=64),  # 4 bytes further: another alignment
        _key(x.to(torch.float16), 16, 1.5, BLOCK=64),
        _key(x, 1, 1.5, BLOCK=64),  # Triton makes an int of 1 a constant
        _key(x, 17, 1.5, BLOCK=64),
        _key(x, 16, 2.5, BLOCK=64),
        _key(x, True, 1.5, BLOCK=64),  # True == 1 in Python, not to Triton
        _key(x, 16, 1.5, BLOCK=32),
        _key(x, 16, 1.5, BLOCK=64.0),  # a constexpr's type counts too
        _key(x, 16, 1.5, BLOCK=64, num_warps=8),
    ]
    keys = {_key(x, 16, 1.5, BLOCK=64), *others}
    assert len(keys) == 1 + len(others)


def test_signature_reads_a_descriptors_fields():
    x = torch.zeros(64, 64)
    a = _key(_Descriptor(x, [64, 64], [16, 64]))
    assert a == _key(_Descriptor(torch.zeros(64, 64), [64, 64], [16, 64]))
    assert a != _key(_Descriptor(x, [64, 64], [32, 64]))
    assert a != _key(_Descriptor(x[:, 1:], [64, 63], [16, 64]))


def test_arguments_it_cannot_key_have_no_signature():
    """A list among the arguments leaves the call without a signature; an
    unhashable keyword value makes one no lookup can hash: either way the
    launch goes through Triton."""
    assert _key(torch.zeros(4), [1, 2]) == ()
    with pytest.raises(TypeError):
        hash(_key(torch.zeros(4), BLOCK={64: 1}))


def test_passes_through_where_it_keeps_nothing(device):
    """In Triton's interpreter (no GPU) the kernel is not a JIT function:
    the call goes through as written."""
    x = torch.randn(100, device=device)
    y = torch.empty_like(x)
    launcher.launch(_scaled_copy, (2,), x, y, 100, 2.0, BLOCK=64)
    torch.testing.assert_close(y, x * 2.0)


@pytest.mark.gpu
def test_gpu_kept_signatures_launch_the_kernel_triton_picks(monkeypatch):
    """Calls that differ in what Triton specialises on (alignment, an int of
    1, of 16, of 17) each compute right, first and again; a repeated
    signature does not go through Triton's binding."""
    launcher.clear()
    through_triton = []
    real_run = _scaled_copy.run

    def spy(*args, **kwargs):
        through_triton.append(args)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(_scaled_copy, "run", spy)
    base = torch.randn(4096, device="cuda")
    cases = [(0, 1000), (1, 1000), (0, 1), (0, 16), (3, 17), (0, 1024)]
    for _ in range(2):
        for offset, n in cases:
            x = base[offset : offset + n]
            y = torch.full((n + 8,), float("nan"), device="cuda")
            launcher.launch(_scaled_copy, (triton.cdiv(n, 128),), x, y, n, 0.5, BLOCK=128)
            torch.testing.assert_close(y[:n], x * 0.5, rtol=0, atol=0)
            assert bool(y[n:].isnan().all())  # nothing written past n
    assert len(through_triton) == len(cases)
