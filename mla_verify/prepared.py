"""The host's work of a call, kept per call signature.

What ``verify_mla_fwd`` and ``verify_mla_paged`` derive before their
launches (the gate's answer, the argument checks, the tuned config, the
plan, the paged kernel's grid) reads the call's metadata
alone: each tensor's shape, strides, dtype and device, its data pointer's
alignment (the plan's copies need 16 bytes), which tensors share data (V a
view of K), the scalars, and the tables loaded. An engine repeats a few
such signatures on every layer of every step, so the first call of a
signature does the work and keeps its result, and later calls look it up.
The work took 96-134 us of host time a call on an H100's host; the lookup
is about an eighth of a kept call's 96 us on an H200's (RESULTS.md, "The
host's cost of a call").

A call whose signature cannot be formed (an argument that is neither a
tensor nor a hashable scalar) takes the full path every time, as do calls
in the debug mode, which reads values. Only successful preparations are
kept: a call that raises raises again. ``clear`` forgets every signature;
``lookup.reload_tables`` calls it, and tests that patch the planning
functions start from it.
"""

from __future__ import annotations

import contextlib

import torch

MAX_SIGNATURES = 4096  # then the cache starts again
_ALIGN_MASK = 15  # pointer bits kept: 16-byte alignment, all the plan reads

_kept: dict[tuple, object] = {}


def _tensor_key(t: torch.Tensor | None) -> tuple | None:
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(type(t).__name__)
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & _ALIGN_MASK)


def signature(
    tensors: tuple[torch.Tensor | None, ...],
    scalars: tuple,
    same_data: tuple[tuple[torch.Tensor, torch.Tensor], ...] = (),
) -> tuple | None:
    """The key of a call: ``tensors`` (None where an optional one is absent)
    by their metadata, ``scalars`` by type and value, and for each pair of
    ``same_data`` whether both start at the same address (a view of the
    other, which the caller's plan reads). None where it cannot be formed."""
    try:
        tensor_keys = tuple(_tensor_key(t) for t in tensors)
        shared = tuple(a.data_ptr() == b.data_ptr() for a, b in same_data)
    except (TypeError, AttributeError, RuntimeError, NotImplementedError):
        return None  # not tensors; fake tensors, whose data cannot be read
    return (tensor_keys, tuple((type(s), s) for s in scalars), shared)


def get(key: tuple | None) -> object | None:
    """What the first call of ``key`` kept, or None."""
    if key is None:
        return None
    try:
        return _kept.get(key)
    except TypeError:  # an unhashable scalar
        return None


def keep(key: tuple | None, prepared: object) -> None:
    if key is None:
        return
    if len(_kept) >= MAX_SIGNATURES:
        _kept.clear()
    with contextlib.suppress(TypeError):  # an unhashable scalar: not kept
        _kept[key] = prepared


def clear() -> None:
    _kept.clear()
