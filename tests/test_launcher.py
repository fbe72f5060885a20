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


class _FakeKernel:
    """Stands for a kept kernel: the launch functions the tests replace
    record which path a launch took instead of launching."""


def _fake_launches(monkeypatch) -> dict[str, list]:
    """launcher's keyed path and kept-kernel path replaced by recorders: the
    keyed one keeps a fake kernel per function, as a first launch does."""
    taken = {"keyed": [], "kept": []}
    kept = {}

    def keyed(fn, grid, args, kwargs):
        taken["keyed"].append(fn)
        return kept.setdefault(fn, launcher._Compiled(_FakeKernel(), (), {}))

    def launch_kept(compiled, grid, args, kwargs):
        taken["kept"].append(compiled)

    monkeypatch.setattr(launcher, "_launch", keyed)
    monkeypatch.setattr(launcher, "_launch_kept", launch_kept)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return taken


def _call(recording, *fns):
    with launcher.replayed(recording):
        for fn in fns:
            launcher.launch(fn, (1,))


def test_a_recording_replays_its_launches_in_order(monkeypatch):
    """The first call's launches are keyed and recorded; the second's take
    the recorded kernels without forming a signature."""
    taken = _fake_launches(monkeypatch)
    recording = launcher.Recording()
    _call(recording, "stage1", "stage2")
    assert taken["keyed"] == ["stage1", "stage2"] and taken["kept"] == []
    _call(recording, "stage1", "stage2")
    assert taken["keyed"] == ["stage1", "stage2"]
    assert taken["kept"] == [compiled for _, compiled in recording.kernels]
    assert [fn for fn, _ in recording.kernels] == ["stage1", "stage2"]


def test_a_launch_not_recorded_drops_the_recording(monkeypatch):
    """Another kernel where the recording has one: that launch and the rest
    are keyed, and the next call records again."""
    taken = _fake_launches(monkeypatch)
    recording = launcher.Recording()
    _call(recording, "stage1", "stage2")
    _call(recording, "stage1", "other", "stage2")
    assert taken["keyed"] == ["stage1", "stage2", "other", "stage2"]
    assert recording.kernels is None
    _call(recording, "stage1", "other", "stage2")  # records the new order
    _call(recording, "stage1", "other", "stage2")
    assert len(taken["keyed"]) == 7 and len(taken["kept"]) == 1 + 3


def test_errors_clear_and_other_devices_drop_a_recording(monkeypatch):
    taken = _fake_launches(monkeypatch)
    recording = launcher.Recording()
    with pytest.raises(RuntimeError), launcher.replayed(recording):
        launcher.launch("stage1", (1,))
        raise RuntimeError("a call that fails after its first launch")
    assert recording.kernels is None  # an unfinished call records nothing
    _call(recording, "stage1")
    launcher.clear()
    _call(recording, "stage1")  # recorded before clear(): keyed again
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    _call(recording, "stage1")  # recorded on device 0: keyed again
    assert taken["keyed"] == ["stage1"] * 4 and taken["kept"] == []


def test_a_launch_without_a_kept_kernel_is_never_replayed(monkeypatch):
    """A launch that went through Triton as written (the interpreter, an
    argument no signature holds) leaves the recording incomplete."""
    taken = _fake_launches(monkeypatch)
    monkeypatch.setattr(launcher, "_launch", lambda fn, *_: taken["keyed"].append(fn))
    recording = launcher.Recording()
    for _ in range(2):
        _call(recording, "stage1")
    assert recording.kernels is None and taken["keyed"] == ["stage1"] * 2


def test_nested_calls_keep_their_own_recordings(monkeypatch):
    """A paged call's translation, then verify_mla_fwd inside it: each call's
    launches go to its own recording."""
    taken = _fake_launches(monkeypatch)
    outer, inner = launcher.Recording(), launcher.Recording()
    for _ in range(2):
        with launcher.replayed(outer):
            launcher.launch("translate", (1,))
            _call(inner, "stage1", "stage2")
    assert [fn for fn, _ in outer.kernels] == ["translate"]
    assert [fn for fn, _ in inner.kernels] == ["stage1", "stage2"]
    assert taken["keyed"] == ["translate", "stage1", "stage2"] and len(taken["kept"]) == 3


@pytest.mark.gpu
# Pages of 16 take the translated paged call, pages of 64 the seesaw kernel.
@pytest.mark.parametrize("heads,page_size", [(16, 16), (128, 64)])
def test_gpu_replayed_calls_compute_their_own_inputs(monkeypatch, heads, page_size):
    """verify_mla_fwd and verify_mla_paged called again with new values: only
    the first call of each forms launch signatures, and every output matches
    its own reference."""
    from mla_verify.testing import check_close, make_batch, make_paged_batch

    launcher.clear()
    signatures = []
    real = launcher._signature
    monkeypatch.setattr(launcher, "_signature", lambda *a: signatures.append(a) or real(*a))
    makers = [
        lambda seed: make_batch(heads, 2, [300, 70, 1000, 0], device="cuda", seed=seed),
        lambda seed: make_paged_batch(
            heads, 2, [300, 70, 1000, 0], page_size=page_size, device="cuda", seed=seed
        ),
    ]
    for make in makers:
        first = None
        for seed in range(3):
            batch = make(seed)
            out = batch.new_output()
            batch.run(out)
            check_close(out, batch.reference())
            first = len(signatures) if first is None else first
        assert first > 0 and len(signatures) == first
        signatures.clear()
