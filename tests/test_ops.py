"""The torch.library ops: schemas, fake implementations, opcheck, and
torch.compile(fullgraph=True) of functions that call them, equal to eager."""

from __future__ import annotations

import pytest
import torch

import mla_verify
from mla_verify import ops
from mla_verify.testing import check_close, make_batch, make_paged_batch

H, L = 2, 2


def _paged_args(batch):
    return (batch.q, batch.kv_cache, batch.block_table, batch.cache_seqlens)


def test_ops_are_registered_at_import():
    names = ("verify_mla_paged", "verify_mla_paged_out", "paged_metadata_out", "verify_mla_fwd")
    schemas = {name: str(getattr(torch.ops.mla_verify, name).default._schema) for name in names}
    assert schemas["verify_mla_paged"].endswith("-> Tensor")
    assert "Tensor? kv_indices=None" in schemas["verify_mla_paged"]
    assert "Tensor(a4!) out" in schemas["verify_mla_paged_out"]
    assert "Tensor(a6!) kv_indices" in schemas["paged_metadata_out"]
    assert "Tensor(a3!) o_extend" in schemas["verify_mla_fwd"]


def test_fake_implementations_give_shapes_on_meta():
    q = torch.empty(3, L, 16, 576, dtype=torch.float16, device="meta")
    cache = torch.empty(10, 64, 1, 576, dtype=torch.float8_e4m3fn, device="meta")
    table = torch.empty(3, 5, dtype=torch.int32, device="meta")
    lens = torch.empty(3, dtype=torch.int32, device="meta")
    out = torch.ops.mla_verify.verify_mla_paged(q, cache, table, lens, None, 0.5, 2.0)
    assert out.shape == (3, L, 16, 512) and out.dtype == torch.float16
    assert out.device.type == "meta"


def test_opcheck_paged(device):
    batch = make_paged_batch(
        H, L, [5, 0], page_size=16, seed=20, k_scale=0.5, v_scale=1.5, device=device
    )
    torch.library.opcheck(
        torch.ops.mla_verify.verify_mla_paged.default,
        (*_paged_args(batch), None, 0.5, 1.5),
    )
    torch.library.opcheck(
        torch.ops.mla_verify.verify_mla_paged_out.default,
        (*_paged_args(batch), batch.new_output(), 0.1, 1.0, 1.0),
    )


def test_opcheck_paged_with_metadata(device):
    """The step's metadata op, and the paged ops given its tensors."""
    batch = make_paged_batch(H, L, [5, 0], page_size=16, seed=27, device=device)
    metadata = batch.metadata()
    torch.library.opcheck(
        torch.ops.mla_verify.paged_metadata_out.default,
        (batch.kv_cache, batch.block_table, batch.cache_seqlens, L, *metadata.tensors()),
    )
    torch.library.opcheck(
        torch.ops.mla_verify.verify_mla_paged.default,
        (*_paged_args(batch), None, 1.0, 1.0, *metadata.tensors()),
    )
    torch.library.opcheck(
        torch.ops.mla_verify.verify_mla_paged_out.default,
        (*_paged_args(batch), batch.new_output(), None, 1.0, 1.0, *metadata.tensors()),
    )
    partial = metadata.tensors()[:2]
    with pytest.raises(ValueError, match="expected all three"):
        torch.ops.mla_verify.verify_mla_paged(*_paged_args(batch), None, 1.0, 1.0, *partial)
    # The raw metadata op checks its arguments as paged_metadata does.
    bad_lengths = batch.cache_seqlens[:1]
    with pytest.raises(ValueError, match="cache_seqlens.shape"):
        torch.ops.mla_verify.paged_metadata_out(
            batch.kv_cache, batch.block_table, bad_lengths, L, *metadata.tensors()
        )


def test_opcheck_verify_mla_fwd(device):
    batch = make_batch(H, L, [5, 0], seed=21, device=device)
    torch.library.opcheck(
        torch.ops.mla_verify.verify_mla_fwd.default, batch.sglang_args(batch.new_output())
    )


def test_opcheck_verify_mla_fwd_tree_ragged(device):
    """The op carries a tree mask with its prefix bits read, ragged counts."""
    batch = make_batch(
        H,
        3,
        [5, 0],
        draft_counts=[3, 1],
        mask="tree",
        hide_prefix=0.4,
        skip_prefix_custom_mask=False,
        seed=26,
        device=device,
    )
    args = list(batch.sglang_args(batch.new_output()))  # the tree mask and its indptr
    out = args[3]
    torch.library.opcheck(
        torch.ops.mla_verify.verify_mla_fwd.default,
        (*args, 1.0, 1.0, batch.sm_scale, False),
    )
    torch.ops.mla_verify.verify_mla_fwd(*args, 1.0, 1.0, batch.sm_scale, False)
    check_close(out, batch.reference())


@pytest.mark.parametrize("with_metadata", [False, True], ids=["", "metadata"])
def test_compiled_paged_equals_eager(with_metadata, device):
    """A function calling the public entry point (with and without out=)
    compiles with fullgraph=True: the call becomes the custom op. With
    metadata, the step makes it first (its own op) and both calls take it."""
    batch = make_paged_batch(
        H, L, [9, 0, 20], page_size=16, seed=22, k_scale=0.5, v_scale=1.5, device=device
    )

    def step(q, kv_cache, block_table, cache_seqlens, out):
        given = {"k_scale": 0.5, "v_scale": 1.5}
        if with_metadata:
            given["metadata"] = mla_verify.paged_metadata(kv_cache, block_table, cache_seqlens, L)
        fresh = mla_verify.verify_mla_paged(q, kv_cache, block_table, cache_seqlens, **given)
        mla_verify.verify_mla_paged(q, kv_cache, block_table, cache_seqlens, out=out, **given)
        return fresh.float() + 1

    eager_out, compiled_out = batch.new_output(), batch.new_output()
    eager = step(*_paged_args(batch), eager_out)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(*_paged_args(batch), compiled_out)
    assert torch.equal(compiled, eager)
    assert torch.equal(compiled_out, eager_out)
    check_close(compiled_out, batch.reference())
    assert torch.equal(compiled - 1, compiled_out.float())


def test_compiled_sglang_call_equals_eager(device):
    """ops.verify_mla_fwd in a compiled graph: the gate runs at trace time,
    the op declares that it writes o_extend."""
    batch = make_batch(H, L, [9, 0, 20], seed=23, device=device)

    def step(o, *args):
        wrote = ops.verify_mla_fwd(args[0], *args[1:3], o, *args[3:], sm_scale=batch.sm_scale)
        return o.float() * 2 if wrote else None

    args = batch.sglang_args(None)
    rest = (args[0], args[1], args[2], *args[4:])
    eager_o, compiled_o = batch.new_output(), batch.new_output()
    eager = step(eager_o, *rest)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(compiled_o, *rest)
    assert torch.equal(compiled, eager) and torch.equal(compiled_o, eager_o)
    check_close(compiled_o, batch.reference())


def test_refused_call_falls_back_when_compiled():
    batch = make_batch(H, L, [9, 0], seed=24)

    def step(o):
        args = batch.sglang_args(o)
        return ops.verify_mla_fwd(*args, sliding_window_size=64)

    o = batch.new_output()
    torch._dynamo.reset()
    assert torch.compile(step, fullgraph=True)(o) is False
    assert bool(o.isnan().all())


def test_raw_op_refuses_what_the_gate_refuses():
    batch = make_batch(H, L, [9, 0], seed=25)
    args = list(batch.sglang_args(batch.new_output()))
    args[10] = False  # not causal
    with pytest.raises(ValueError, match="can_handle"):
        torch.ops.mla_verify.verify_mla_fwd(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_gpu_compiled_paged_equals_eager(kv):
    over = {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.75, "v_scale": 1.3} if kv == "fp8" else {}
    batch = make_paged_batch(16, 4, [3000, 0, 700, 64], page_size=64, device="cuda", **over)

    def step(q, kv_cache, block_table, cache_seqlens):
        o = mla_verify.verify_mla_paged(
            q, kv_cache, block_table, cache_seqlens, k_scale=batch.k_scale, v_scale=batch.v_scale
        )
        return o.float() * 2

    eager = step(*_paged_args(batch))
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)(*_paged_args(batch))
    assert torch.equal(compiled, eager)
    check_close(compiled / 2, batch.reference())
