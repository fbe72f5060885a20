"""A call's host work kept per signature (mla_verify.prepared): the second
call of a signature skips it and still computes its own inputs; whatever the
plan reads starts a new signature; refusals are kept, errors are not."""

from __future__ import annotations

import pytest
import torch

from mla_verify import api, lookup, paged, prepared, set_debug, verify_mla_fwd
from mla_verify.testing import check_close, make_batch, make_paged_batch

BS, L, H = 2, 3, 4


def _counted(monkeypatch, module, name: str) -> list:
    """``module.name`` replaced by a spy; returns the list of its calls."""
    calls = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.fixture
def prepares(monkeypatch):
    """The verify_mla_fwd calls that did the full host work."""
    return _counted(monkeypatch, api, "_prepare")


def _run(batch, out=None, **over):
    out = batch.new_output() if out is None else out
    return batch.run(out) if not over else verify_mla_fwd(*batch.sglang_args(out), **over), out


def test_second_call_of_a_signature_skips_the_host_work(device, prepares):
    """Same shapes, other values and slots: the second call reuses the first's
    plan, and each output matches its own reference."""
    for seed in (1, 2, 3):
        batch = make_batch(H, L, [10, 5], device=device, seed=seed)
        wrote, out = _run(batch)
        assert wrote
        check_close(out, batch.reference())
    assert len(prepares) == 1


def test_what_the_plan_reads_starts_a_new_signature(device, prepares):
    """V a pool of its own rather than K's view, a longer pool, a strided q:
    each a signature of its own, each computed right."""
    batches = [
        make_batch(H, L, [10, 5], device=device, seed=1),
        make_batch(H, L, [10, 5], device=device, seed=1, separate_v=True),
        make_batch(H, L, [10, 5], device=device, seed=1, pool_slots=200),
        make_batch(H, L, [10, 5], device=device, seed=1, strided_q=True),
    ]
    for batch in batches:
        wrote, out = _run(batch)
        assert wrote
        check_close(out, batch.reference())
    assert len(prepares) == len(batches)


def test_a_pointer_alignment_starts_a_new_signature():
    """The plan's copies need 16-byte aligned rows: a q that starts 2 bytes
    further in is another signature."""
    base = torch.zeros(64 * 576 + 1, dtype=torch.bfloat16)
    aligned = base[: 6 * 4 * 576].view(6, 4, 576)
    shifted = base[1 : 1 + 6 * 4 * 576].view(6, 4, 576)
    assert prepared.signature((aligned,), ()) != prepared.signature((shifted,), ())
    assert prepared.signature((aligned,), ()) == prepared.signature((aligned.clone(),), ())


def test_scalars_are_told_apart_by_type():
    """1, 1.0 and True are equal in Python: a key keeps their types, so a
    bool scale that must be refused never finds a float's call."""
    keys = {prepared.signature((), (value,)) for value in (1, 1.0, True)}
    assert len(keys) == 3


def test_a_refusal_is_kept(device, prepares):
    batch = make_batch(H, L, [10, 5], device=device)
    for _ in range(2):
        out = batch.new_output()
        assert verify_mla_fwd(*batch.sglang_args(out), logit_cap=30.0) is False
        assert bool(out.isnan().all())
    assert len(prepares) == 1


def test_an_error_is_raised_again(device, prepares):
    batch = make_batch(H, L, [10, 5], device=device)
    wrong = torch.empty(BS * L, H, 500, dtype=batch.q.dtype, device=batch.q.device)
    for _ in range(2):
        with pytest.raises(ValueError, match="o_extend.shape"):
            verify_mla_fwd(*batch.sglang_args(wrong))
    assert len(prepares) == 2


def test_debug_mode_keeps_nothing(device, prepares):
    batch = make_batch(H, L, [10, 5], device=device)
    set_debug(True)
    try:
        for _ in range(2):
            wrote, out = _run(batch)
            assert wrote
    finally:
        set_debug(False)
    check_close(out, batch.reference())
    assert len(prepares) == 2


def test_arguments_that_cannot_be_keyed_take_the_full_path(device, prepares):
    """A mask given as a list has no signature: the gate refuses it each time."""
    batch = make_batch(H, L, [10, 5], device=device)
    for _ in range(2):
        out = batch.new_output()
        args = list(batch.sglang_args(out))
        args[9] = [True] * 18  # custom_mask
        args[11] = batch.qo_indptr  # mask_indptr
        assert verify_mla_fwd(*args) is False
    assert len(prepares) == 2


def test_reloading_the_tables_forgets_every_signature(device, prepares):
    batch = make_batch(H, L, [10, 5], device=device)
    _run(batch)
    lookup.reload_tables()
    _run(batch)
    assert len(prepares) == 2


def test_paged_calls_keep_their_host_work(device, monkeypatch):
    """verify_mla_paged: the second call of a signature skips its host work,
    and each output matches its own reference."""
    calls = _counted(monkeypatch, paged, "_prepare")
    for seed in (1, 2):
        batch = make_paged_batch(H, L, [70, 5], page_size=16, device=device, seed=seed)
        check_close(batch.run(), batch.reference())
    assert len(calls) == 1


def test_a_kept_paged_call_keeps_its_inner_call_too(device, monkeypatch, prepares):
    """The translated call's verify_mla_fwd work is kept with the paged
    call's: after the first call, one signature a call (the paged one),
    and each output still matches its own reference."""
    signatures = _counted(monkeypatch, prepared, "signature")
    for seed in (1, 2, 3):
        batch = make_paged_batch(H, L, [70, 5], page_size=16, device=device, seed=seed)
        check_close(batch.run(), batch.reference())
    assert len(prepares) == 1
    assert len(signatures) == 2 + 1 + 1  # the first call forms its inner one too


def test_a_replaced_seesaw_rule_starts_a_new_signature(monkeypatch):
    """The benchmark forces the seesaw kernel or the translated call by
    replacing paged.seesaw_shape: a call after that must not reuse the
    rule's decision."""
    batch = make_paged_batch(H, L, [70, 5], page_size=16, seed=1)
    tensors = (batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens, None)
    before = prepared.signature(tensors, (None, 1.0, 1.0, paged.seesaw_shape))
    monkeypatch.setattr(paged, "seesaw_shape", lambda batch_size: True)
    assert prepared.signature(tensors, (None, 1.0, 1.0, paged.seesaw_shape)) != before
