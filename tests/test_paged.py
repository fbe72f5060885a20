"""verify_mla_paged (FlashMLA's paged convention) against the float
reference: every page size, ragged lengths down to a sequence holding only
its drafts, fp8 with scales, strided inputs; the translation's buffers
themselves; the workspace under (simulated) capture; bad input and the
debug mode. GPU-marked cases run realistic sizes and a graph replay after
the lengths change."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mla_verify
from mla_verify import hopper, paged, plan, set_debug, verify_mla_paged, workspace
from mla_verify.kernel import INTERPRETED
from mla_verify.paged import PAGE_SIZES, token_pool
from mla_verify.testing import _rows_as_float, check_close, make_paged_batch

REPO = Path(__file__).resolve().parent.parent
H, L = 4, 3
# A sequence holding only its drafts, one inside a page, one past a page
# of 128 (and past BLOCK_N), one of a single prefix token.
LENS = [0, 37, 130, 1]
FP8 = {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.75, "v_scale": 1.3}


def _check(batch, what=""):
    out = batch.new_output()
    result = batch.run(out)
    assert result is out
    check_close(out, batch.reference(), what=what or f"page {batch.page_size}")


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_matches_reference_on_every_page_size(page_size, device):
    _check(make_paged_batch(H, L, LENS, page_size=page_size, seed=page_size, device=device))


@pytest.mark.parametrize("page_size", [1, 64])
def test_fp8_with_scales(page_size, device):
    _check(make_paged_batch(H, L, LENS, page_size=page_size, seed=1, device=device, **FP8))


def test_fp16_with_scales(device):
    """fp16 q and cache; v_scale != 1 takes the drafts' separate V rows."""
    batch = make_paged_batch(
        H,
        2,
        [17, 0, 64],
        page_size=32,
        dtype=torch.float16,
        k_scale=1.5,
        v_scale=0.6,
        seed=2,
        device=device,
    )
    _check(batch)


@pytest.mark.parametrize(
    "draft_len,page_size,lens",
    [(1, 16, [0, 5, 40]), (16, 16, [0, 20]), (5, 1, [0, 0, 3])],
    ids=["L1", "L16_one_page_of_drafts", "L5_page1_only_drafts"],
)
def test_draft_lengths(draft_len, page_size, lens, device):
    _check(make_paged_batch(2, draft_len, lens, page_size=page_size, seed=3, device=device))


def test_strided_inputs(device):
    """Token rows padded to 640 elements, a block table that is a column
    slice of a wider one, and q a view into wider head rows."""
    batch = make_paged_batch(H, L, [50, 0, 9], page_size=16, row_stride=640, seed=4, device=device)
    wide = torch.full((3, 40), -7, dtype=torch.int32, device=device)
    wide[:, : batch.block_table.shape[1]] = batch.block_table
    batch.block_table = wide[:, : batch.block_table.shape[1]]
    q = torch.empty(*batch.q.shape[:3], 600, dtype=batch.q.dtype, device=device)
    q[..., :576] = batch.q
    batch.q = q[..., :576]
    assert not batch.block_table.is_contiguous() and not batch.q.is_contiguous()
    _check(batch, "strided")


def test_out_given_and_not(device):
    batch = make_paged_batch(H, L, LENS, page_size=16, seed=5, device=device)
    fresh = batch.run()
    assert fresh.shape == (len(LENS), L, H, 512) and fresh.dtype == batch.q.dtype
    out = batch.new_output()
    assert batch.run(out) is out
    assert torch.equal(out, fresh)
    check_close(fresh, batch.reference())


def _poison_paged_buffers(device):
    ws = workspace.get_workspace(torch.device(device))
    ws.paged_index.fill_(-(2**30))
    ws.paged_drafts.fill_(0xFF)  # NaN in bf16 / fp16


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_translation_matches_the_host(kv, device):
    """The token-indexed form written into the workspace: indptrs, the
    slots of every prefix position, and the drafts' rows (V their view,
    unscaled: the kernels scale the drafts' values), over poisoned
    buffers."""
    over = FP8 if kv == "fp8" else {}
    batch = make_paged_batch(H, L, LENS, page_size=16, seed=6, device=device, **over)
    mla_verify.prepare_paged_workspace(
        len(LENS), H, L, batch.block_table.shape[1], 16, device=device
    )
    _poison_paged_buffers(device)
    batch.run()
    views = workspace.get_workspace(torch.device(device)).paged_views(
        len(LENS), L, batch.block_table.shape[1] * 16, batch.q.dtype
    )
    bs = len(LENS)
    assert views.qo_indptr.tolist() == [b * L for b in range(bs + 1)]
    assert views.kv_indptr.tolist() == torch.tensor([0, *LENS]).cumsum(0).tolist()
    slots = [batch.slots(b) for b in range(bs)]
    expected = torch.cat([s[:n] for s, n in zip(slots, LENS)])
    assert torch.equal(views.kv_indices[: sum(LENS)].long().cpu(), expected)
    drafts = torch.cat([s[n:] for s, n in zip(slots, LENS)]).to(device)
    rows = _rows_as_float(token_pool(batch.kv_cache), drafts)
    assert torch.equal(views.k_extend[:, 0].float(), rows)  # exact, fp8 included
    assert views.v_extend.data_ptr() == views.k_extend.data_ptr()
    assert views.v_extend.shape == (len(rows), 1, 512)


def test_workspace_views_are_kept_while_their_buffers_last(device):
    """A call shape's views are the same tensors on every call until the
    buffers grow; then they are carved from the new buffers."""
    ws = workspace.Workspace(torch.device(device))
    paged = ws.paged_views(2, L, 64, torch.bfloat16)
    partials = ws.views(100)
    assert ws.paged_views(2, L, 64, torch.bfloat16) is paged
    assert ws.views(100) is partials
    assert ws.paged_views(2, L, 32, torch.bfloat16) is not paged  # another shape
    ws.paged_views(40, L, 4096, torch.bfloat16)  # grows the paged buffers
    ws.views(10**5)  # grows the partials
    again = ws.paged_views(2, L, 64, torch.bfloat16)
    assert again.kv_indices.data_ptr() == ws.paged_index.data_ptr() != paged.kv_indices.data_ptr()
    assert again.k_extend.data_ptr() == ws.paged_drafts.data_ptr()
    assert ws.views(100)[0].data_ptr() == ws.part_o.data_ptr() != partials[0].data_ptr()


def test_workspace_views_start_16_byte_aligned(device):
    """Every view a call takes from the workspace starts 16-byte aligned,
    whatever the batch: Triton specialises pointers on it, and a kept
    call's replayed launches (launcher.Recording) rest on it not changing."""
    ws = workspace.Workspace(torch.device(device))
    for batch_size in range(1, 9):
        for draft_len in (1, 2, 3, 5):
            for max_tokens in (1, 16, 33, 64):
                for dtype in (torch.bfloat16, torch.float16):
                    views = ws.paged_views(batch_size, draft_len, max_tokens, dtype)
                    tensors = [getattr(views, f.name) for f in dataclasses.fields(views)]
                    tensors += ws.views(batch_size * draft_len * 7 + max_tokens)
                    assert all(t.data_ptr() % 16 == 0 for t in tensors)


def test_prepared_workspace_is_used_under_capture(monkeypatch, device):
    """With the workspace prepared, a call under (simulated) capture grows
    nothing; without room it raises, naming prepare_paged_workspace."""
    batch = make_paged_batch(
        H, L, [40, 0], page_size=16, extra_columns=3, seed=7, device=device, **FP8
    )
    max_blocks = batch.block_table.shape[1]
    mla_verify.prepare_paged_workspace(2, H, L, max_blocks, 16, device=device)
    ws = workspace.get_workspace(torch.device(device))
    before = [t.data_ptr() for t in (ws.part_o, ws.part_lse, ws.paged_index, ws.paged_drafts)]
    monkeypatch.setattr(ws, "_used_in_capture", ws._used_in_capture)  # restored afterwards
    monkeypatch.setattr(workspace, "capturing", lambda device: True)
    _check(batch, "under capture")
    after = [t.data_ptr() for t in (ws.part_o, ws.part_lse, ws.paged_index, ws.paged_drafts)]
    assert before == after
    wider = torch.cat([batch.block_table] * 40, dim=1)  # more columns than prepared
    needed = workspace.paged_numel(2, L, wider.shape[1] * 16)[0]
    assert needed > ws.paged_index.numel()
    batch.block_table = wider
    with pytest.raises(RuntimeError, match="prepare_paged_workspace"):
        batch.run()


def test_v_scale_power_of_two_is_exact(device):
    """A power-of-two v_scale scales prefix and drafts exactly, so the
    output is exactly that multiple of the unscaled one (checked bit for
    bit under the interpreter, whose kernels sum alike both ways)."""
    batch = make_paged_batch(H, L, [20, 0, 7], page_size=16, seed=8, device=device)
    plain = batch.run()
    batch.v_scale = 2.0
    doubled = batch.run()
    if INTERPRETED:
        assert torch.equal(doubled, (plain.float() * 2).to(plain.dtype))
    check_close(doubled, batch.reference())


@pytest.mark.skipif(not INTERPRETED, reason="the GPU kernels round P to 16 bits")
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_scaled_drafts_are_rounded_once(kv, device):
    """A v_scale that no 16-bit value carries exactly (1.3) reaches the
    drafts' values in fp32: with the interpreter's fp32 dots every output
    element is the reference rounded once to bf16 (the interpreter
    truncates: within one ulp), within fp32's own error. (Draft rows
    multiplied by 1.3 and rounded to bf16 miss that by up to an ulp of the
    values, not of the output.)"""
    scales = {"k_scale": 0.75, "v_scale": 1.3}
    if kv == "fp8":
        scales["kv_dtype"] = torch.float8_e4m3fn
    batch = make_paged_batch(H, L, [20, 0, 1, 7], page_size=16, seed=9, device=device, **scales)
    out = batch.run(batch.new_output()).float()
    ref = batch.reference()
    err = (out - ref).abs()
    bound = ref.abs() * 2**-7 + 1e-5  # a bf16 ulp is at most 2^-7 of a value
    worst = tuple(int(i) for i in torch.unravel_index((err - bound).argmax(), err.shape))
    assert bool((err <= bound).all()), f"at {worst}: {out[worst]} vs {ref[worst]}"


# --- bad input --------------------------------------------------------------


def _bad(batch, **over):
    args = dict(
        q=batch.q,
        kv_cache=batch.kv_cache,
        block_table=batch.block_table,
        cache_seqlens=batch.cache_seqlens,
    )
    args.update(over)
    return args


BF = torch.bfloat16
BAD_INPUT = {
    "q_rank": (lambda b: {"q": b.q[0]}, "q.shape"),
    "q_head_dim": (lambda b: {"q": b.q[..., :512]}, r"q.shape\[3\]"),
    "q_fp32": (lambda b: {"q": b.q.float()}, "q.dtype"),
    "draft_len_17": (lambda b: {"q": torch.zeros(2, 17, H, 576, dtype=BF)}, "draft length"),
    "q_batch_dims_unmerged": (
        lambda b: {"q": b.q.transpose(0, 1).contiguous().transpose(0, 1)},
        r"q.stride\(0\)",
    ),
    "page_size_8": (
        lambda b: {"kv_cache": torch.zeros(4, 8, 1, 576, dtype=BF)},
        r"kv_cache.shape\[1\] \(page size\)",
    ),
    "two_kv_heads": (
        lambda b: {"kv_cache": torch.zeros(4, 16, 2, 576, dtype=BF)},
        "KV heads",
    ),
    "kv_dim_512": (lambda b: {"kv_cache": b.kv_cache[..., :512]}, r"kv_cache.shape\[3\]"),
    "fp16_cache_bf16_q": (lambda b: {"kv_cache": b.kv_cache.half()}, "kv_cache.dtype"),
    "overlapping_pages": (
        lambda b: {
            "kv_cache": b.kv_cache.reshape(-1, 576)[:-8].as_strided(
                (4, 16, 1, 576), (8 * 576, 576, 576, 1)
            )
        },
        r"kv_cache.stride\(\)",
    ),
    "table_int64": (lambda b: {"block_table": b.block_table.long()}, "block_table.dtype"),
    "table_rows": (lambda b: {"block_table": b.block_table[:1]}, r"block_table.shape\[0\]"),
    "table_1d": (lambda b: {"block_table": b.block_table[0]}, "block_table.shape"),
    "seqlens_int64": (lambda b: {"cache_seqlens": b.cache_seqlens.long()}, "cache_seqlens.dtype"),
    "seqlens_shape": (lambda b: {"cache_seqlens": b.cache_seqlens[:1]}, "cache_seqlens.shape"),
    "seqlens_2d": (lambda b: {"cache_seqlens": b.cache_seqlens[:, None]}, "cache_seqlens.shape"),
    "seqlens_on_meta": (
        lambda b: {"cache_seqlens": b.cache_seqlens.to("meta")},
        "cache_seqlens.device",
    ),
    "out_shape": (lambda b: {"out": torch.empty(2, L, H, 576, dtype=BF)}, "out.shape"),
    "out_dtype": (lambda b: {"out": torch.empty(2, L, H, 512, dtype=torch.half)}, "out.dtype"),
    "k_scale_tensor": (lambda b: {"k_scale": torch.tensor(1.0)}, "k_scale"),
    "k_scale_negative": (lambda b: {"k_scale": -1.0}, "k_scale"),
    "v_scale_zero": (lambda b: {"v_scale": 0.0}, "v_scale"),
    "sm_scale_nan": (lambda b: {"sm_scale": float("nan")}, "sm_scale"),
    # a step's metadata made for another call, or not one
    "not_metadata": (lambda b: {"metadata": b.block_table}, "metadata"),
    "other_draft_len": (
        lambda b: {
            "metadata": mla_verify.paged_metadata(b.kv_cache, b.block_table, b.cache_seqlens, L + 1)
        },
        "metadata.draft_len",
    ),
    "other_batch": (
        lambda b: {
            "metadata": mla_verify.paged_metadata(
                b.kv_cache, b.block_table[:1], b.cache_seqlens[:1], L
            )
        },
        "metadata.batch_size",
    ),
    "other_table_width": (
        lambda b: {
            "metadata": mla_verify.paged_metadata(
                b.kv_cache, torch.cat([b.block_table] * 2, dim=1), b.cache_seqlens, L
            )
        },
        "metadata.max_tokens",
    ),
    "other_page": (
        lambda b: {
            "metadata": mla_verify.paged_metadata(
                b.kv_cache.view(-1, 1, 1, 576),
                torch.cat([b.block_table] * 16, 1),
                b.cache_seqlens,
                L,
            )
        },
        "metadata.page_size",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_names_the_argument(case):
    batch = make_paged_batch(H, L, [20, 0], page_size=16, seed=9)
    over, match = BAD_INPUT[case]
    with pytest.raises(ValueError, match=match) as info:
        verify_mla_paged(**_bad(batch, **over(batch)))
    assert "expected" in str(info.value) and "got" in str(info.value)


def test_debug_mode_checks_lengths_and_table(device):
    batch = make_paged_batch(H, L, [20, 0], page_size=16, extra_columns=2, seed=10, device=device)
    set_debug(True)
    try:
        _check(batch, "debug mode, valid call")  # unused columns may hold anything
        batch.block_table[1, -1] = -5
        _check(batch, "debug mode, garbage past the used pages")
        for lens, match in (([2, 20 + L], "cache_seqlens"), ([20 + L, 10**6], "cache_seqlens")):
            with pytest.raises(ValueError, match=match):
                lens = torch.tensor(lens, dtype=torch.int32, device=device)
                verify_mla_paged(**_bad(batch, cache_seqlens=lens))
        batch.block_table[0, 1] = batch.kv_cache.shape[0]  # a used page, one past the cache
        with pytest.raises(ValueError, match="block_table"):
            batch.run()
    finally:
        set_debug(False)


# --- a step's metadata -----------------------------------------------------------


@pytest.mark.parametrize("page_size,kv", [(1, "bf16"), (64, "bf16"), (16, "fp8")])
def test_metadata_gives_the_same_output(page_size, kv, device):
    """A call given its step's metadata (paged_metadata) computes what the
    call without it does: the same kernels on the same token-indexed form,
    bit for bit, and within tolerance of the reference."""
    over = FP8 if kv == "fp8" else {}
    batch = make_paged_batch(H, L, LENS, page_size=page_size, seed=20, device=device, **over)
    alone = batch.run(batch.new_output())
    metadata = batch.metadata()
    assert isinstance(metadata, mla_verify.PagedMetadata)
    given = batch.run(batch.new_output(), metadata=metadata)
    assert torch.equal(given, alone)
    check_close(given, batch.reference(), what=f"metadata, page {page_size}")


def test_metadata_is_the_translation(device):
    """The metadata's indptrs and indices, written over poisoned tensors
    (out=), are the host's: what a call's own translation writes."""
    batch = make_paged_batch(H, L, LENS, page_size=16, seed=21, device=device)
    metadata = batch.metadata()
    for t in metadata.tensors():
        t.fill_(-(2**30))
    assert batch.metadata(out=metadata) is metadata
    bs = len(LENS)
    assert metadata.qo_indptr.tolist() == [b * L for b in range(bs + 1)]
    assert metadata.kv_indptr.tolist() == torch.tensor([0, *LENS]).cumsum(0).tolist()
    slots = torch.cat([batch.slots(b)[:n] for b, n in enumerate(LENS)])
    assert torch.equal(metadata.kv_indices[: sum(LENS)].long().cpu(), slots)


def test_metadata_rewritten_in_place_for_new_lengths(device):
    """One metadata, rewritten (out=) after the block table and the lengths
    change, serves the new call: the engine's step loop under a graph."""
    shapes = dict(page_size=16, max_blocks=8, num_blocks=20, device=device)
    first = make_paged_batch(H, L, [40, 0, 9], seed=22, **shapes)
    second = make_paged_batch(H, L, [3, 77, 0], seed=23, **shapes)
    metadata = first.metadata()
    check_close(first.run(metadata=metadata), first.reference(), what="first")
    tensors = [t.data_ptr() for t in metadata.tensors()]
    assert second.metadata(out=metadata) is metadata
    assert [t.data_ptr() for t in metadata.tensors()] == tensors
    check_close(second.run(metadata=metadata), second.reference(), what="rewritten")


def test_bad_paged_metadata_arguments_are_named():
    batch = make_paged_batch(H, L, [20, 0], page_size=16, seed=25)
    args = (batch.kv_cache, batch.block_table, batch.cache_seqlens)
    for call, match in (
        (lambda: mla_verify.paged_metadata(*args, 0), "draft_len"),
        (lambda: mla_verify.paged_metadata(*args, 17), "draft_len"),
        (
            lambda: mla_verify.paged_metadata(args[0], args[1].long(), args[2], L),
            "block_table.dtype",
        ),
        (
            lambda: mla_verify.paged_metadata(args[0], args[1], args[2][:1], L),
            "cache_seqlens.shape",
        ),
        (
            lambda: mla_verify.paged_metadata(args[0], args[1].tolist(), args[2], L),
            "block_table",
        ),
        (
            lambda: mla_verify.paged_metadata(args[0][..., :512], *args[1:], L),
            r"kv_cache.shape\[3\]",
        ),
        (
            lambda: mla_verify.paged_metadata(
                *args, L, out=mla_verify.paged_metadata(args[0], args[1][:1], args[2][:1], L)
            ),
            "out.batch_size",
        ),
    ):
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert "expected" in str(info.value) and "got" in str(info.value)


def test_metadata_for_heads(device):
    """Made for the calls' heads, the metadata plans the seesaw kernel's
    shares only where that kernel serves (never under the interpreter),
    and serves the call alike; heads out of range are named."""
    batch = make_paged_batch(H, L, LENS, page_size=64, seed=27, device=device)
    metadata = batch.metadata(num_heads=H)
    served = paged.seesaw_serves(batch.q, batch.kv_cache, batch.block_table)
    assert (metadata.seesaw_plan is not None) == served
    assert (metadata.seesaw_merge_plan is not None) == served
    check_close(batch.run(metadata=metadata), batch.reference(), what="metadata for heads")
    with pytest.raises(ValueError, match="num_heads") as info:
        batch.metadata(num_heads=0)
    assert "expected" in str(info.value) and "got" in str(info.value)


def test_debug_mode_checks_metadata(device):
    """Metadata of lengths since changed computes a wrong answer silently;
    the debug mode compares it with the call's own translation."""
    batch = make_paged_batch(H, L, [20, 5], page_size=16, extra_columns=2, seed=26, device=device)
    metadata = batch.metadata()
    set_debug(True)
    try:
        check_close(batch.run(metadata=metadata), batch.reference(), what="debug, current")
        batch.cache_seqlens[1] += 1
        with pytest.raises(ValueError, match="metadata"):
            batch.run(metadata=metadata)
    finally:
        set_debug(False)


# --- GPU ------------------------------------------------------------------------

GPU_SHAPES = [
    (16, 2, [4000, 0, 1, 700, 64 * 20 - 2]),
    (128, 4, [2048] * 16),
    (32, 3, [(b * 7919) % 5000 for b in range(40)]),
    (8, 8, [130, 0, 64, 9000]),
]
ON_HOPPER = (
    torch.cuda.is_available()
    and torch.cuda.get_device_capability() == (9, 0)
    and hopper.available()
)
GPU_KV = {
    "bf16": {},
    "fp8": {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.75, "v_scale": 1.3},
}


@pytest.mark.gpu
@pytest.mark.parametrize("kv", list(GPU_KV))
@pytest.mark.parametrize("page_size", [64, 1])
@pytest.mark.parametrize(
    "heads,draft_len,lens",
    GPU_SHAPES,
    ids=[f"H{h}_L{d}_bs{len(p)}_max{max(p)}" for h, d, p in GPU_SHAPES],
)
def test_gpu_matches_reference(heads, draft_len, lens, page_size, kv):
    batch = make_paged_batch(
        heads, draft_len, lens, page_size=page_size, device="cuda", seed=11, **GPU_KV[kv]
    )
    if ON_HOPPER:
        # Paged bf16 and fp8 calls can take the Hopper kernel on either
        # schedule, as token-indexed ones do.
        q = batch.q.view(-1, heads, 576)
        pool = token_pool(batch.kv_cache)
        assert plan.uses_gluon_sm90(q, pool, draft_len, True, score_value=False)
        assert plan.uses_gluon_sm90(q, pool, draft_len, True)
        # Its full prefix tiles of 64-token pages then load by TMA.
        assert hopper.loads_pages(page_size, pool) == (page_size == 64)
    _check(batch, f"page {page_size} {kv}")


@pytest.mark.gpu
@pytest.mark.parametrize("row_stride", [640, 580])
@pytest.mark.parametrize("page_size", [64, 128])
def test_gpu_padded_rows(page_size, row_stride):
    """Token rows padded to 640 elements (16-byte aligned: TMA loads the
    pages) or to 580 (not: the tiles are gathered)."""
    batch = make_paged_batch(
        16, 4, [3000, 0, 129, 64, 1000], page_size=page_size, row_stride=row_stride, device="cuda"
    )
    assert hopper.loads_pages(page_size, token_pool(batch.kv_cache)) == (row_stride == 640)
    _check(batch, f"page {page_size}, rows of {row_stride}")


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 32, 128])
def test_gpu_other_page_sizes(page_size):
    batch = make_paged_batch(64, 2, [3000, 0, 129, 64], page_size=page_size, device="cuda")
    _check(batch)


# (heads, L, prefix lengths, page): the seesaw kernel's cases. Segments of
# odd and even tile counts, drafts straddling two tiles, prefixes of 0 and
# of a tile's length give or take one, shares that split a request, heads
# that leave a head block part empty, draft counts that do not divide 64.
SEESAW_SHAPES = [
    (128, 4, [4000, 0, 1, 700, 64 * 20 - 2, 61, 62, 63, 64, 65], 64),
    (64, 2, [2048] * 40, 64),
    (16, 1, [5000, 3, 127, 128, 129], 128),
    (32, 3, [(b * 7919) % 5000 for b in range(40)], 64),
    (8, 16, [130, 0, 64, 9000, 47, 48, 49], 128),
    (64, 4, [65536 - 4], 64),
    (20, 4, [1000, 300, 59], 64),
    (128, 8, [16384, 16384], 128),
    # Stage 2 over each request's rows (paged._rows_merge): 32 rows; 18
    # rows, head 5's drafts in two of its programs; 128 rows at batch 2.
    (8, 4, [3000, 2048, 65, 0, 700, 1, 4000, 129], 64),
    (6, 3, [2500, 100, 64, 1900], 64),
    (32, 4, [9000, 129], 64),
]


def test_rows_merge_rule_takes_batches_of_two_to_eight_up_to_256_rows_in_all():
    """paged._rows_merge: stage 2 over each request's rows for batches of 2
    to 8 sequences of 16 query rows or more, 256 rows in all at most, and
    for nothing else."""
    assert paged._rows_merge(2, 16) and paged._rows_merge(8, 32)
    assert paged._rows_merge(2, 128) and paged._rows_merge(4, 64) and paged._rows_merge(3, 85)
    assert not paged._rows_merge(1, 16) and not paged._rows_merge(9, 16)
    assert not paged._rows_merge(8, 15) and not paged._rows_merge(8, 33)
    assert not paged._rows_merge(2, 129) and not paged._rows_merge(4, 65)
    assert not paged._rows_merge(2, 8)


def test_seesaw_rule_takes_every_batch_up_to_the_largest_measured():
    """paged.seesaw_shape: batches of 1 to SEESAW_MAX_BATCH (512) sequences,
    whatever their query rows (the rule does not take them); larger batches
    stay on the translated call."""
    assert paged.SEESAW_MAX_BATCH == 512
    for batch_size in (1, 2, 7, 8, 64, 65, 128, 129, 256, 257, 512):
        assert paged.seesaw_shape(batch_size), batch_size
    for batch_size in (513, 4096):
        assert not paged.seesaw_shape(batch_size), batch_size


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="the seesaw kernel runs on sm90")
def test_gpu_seesaw_serves_by_the_rule():
    """On Hopper the shipped rule sends bf16 calls on pages of 64 to the
    seesaw kernel at every row count, batch 2 to 130 among them; fp8 calls
    and pages of 16 stay on the translated call."""
    lens = [1 + (37 * b) % 700 for b in range(130)]
    for heads, drafts, batch_size in (64, 4, 8), (16, 4, 8), (32, 4, 7), (8, 4, 2), (64, 4, 130):
        batch = make_paged_batch(heads, drafts, lens[:batch_size], page_size=64, device="cuda")
        assert paged.seesaw_serves(batch.q, batch.kv_cache, batch.block_table)
        _check(batch, f"H{heads} L{drafts} batch {batch_size} by the rule")
    small_pages = make_paged_batch(16, 4, [300] * 8, page_size=16, device="cuda")
    fp8 = make_paged_batch(16, 4, [300] * 8, page_size=64, device="cuda", **GPU_KV["fp8"])
    for batch in small_pages, fp8:
        assert not paged.seesaw_serves(batch.q, batch.kv_cache, batch.block_table)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="the seesaw kernel runs on sm90")
@pytest.mark.parametrize("scales", [{}, {"k_scale": 0.75, "v_scale": 1.3}], ids=["", "scaled"])
@pytest.mark.parametrize(
    "heads,draft_len,lens,page_size",
    SEESAW_SHAPES,
    ids=[f"H{h}_L{d}_bs{len(p)}_max{max(p)}_page{s}" for h, d, p, s in SEESAW_SHAPES],
)
def test_gpu_seesaw_matches_reference(heads, draft_len, lens, page_size, scales, monkeypatch):
    """bf16 pages of 64 and 128 run the seesaw kernel (kernel_seesaw.py) at
    any batch size where asked (paged.seesaw_shape admitting every shape):
    the cache's rows past each sequence are NaN, and the output is
    poisoned. Then the same batch on the translated path, where a rule that
    admits no shape leaves it. Each without the step's metadata, with it,
    and with it made for the heads (the seesaw's shares planned there)."""
    batch = make_paged_batch(
        heads, draft_len, lens, page_size=page_size, device="cuda", seed=5, **scales
    )
    for seesaw, kind in ((True, "seesaw"), (False, "translated")):
        monkeypatch.setattr(paged, "seesaw_shape", lambda batch_size, on=seesaw: on)
        assert paged.seesaw_serves(batch.q, batch.kv_cache, batch.block_table) == seesaw
        what = f"{kind} H{heads} L{draft_len} page {page_size}"
        _check(batch, what)
        for num_heads in (None, heads):  # with heads, the seesaw's shares and pieces planned too
            metadata = batch.metadata(num_heads=num_heads)
            planned = seesaw and num_heads is not None
            assert (metadata.seesaw_plan is not None) == planned
            assert (metadata.seesaw_merge_plan is not None) == planned
            out = batch.new_output()
            got = batch.run(out, metadata=metadata)
            check_close(got, batch.reference(), what=f"{what}, metadata for {num_heads} heads")


@pytest.mark.gpu
def test_gpu_debug_mode_checks_the_seesaw_plans(monkeypatch):
    """The debug mode passes a step's metadata whose seesaw plans (the
    shares and each request's pieces, padded rows) are this call's, and
    refuses it once a length changed."""
    monkeypatch.setattr(paged, "seesaw_shape", lambda batch_size: True)
    batch = make_paged_batch(16, 2, [3000, 70, 1500], page_size=64, device="cuda", seed=8)
    if not paged.seesaw_serves(batch.q, batch.kv_cache, batch.block_table):
        pytest.skip("the seesaw kernel needs an sm90 GPU and Gluon")
    metadata = batch.metadata(num_heads=16)
    assert metadata.seesaw_merge_plan is not None
    set_debug(True)
    try:
        check_close(batch.run(metadata=metadata), batch.reference(), what="debug, seesaw plans")
        batch.cache_seqlens[0] -= 100
        with pytest.raises(ValueError, match="metadata"):
            batch.run(metadata=metadata)
    finally:
        set_debug(False)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "page_size,kv,seesaw,step,heads,draft_len",
    [(64, "bf16", False, False, 16, 4), (64, "fp8", False, False, 16, 4)]
    + [(1, "bf16", False, False, 16, 4), (1, "fp8", False, False, 16, 4)]
    + [(64, "bf16", True, False, 16, 4), (64, "bf16", True, True, 16, 4)]
    + [(1, "bf16", False, True, 16, 4), (64, "bf16", True, True, 8, 2)]
    + [(64, "bf16", True, True, 8, 4)],
)
def test_gpu_graph_replay_after_lengths_change(
    page_size, kv, seesaw, step, heads, draft_len, monkeypatch
):
    """Capture once with out= given; the engine then rewrites lengths, the
    block table and the cache in place (same shapes); replay gives the new
    answer, and nothing was allocated during capture. ``seesaw``: the
    batch runs the seesaw kernel (paged.SEESAW_MAX_BATCH opened to it).
    ``step``: the graph also rewrites the step's metadata (out=), made for
    the heads (the seesaw's shares planned there), which the call reads.
    16 and 32 rows a sequence take stage 2 over each request's rows
    (paged._rows_merge); 64 rows take a program a head."""
    bs = 8
    monkeypatch.setattr(paged, "SEESAW_MAX_BATCH", bs if seesaw else 0)
    pages = -(-(9000 + draft_len) // page_size)
    shapes = dict(max_blocks=pages + 2, num_blocks=pages * bs + 2, page_size=page_size)
    first = make_paged_batch(
        heads, draft_len, [4000] * bs, device="cuda", seed=12, **shapes, **GPU_KV[kv]
    )
    second = make_paged_batch(
        heads,
        draft_len,
        [7000, 0, 1, 513, 64, 9000, 3, 2048],
        device="cuda",
        seed=13,
        **shapes,
        **GPU_KV[kv],
    )
    if ON_HOPPER:
        assert paged.seesaw_serves(first.q, first.kv_cache, first.block_table) == seesaw
    mla_verify.prepare_paged_workspace(
        bs, heads, draft_len, shapes["max_blocks"], page_size, first.kv_cache.dtype
    )
    ws = workspace.get_workspace(torch.device("cuda"))
    out = first.new_output()
    metadata = first.metadata(num_heads=heads) if step else None
    if step and ON_HOPPER:
        assert (metadata.seesaw_plan is not None) == seesaw
        assert (metadata.seesaw_merge_plan is not None) == seesaw
    if seesaw:
        assert paged._rows_merge(bs, heads * draft_len) == (heads * draft_len <= 32)

    def run() -> None:
        if step:
            first.metadata(out=metadata)
        first.run(out, metadata=metadata)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # compile and warm up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    buffers = [t.data_ptr() for t in (ws.part_o, ws.part_lse, ws.paged_index, ws.paged_drafts)]
    # torch's capture_begin allocates two 512-byte blocks of graph state,
    # kept while a graph that holds them lives (seen on the H200 with
    # torch 2.11): capture something first and keep it, so only the call
    # is measured.
    warm = torch.zeros(1, device="cuda")
    warm_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(warm_graph):
        warm.add_(1)
    graph = torch.cuda.CUDAGraph()
    allocated = torch.cuda.memory_allocated()
    with torch.cuda.graph(graph):
        run()
    assert torch.cuda.memory_allocated() == allocated
    assert buffers == [
        t.data_ptr() for t in (ws.part_o, ws.part_lse, ws.paged_index, ws.paged_drafts)
    ]
    out.fill_(float("nan"))
    graph.replay()
    check_close(out, first.reference(), what="first replay")

    for name in ("q", "kv_cache", "block_table", "cache_seqlens"):
        getattr(first, name).copy_(getattr(second, name))
    out.fill_(float("nan"))
    graph.replay()
    check_close(out, second.reference(), what="replay after lengths changed")


def test_pages_load_whole_where_tma_can():
    """hopper.loads_pages: pages of a multiple of 64 tokens, rows and
    their start 16-byte aligned; else the kernel gathers every tile."""
    for page_size in PAGE_SIZES:
        batch = make_paged_batch(H, L, [70], page_size=page_size, seed=14)
        pool = token_pool(batch.kv_cache)
        assert hopper.loads_pages(page_size, pool) == (page_size in (64, 128)), page_size
    for row_stride, aligned in ((640, True), (580, False)):
        batch = make_paged_batch(H, L, [70], page_size=64, row_stride=row_stride, seed=14)
        assert hopper.loads_pages(64, token_pool(batch.kv_cache)) == aligned, row_stride
    buffer = torch.zeros(128 * 576 + 1, dtype=torch.bfloat16)
    assert hopper.loads_pages(64, buffer[:-1].view(128, 1, 576))
    assert not hopper.loads_pages(64, buffer[1:].view(128, 1, 576))  # 2 bytes off


def test_module_names():
    """The public names this file relies on stay where the README points."""
    assert mla_verify.verify_mla_paged is paged.verify_mla_paged
    assert mla_verify.prepare_paged_workspace is workspace.prepare_paged_workspace


# Runs without TRITON_INTERPRET: compiling needs the real kernel.
AOT_SCRIPT = textwrap.dedent(
    """
    import triton
    from mla_verify import translate
    from mla_verify.aot import TARGETS, _signature
    INDEX_POINTERS = ("BLOCK_TABLE", "CACHE_SEQLENS", "QO_INDPTR", "KV_INDPTR", "KV_INDICES")
    for arch, fp8 in (("sm90", "fp8e4nv"), ("gfx942", "fp8e4b8")):
        for kv, q in (("bf16", "bf16"), (fp8, "bf16"), (fp8, "fp16")):
            for page in (1, 64, 128):
                pointers = {"KV_CACHE": "*" + kv, "K_EXT": "*" + q}
                pointers |= {name: "*i32" for name in INDEX_POINTERS}
                constexprs = dict(
                    DRAFT_LEN=3, PAGE_SIZE=page, BLOCK_P=translate.BLOCK_P,
                    BLOCK_B=translate.BLOCK_B, D_NOPE=512, D_ROPE=64,
                    # page 1: a call's whole translation; 64: a step's metadata;
                    # 128: before the seesaw kernel, indptrs alone, its launch let go at once
                    INDPTRS=page != 64 or kv == "bf16", INDICES=page != 128,
                    DRAFTS=page == 1 or kv != "bf16",
                    LAUNCH_DEPENDENTS=arch == "sm90" and page == 128,
                )
                src = _signature(translate._translate_kernel, pointers, set(), constexprs)
                triton.compile(src, target=TARGETS[arch][0], options={"num_warps": 4})
                print(arch, kv, page)
    """
)


def test_translation_kernel_compiles_for_gpus():
    """The translation kernel compiles for sm90 and gfx942 (bf16, fp8 and
    fp16 layouts), checked without the GPUs."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", AOT_SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.splitlines()) == 2 * 3 * 3
