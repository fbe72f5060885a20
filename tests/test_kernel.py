"""Kernel vs the float32 reference, on fresh random inputs, poisoned outputs
and a poisoned workspace. CPU lane: real dims, small batches, through
Triton's interpreter. GPU lane (marked): realistic sizes."""

from __future__ import annotations

import dataclasses
import math
import random
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from mla_verify import (
    VerifyConfig,
    block_config,
    hopper,
    kernel,
    plan,
    seesaw_merge,
    verify_mla_fwd,
)
from mla_verify import device as device_facts
from mla_verify.config import HOPPER_KERNELS, hopper_config, runs_score_value, splits_scores
from mla_verify.problem import kv_dtype_name
from mla_verify.search_space import tile_candidates
from mla_verify.testing import check_close, make_batch
from mla_verify.workspace import get_workspace

SMALL = VerifyConfig(BLOCK_H=4, BLOCK_N=16, NUM_KV_SPLITS=3, num_warps=4, num_stages=1)


def _poison_workspace(device) -> None:
    ws = get_workspace(torch.device(device))
    ws.reserve(1 << 16)
    ws.part_o.fill_(float("nan"))
    ws.part_lse.fill_(float("nan"))


def _run_and_check(batch, config, device) -> float:
    _poison_workspace(device)
    out = batch.new_output()
    assert batch.run(out, config) is True
    return check_close(out, batch.reference())


# (id, heads, draft_len, prefix_lens, make_batch kwargs, config)
CPU_CASES = [
    ("prefix0", 4, 1, [0], {}, SMALL),
    ("prefix0_and_1", 3, 2, [0, 1], {}, SMALL),
    ("around_block_n", 2, 2, [15, 16, 17, 32, 33], {}, SMALL),
    ("heads_not_multiple_of_block_h", 5, 3, [20, 9], {}, SMALL),
    ("draft_len_16", 2, 16, [10], {}, dataclasses.replace(SMALL, BLOCK_H=1)),
    ("draft_len_7", 3, 7, [25], {}, dataclasses.replace(SMALL, BLOCK_H=2)),
    (
        "ragged_with_empty_splits",
        4,
        2,
        [1, 70, 0, 3],
        {},
        dataclasses.replace(SMALL, NUM_KV_SPLITS=8),
    ),
    (
        "one_split_block_n_64",
        4,
        4,
        [100, 7],
        {},
        dataclasses.replace(SMALL, NUM_KV_SPLITS=1, BLOCK_N=64),
    ),
    (
        "one_long_among_short",
        2,
        2,
        [300, 1, 0, 2, 1],
        {},
        dataclasses.replace(SMALL, NUM_KV_SPLITS=2),
    ),
    # More requests than the work plan reads per step (PLAN_BLOCK = 128).
    (
        "batch_130",
        1,
        1,
        [(7 * b) % 23 for b in range(130)],
        {},
        dataclasses.replace(SMALL, BLOCK_H=1),
    ),
    ("strided_q", 4, 2, [30, 12], {"strided_q": True}, SMALL),
    ("separate_v_buffer", 4, 2, [30, 12], {"separate_v": True}, SMALL),
    ("v_extend_view_of_k_extend", 4, 2, [30, 12], {"v_extend_from_k": True}, SMALL),
    ("fp16", 4, 2, [30, 12], {"dtype": torch.float16}, SMALL),
    (
        "fp8_kv_scaled",
        4,
        2,
        [30, 12],
        {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.5, "v_scale": 1.5},
        SMALL,
    ),
    ("sm_scale_custom", 4, 2, [30], {"sm_scale": 0.11}, SMALL),
    # The drafts' values scaled apart from the prefix's (verify_mla_paged's
    # drafts live in the scaled cache).
    (
        "v_extend_scaled",
        4,
        2,
        [30, 0, 12],
        {"v_extend_from_k": True, "v_scale": 1.5, "v_extend_scale": 0.7},
        SMALL,
    ),
    ("lookup_config", 4, 2, [30, 5], {}, None),
    # Ordinary attention: one KV head, q/k = v = 256 or 128, no rope part.
    ("d256_v_view", 4, 2, [30, 12], {"head_dims": (256, 256)}, SMALL),
    ("d256_v_separate", 4, 2, [30, 12], {"head_dims": (256, 256), "separate_v": True}, SMALL),
    ("d128_v_view", 3, 3, [25, 0], {"head_dims": (128, 128)}, SMALL),
    ("d128_v_separate", 3, 3, [25, 0], {"head_dims": (128, 128), "separate_v": True}, SMALL),
    (
        "d256_fp8_scaled_v_separate",
        4,
        2,
        [30, 12],
        {
            "head_dims": (256, 256),
            "separate_v": True,
            "kv_dtype": torch.float8_e4m3fn,
            "k_scale": 0.5,
            "v_scale": 1.5,
        },
        SMALL,
    ),
    ("d128_lookup_config", 4, 2, [30, 5], {"head_dims": (128, 128), "separate_v": True}, None),
    # The value columns in chunks of V_CHUNK, one dot a chunk, each chunk
    # its own accumulator: MLA's 512 in 8, 4 and 2, 256 in 4 (separate V:
    # each chunk its own V load), 128 in 1 (the chunk capped at all columns).
    ("mla_v_chunk_64", 4, 2, [30, 0, 12], {}, dataclasses.replace(SMALL, V_CHUNK=64)),
    ("mla_v_chunk_128", 3, 3, [21, 40], {}, dataclasses.replace(SMALL, V_CHUNK=128)),
    (
        "mla_64_rows_v_chunk_256_fp8",
        16,
        4,
        [40, 9],
        {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.5, "v_scale": 1.5},
        dataclasses.replace(SMALL, BLOCK_H=16, V_CHUNK=256),
    ),
    (
        "d256_v_separate_v_chunk_64",
        4,
        2,
        [30, 12],
        {"head_dims": (256, 256), "separate_v": True},
        dataclasses.replace(SMALL, V_CHUNK=64),
    ),
    (
        "d128_v_chunk_256",
        3,
        3,
        [25, 0],
        {"head_dims": (128, 128)},
        dataclasses.replace(SMALL, V_CHUNK=256),
    ),
    # Ragged drafts: request b has draft_counts[b] rows, 1..L.
    (
        "ragged_counts_empty_prefixes",
        3,
        4,
        [0, 17, 0, 5, 40],
        {"draft_counts": [1, 4, 3, 2, 1]},
        dataclasses.replace(SMALL, NUM_KV_SPLITS=6),
    ),
    ("ragged_one_draft_each", 5, 3, [9, 33], {"draft_counts": [1, 1]}, SMALL),
    # Tree masks in SGLang's layout (prefix keys first, then the drafts).
    ("tree", 4, 5, [20, 0, 33], {"mask": "tree", "draft_counts": [5, 2, 4]}, SMALL),
    ("causal_as_mask_uint8", 3, 4, [18, 7], {"mask": "causal", "mask_dtype": torch.uint8}, SMALL),
    (
        "prefix_bits_hide_keys",
        4,
        3,
        [40, 3, 0, 17],
        {"mask": "tree", "hide_prefix": 0.4, "skip_prefix_custom_mask": False},
        dataclasses.replace(SMALL, NUM_KV_SPLITS=5),
    ),
    (
        "prefix_bits_skipped",
        4,
        3,
        [40, 3],
        {"mask": "tree", "hide_prefix": 0.4, "skip_prefix_custom_mask": True},
        SMALL,
    ),
    # Every prefix bit off: every chunk's partials hold weight 0.
    (
        "prefix_all_hidden",
        2,
        4,
        [50, 20],
        {"mask": "tree", "hide_prefix": 1.0, "skip_prefix_custom_mask": False},
        dataclasses.replace(SMALL, NUM_KV_SPLITS=6),
    ),
    (
        "fp8_tree_ragged_scaled",
        4,
        4,
        [30, 0, 12],
        {
            "kv_dtype": torch.float8_e4m3fn,
            "k_scale": 0.5,
            "v_scale": 1.5,
            "mask": "tree",
            "hide_prefix": 0.3,
            "skip_prefix_custom_mask": False,
            "draft_counts": [4, 1, 3],
        },
        SMALL,
    ),
    (
        "d256_tree_ragged_v_extend_view",
        4,
        4,
        [19, 40],
        {
            "head_dims": (256, 256),
            "separate_v": True,
            "v_extend_from_k": True,
            "mask": "tree",
            "hide_prefix": 0.3,
            "skip_prefix_custom_mask": False,
            "draft_counts": [3, 4],
        },
        SMALL,
    ),
]


@pytest.mark.parametrize(
    "heads,draft_len,prefix_lens,kwargs,config",
    [c[1:] for c in CPU_CASES],
    ids=[c[0] for c in CPU_CASES],
)
def test_matches_reference(heads, draft_len, prefix_lens, kwargs, config, device):
    batch = make_batch(heads, draft_len, prefix_lens, device=device, **kwargs)
    _run_and_check(batch, config, device)


# 64-row tiles (16 heads x 4 drafts) whose score dots split the keys between
# warpgroups on Hopper (SPLIT_SCORES): the same function as the chained path.
SPLIT_SCORE_CASES = [
    ("plain", [0, 17, 150], {}, dataclasses.replace(SMALL, BLOCK_H=16, NUM_KV_SPLITS=2)),
    (
        "prefix_bits_hide_keys_ragged",
        [40, 0, 23],
        {
            "mask": "tree",
            "hide_prefix": 0.5,
            "skip_prefix_custom_mask": False,
            "draft_counts": [4, 2, 3],
        },
        dataclasses.replace(SMALL, BLOCK_H=16, NUM_KV_SPLITS=3),
    ),
    (
        "prefix_all_hidden",
        [33, 5],
        {"mask": "tree", "hide_prefix": 1.0, "skip_prefix_custom_mask": False},
        dataclasses.replace(SMALL, BLOCK_H=16, NUM_KV_SPLITS=2),
    ),
    (
        "fp8_scaled_v_chunk_128",
        [30, 12],
        {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.5, "v_scale": 1.5},
        dataclasses.replace(SMALL, BLOCK_H=16, V_CHUNK=128),
    ),
    (
        "d256_separate_v",
        [25, 40],
        {"head_dims": (256, 256), "separate_v": True},
        dataclasses.replace(SMALL, BLOCK_H=16),
    ),
]


@pytest.mark.parametrize(
    "prefix_lens,kwargs,config",
    [c[1:] for c in SPLIT_SCORE_CASES],
    ids=[c[0] for c in SPLIT_SCORE_CASES],
)
def test_split_scores_path_matches_reference(prefix_lens, kwargs, config, device, monkeypatch):
    """The Triton kernel's SPLIT_SCORES path, which a launch takes only on
    Hopper, forced here: scaled score dots summed, alpha and P behind the
    always-taken branch, the row sums by a dot with ones."""
    from mla_verify import api

    forced = []

    def split_plan(*args, **kwargs):
        planned = dataclasses.replace(plan.plan_call(*args, **kwargs), split_scores=True)
        forced.append(planned)
        return planned

    monkeypatch.setattr(api, "plan_call", split_plan)
    batch = make_batch(16, 4, prefix_lens, device=device, **kwargs)
    _run_and_check(batch, config, device)
    assert forced and not forced[0].hopper


def test_split_scores_only_where_wgmma_warpgroups_would_repeat_the_scores():
    """SPLIT_SCORES takes tiles of 64 rows or more with fewer rows than 16 a
    warp: 64 rows on 8 warps, not on 4 (one warpgroup) or 128 rows on 8."""
    assert splits_scores(dataclasses.replace(SMALL, BLOCK_H=16, num_warps=8), 4)
    assert splits_scores(dataclasses.replace(SMALL, BLOCK_H=32, num_warps=8), 2)
    assert not splits_scores(dataclasses.replace(SMALL, BLOCK_H=16, num_warps=4), 4)
    assert not splits_scores(dataclasses.replace(SMALL, BLOCK_H=32, num_warps=8), 4)
    assert not splits_scores(dataclasses.replace(SMALL, BLOCK_H=8, num_warps=8), 4)


def test_one_split_still_splits_a_long_request(device):
    """A Triton config of one split launches two units a request, so the
    batch's prefix tokens are cut into one share a request, the long
    request's over several units (plan.fit_grid), and the result still
    matches."""
    batch = make_batch(2, 2, [300, 1, 0, 2, 1], device=device)
    one = dataclasses.replace(SMALL, NUM_KV_SPLITS=1)
    assert _call_plan(batch, one).config.NUM_KV_SPLITS == 2
    _run_and_check(batch, one, device)


@pytest.mark.parametrize("splits", [2, 3, 5])
def test_a_share_meets_several_requests(splits, device):
    """The batch's prefix tokens cut into equal shares whatever the
    lengths: short requests share a unit, a long one spreads over several,
    and requests without a prefix sit between them (330 tokens: shares of
    48, 32 and 16). Each segment's partial has a slot of its own: the
    workspace is poisoned, so a slot read but never written, or written
    twice, shows."""
    batch = make_batch(3, 2, [5, 0, 40, 3, 17, 0, 0, 64, 1, 200], device=device)
    _run_and_check(batch, dataclasses.replace(SMALL, NUM_KV_SPLITS=splits), device)


def _random_tree_batch(seed: int, device, *, big: bool = False):
    """A tree-verify batch of random shape: draft length, counts (ragged),
    prefix lengths (0 and 1 included), tree, hidden prefix bits and whether
    they are read. ``big``: GPU sizes."""
    rng = random.Random(seed)
    draft_len = rng.randint(1, 16 if big else 8)
    bs = rng.randint(1, 64 if big else 4)
    longest = 20000 if big else 70
    prefix_lens = [rng.choice([0, 1, rng.randint(2, longest)]) for _ in range(bs)]
    batch = make_batch(
        rng.randint(1, 128 if big else 6),
        draft_len,
        prefix_lens,
        draft_counts=[rng.randint(1, draft_len) for _ in range(bs)],
        mask="tree",
        hide_prefix=rng.choice([0.0, 0.3]),
        skip_prefix_custom_mask=rng.random() < 0.5,
        mask_dtype=rng.choice([torch.bool, torch.uint8]),
        device=device,
        pool_slots=2 * sum(prefix_lens) + 64,
        seed=seed,
    )
    config = VerifyConfig(
        BLOCK_H=rng.choice([1, 2, 4]),
        BLOCK_N=16 if not big else 64,
        NUM_KV_SPLITS=rng.randint(1, 6),
        num_warps=4,
        num_stages=1,
    )
    return batch, (None if big else config)


@pytest.mark.parametrize("seed", range(6))
def test_random_trees(seed, device):
    batch, config = _random_tree_batch(seed, device)
    _run_and_check(batch, config, device)


def test_row_that_sees_no_key_gets_zero(device):
    """Prefix bits and draft bits all off for one row: its output is 0 (an
    empty softmax adds nothing), and the other rows are unaffected."""
    batch = make_batch(3, 4, [20, 6], mask="tree", skip_prefix_custom_mask=False, device=device)
    width = 20 + 4  # request 0's row: its prefix, then its drafts
    start = int(batch.mask_indptr[0]) + 2 * width
    batch.custom_mask[start : start + width] = False
    ref = batch.reference()
    assert bool((ref[2] == 0).all())
    _poison_workspace(device)
    out = batch.new_output()
    assert batch.run(out, dataclasses.replace(SMALL, NUM_KV_SPLITS=4))
    check_close(out, ref)
    assert bool((out[2] == 0).all())


def test_hopper_kernel_takes_ragged_and_masked_calls(monkeypatch):
    """Both kernels read the draft counts and the mask on the device: a
    ragged call (q rows below batch x L) and a masked one plan the Hopper
    kernel; the plan says which mask bits it reads."""
    monkeypatch.setattr(plan, "uses_gluon_sm90", lambda *args: True)
    monkeypatch.setattr(plan, "sm_count", lambda device: 132)
    config = hopper_config(8, 4, 2)

    def planned(**kwargs):
        return _call_plan(make_batch(8, 4, [70, 5], **kwargs), config)

    assert planned().hopper and not planned().draft_mask
    ragged = planned(draft_counts=[4, 3])
    assert ragged.hopper and not ragged.draft_mask
    tree = planned(mask="tree")
    assert tree.hopper and tree.draft_mask and not tree.prefix_mask
    prefix_bits = planned(mask="tree", skip_prefix_custom_mask=False)
    assert prefix_bits.hopper and prefix_bits.draft_mask and prefix_bits.prefix_mask


def test_hopper_kernel_packs_ragged_rows_over_several_head_blocks(monkeypatch):
    """Ragged draft counts plan packed rows only where there are several
    head blocks: with one, every request has rows in it anyway."""
    monkeypatch.setattr(plan, "uses_gluon_sm90", lambda *args: True)
    monkeypatch.setattr(plan, "sm_count", lambda device: 132)

    def planned(heads, draft_counts):
        call = _call_plan(
            make_batch(heads, 4, [70, 5], draft_counts=draft_counts), hopper_config(heads, 4, 2)
        )
        return call, hopper.head_blocks(heads, call.config.BLOCK_H)

    for heads in (16, 64):
        uniform, blocks = planned(heads, [4, 4])
        ragged, _ = planned(heads, [4, 1])
        assert not uniform.ragged
        assert ragged.ragged == (blocks > 1), (heads, blocks)
    assert planned(64, [4, 1])[1] > 1 and planned(16, [4, 1])[1] == 1


def test_fp8_kv_runs_the_triton_kernel_where_gluon_cannot_build_it(monkeypatch):
    """Gluon 3.7 fails to lower the Hopper kernel for fp8 KV (compiled for
    sm90 without a GPU: 3.7.0 and 3.7.1 fail, 3.6, 3.8 and 3.9 build it);
    there fp8 calls run the Triton kernel and bf16 ones stay on Hopper."""
    assert [hopper.lowers_fp8(v) for v in ("3.6.0", "3.7.0", "3.7.1", "3.8.0", "3.9.0")] == [
        True,
        False,
        False,
        True,
        True,
    ]
    assert hopper.lowers_fp8("3.10.0") and not hopper.lowers_fp8("3.7")
    monkeypatch.setattr(hopper, "FP8_LOWERS", False)
    for dims in [(576, 512), (256, 256)]:
        assert hopper.supports(4, "bf16", True, dims)
        assert not hopper.supports(4, "fp8_e4m3", True, dims)
        assert not hopper.supports(4, "fp8_e4m3", True, dims, score_value=False)
    monkeypatch.setattr(plan, "INTERPRETED", False)
    monkeypatch.setattr(plan, "is_cuda_sm90", lambda device: True)
    monkeypatch.setattr(hopper, "available", lambda: True)
    q = torch.empty(8, 16, 576, dtype=torch.bfloat16, device="meta")
    fp8 = torch.empty(100, 1, 576, dtype=torch.float8_e4m3fn, device="meta")
    assert not plan.uses_gluon_sm90(q, fp8, 4, True, 512)
    assert plan.uses_gluon_sm90(q, fp8.to(torch.bfloat16), 4, True, 512)


def test_hopper_kernel_takes_mla_and_shared_kv_head_dims(monkeypatch):
    """MLA with V a view of K, 256/256 and 128/128 with V a view of K or a
    cache of its own: bf16 or fp8 KV on the columns schedule; on
    score/value MLA's bf16 and fp8, the others' bf16."""
    monkeypatch.setattr(plan, "INTERPRETED", False)
    monkeypatch.setattr(plan, "is_cuda_sm90", lambda device: True)
    monkeypatch.setattr(hopper, "FP8_LOWERS", True)  # any Triton but 3.7
    meta = lambda *shape: torch.empty(*shape, dtype=torch.bfloat16, device="meta")  # noqa: E731
    mla = (576, 512)
    assert hopper.supports(4, "bf16", True, mla, score_value=False)
    assert hopper.supports(4, "fp8_e4m3", True, mla, score_value=False)
    assert hopper.supports(4, "fp8_e4m3", True, mla)
    assert not hopper.supports(4, "bf16", False, mla)  # a separate V cache
    assert not hopper.supports(65, "bf16", True, mla)  # more drafts than a tile's rows
    for dims in [(256, 256), (128, 128)]:
        for v_from_k in (True, False):
            assert hopper.supports(4, "bf16", v_from_k, dims)
            assert hopper.supports(4, "bf16", v_from_k, dims, score_value=False)
            assert hopper.supports(4, "fp8_e4m3", v_from_k, dims, score_value=False)
        assert not hopper.supports(4, "fp8_e4m3", False, dims)  # their score/value: bf16 only
        assert not hopper.supports(4, "fp16", False, dims, score_value=False)
    assert not hopper.supports(4, "bf16", False, (192, 128), score_value=False)
    if hopper.available():
        assert plan.uses_gluon_sm90(meta(8, 16, 576), meta(100, 1, 576), 4, True, 512)
        assert plan.uses_gluon_sm90(meta(8, 16, 256), meta(100, 1, 256), 4, False, 256)
        assert plan.uses_gluon_sm90(
            meta(8, 16, 256), meta(100, 1, 256), 4, False, 256, score_value=False
        )
        fp8 = torch.empty(100, 1, 256, dtype=torch.float8_e4m3fn, device="meta")
        assert plan.uses_gluon_sm90(meta(8, 16, 256), fp8, 4, False, 256, score_value=False)
        assert not plan.uses_gluon_sm90(meta(8, 16, 256), fp8, 4, False, 256)


def test_hopper_kernel_takes_16_byte_copies_only():
    """Rows the Hopper kernel copies 16 bytes at a time: strides of 16
    elements and 16-byte aligned starts; other inputs go to the Triton
    kernel (the Hopper one does not compile for them)."""
    pool = torch.zeros(64 * 640 + 8, dtype=torch.bfloat16)
    assert hopper.copy_aligned(pool[: 64 * 576].view(64, 1, 576))
    assert hopper.copy_aligned(pool[: 64 * 640].view(64, 1, 640)[..., :576])  # padded rows
    assert not hopper.copy_aligned(pool[: 64 * 580].view(64, 1, 580)[..., :576])
    assert not hopper.copy_aligned(pool[: 64 * 600].view(64, 1, 600)[..., :576])  # 1200 bytes
    assert not hopper.copy_aligned(pool[1 : 1 + 64 * 576].view(64, 1, 576))  # 2 bytes off
    assert not hopper.copy_aligned(pool[4 : 4 + 64 * 576].view(64, 1, 576))  # 8 bytes off


def test_int64_index_tensors(device):
    batch = make_batch(4, 2, [21, 3], device=device)
    batch.kv_indices = batch.kv_indices.long()
    batch.kv_indptr = batch.kv_indptr.long()
    batch.qo_indptr = batch.qo_indptr.long()
    _run_and_check(batch, SMALL, device)


def _merge_shares(
    batch, part_o, part_lse, ctas, min_share, column_blocks, block_h=None, warps=kernel.MERGE_WARPS
):
    """Stage 2 after ``ctas`` CTAs per head block of ``block_h`` heads (all
    of them by default: one head block) on the given partials, into a
    NaN-filled output, in programs of ``warps`` warps."""
    out = batch.new_output()
    kernel.launch_merge_shares(
        out,
        batch.qo_indptr,
        batch.kv_indptr,
        part_o,
        part_lse,
        batch_size=batch.batch_size,
        draft_len=batch.draft_len,
        block_h=block_h or batch.num_heads,
        share_ctas=ctas,
        min_share=min_share,
        column_blocks=column_blocks,
        dependent=plan.dependent_launch(out.device),
        ragged=batch.q.shape[0] < batch.batch_size * batch.draft_len,
        warps=warps,
    )
    return out


@pytest.mark.parametrize("column_blocks", [1, 4, 16])
@pytest.mark.parametrize(
    "draft_len,ctas,min_share,prefix_lens,expected_pieces",
    [
        # Ragged: the drafts count DRAFT_POSITIONS (5) positions; share 3
        # begins in request 3's later draft positions, so request 4 is its
        # first (slot 6).
        (2, 5, 4, [0, 130, 7, 64, 300], [1, 2, 2, 1, 2]),
        # One request over every share, more of them than the merge's
        # slots (16 // next_pow2(L) a column block of 512), so each slot
        # merges several.
        (3, 12, 4, [2000], [9]),
        (1, 40, 4, [6000], [24]),
        # 31 positions: 30 shares would pass 1 + 4 sqrt(31), so 23.
        (8, 30, 1, [1900], [23]),
        # Ragged, 43 positions of 2 requests: at most 2 + 4 sqrt(86), 39
        # shares (43 would cut the first request 33 ways).
        (1, 43, 1, [2000, 64], [30, 2]),
        # Shares 1 and 4 hold later draft positions alone: no work.
        (1, 40, 4, [10, 0, 5], [1, 1, 1]),
        # Shares 2, 4, 5, 7 and 8 likewise; share 3 begins in request 0's.
        (1, 40, 2, [10, 0, 5], [2, 1, 1]),
        (4, 3, 4, [64] * 7, [1, 1, 1, 1, 2, 1, 1]),
        (4, 10, 16, [64] * 7, [1, 1, 1, 1, 1, 1, 1]),
        # Every request holds as many positions (10; lengths 513-576 all
        # take 9 tiles): 17 shares drop to 16, four a request, none across
        # two (unaligned, 17 shares would cut three requests five ways).
        (2, 17, 1, [576, 513, 540, 576], [4, 4, 4, 4]),
        # 32 requests of 2 positions on 17 shares: 16, two requests each.
        (1, 17, 1, [64] * 32, [1] * 32),
        # Too costly to align: 14 shares would drop to 12 (a seventh).
        (2, 14, 1, [256] * 4, [4, 3, 4, 3]),
        # Not every request holds as many positions: no alignment.
        (2, 17, 1, [576, 513, 540, 577], [3, 4, 4, 4]),
        # A long request of many pieces beside short ones of a few, at 4
        # and 8 drafts (wide tiles of 256 and 128 columns).
        (4, 20, 1, [3000, 100, 200], [15, 2, 2]),
        (8, 20, 1, [3000, 100, 200], [15, 2, 2]),
    ],
)
def test_merge_after_shares(
    draft_len, ctas, min_share, prefix_lens, expected_pieces, column_blocks, device, monkeypatch
):
    """Stage 2 after the Hopper kernel's balanced shares: it merges the
    partials of each request that several shares hold (drafts included, so
    it adds none) and leaves the others, which stage 1 writes, untouched;
    the same in every column blocking, where a request of at most
    MERGE_WIDE_PIECES pieces takes the wide tiles of fewer programs (with
    16 blocks here; with 1 and 4 the narrow ones where no fewer do)."""
    pieces = plan.share_plan(prefix_lens, ctas, min_share).pieces()
    assert [len(p) for p in pieces] == expected_pieces
    _check_merge_after_shares(draft_len, ctas, min_share, prefix_lens, column_blocks, device)


def test_merge_after_shares_past_one_plan_block(device):
    """Over PLAN_BLOCK (128) requests, stage 2's plan runs on into a second
    block: requests split on both sides of it are merged."""
    prefix_lens = [(b * 37) % 300 for b in range(150)]
    pieces = plan.share_plan(prefix_lens, 40, 1).pieces()
    split = [b for b, p in enumerate(pieces) if len(p) > 1]
    assert 127 in split and 142 in split
    _check_merge_after_shares(2, 40, 1, prefix_lens, 4, device)


@pytest.mark.parametrize("warps", [1, 2])
@pytest.mark.parametrize(
    "draft_len,ctas,prefix_lens,column_blocks",
    [(3, 12, [2000], 4), (4, 20, [3000, 100, 200], 16), (1, 17, [64] * 32, 1)],
)
def test_merge_after_shares_in_fewer_warps(
    draft_len, ctas, prefix_lens, column_blocks, warps, device
):
    """Stage 2 in programs of 1 or 2 warps (paged's, after the seesaw
    kernel) merges as in 4: one request over many shares, a long one
    beside short ones (wide tiles), many short ones."""
    _check_merge_after_shares(draft_len, ctas, 1, prefix_lens, column_blocks, device, warps=warps)


@pytest.mark.parametrize("warps", [1, 4])
@pytest.mark.parametrize(
    "draft_len,ctas,min_share,prefix_lens,column_blocks",
    [(3, 12, 1, [2000], 4), (4, 20, 3, [3000, 100, 200], 16), (1, 17, 2, [64] * 32, 1)],
)
def test_merge_from_a_step_plan(
    draft_len, ctas, min_share, prefix_lens, column_blocks, warps, device
):
    """A step's merge plan (seesaw_merge) holds each request's pieces as
    the share rule cuts them, and stage 2 reading it writes what stage 2
    planning its own writes: one request over many shares, a long one
    beside short ones (wide tiles), many short ones."""
    heads = 3
    batch = make_batch(heads, draft_len, prefix_lens, device=device)
    merge_plan = _step_merge_plan(batch, ctas, min_share)
    rows = merge_plan.view(batch.batch_size, -1).tolist()
    for b, slots in enumerate(plan.share_plan(prefix_lens, ctas, min_share).pieces()):
        first, slot0, pieces, _ = rows[b]
        later = [slot0 + 2 * j for j in range(1, pieces)]
        assert [first, *later] == slots, f"request {b}: plan {rows[b]}, the rule's slots {slots}"

    part_o, part_lse = _random_partials(ctas, heads, draft_len, device)
    expected = _merge_shares(batch, part_o, part_lse, ctas, min_share, column_blocks, warps=warps)
    out = batch.new_output()
    seesaw_merge.launch(
        out,
        merge_plan,
        part_o,
        part_lse,
        batch_size=batch.batch_size,
        draft_len=draft_len,
        column_blocks=column_blocks,
        dependent=plan.dependent_launch(out.device),
        warps=warps,
    )
    assert torch.equal(out.isnan(), expected.isnan()), "the rows stage 2 leaves to stage 1"
    assert torch.equal(out.nan_to_num(), expected.nan_to_num())


@pytest.mark.parametrize(
    "heads,draft_len,ctas,min_share,prefix_lens",
    [
        (3, 3, 12, 1, [2000]),
        (6, 3, 20, 3, [3000, 100, 200]),
        (8, 1, 17, 2, [64] * 32),
        (20, 1, 24, 3, [700, 900]),
        (16, 4, 12, 3, [2000, 300]),
    ],
)
def test_merge_over_request_rows(heads, draft_len, ctas, min_share, prefix_lens, device):
    """Stage 2 from a step's plan over a request's rows, several heads a
    program (seesaw_merge.launch_rows), writes what stage 2 a head a
    program writes: rows of three heads in one program; a head's drafts
    across two programs (6 heads of 3 drafts: rows 15-17); many short
    requests; a request's 20 rows in two programs; 64 rows a request at
    batch 2 (paged._rows_merge's 128 rows in all), in four programs."""
    batch = make_batch(heads, draft_len, prefix_lens, device=device)
    merge_plan = _step_merge_plan(batch, ctas, min_share)
    part_o, part_lse = _random_partials(ctas, heads, draft_len, device)
    expected = _merge_shares(batch, part_o, part_lse, ctas, min_share, column_blocks=4)
    out = batch.new_output()
    seesaw_merge.launch_rows(
        out,
        merge_plan,
        part_o,
        part_lse,
        batch_size=batch.batch_size,
        draft_len=draft_len,
        share_ctas=ctas,
        dependent=plan.dependent_launch(out.device),
    )
    assert torch.equal(out.isnan(), expected.isnan()), "the rows stage 2 leaves to stage 1"
    # The pieces a load differ, so the sums' order does too.
    check_close(out.nan_to_num(), expected.nan_to_num().float(), what="stage 2 over rows")


def _random_partials(ctas, heads, draft_len, device):
    """Stage 1's partials of ``ctas`` CTAs (two slots each), seeded: values
    [slots, heads, drafts, 512] and log2-sum-exps [slots, heads, drafts]."""
    gen = torch.Generator(device=device).manual_seed(0)
    part_o = torch.randn(2 * ctas, heads, draft_len, 512, generator=gen, device=device)
    part_lse = 4 * torch.randn(2 * ctas, heads, draft_len, generator=gen, device=device)
    return part_o, part_lse


def _step_merge_plan(batch, ctas, min_share):
    """A step's merge plan (seesaw_merge.launch_plan) for ``batch`` cut over
    ``ctas`` CTAs, in a tensor poisoned beforehand."""
    merge_plan = torch.full(
        (seesaw_merge.plan_numel(batch.batch_size),), -1, dtype=torch.int32, device=batch.q.device
    )
    seesaw_merge.launch_plan(
        merge_plan,
        batch.qo_indptr,
        batch.kv_indptr,
        batch_size=batch.batch_size,
        share_ctas=ctas,
        min_share=min_share,
    )
    return merge_plan


def _check_merge_after_shares(
    draft_len, ctas, min_share, prefix_lens, column_blocks, device, warps=kernel.MERGE_WARPS
):
    heads = 3
    batch = make_batch(heads, draft_len, prefix_lens, device=device)
    # The host-side model of the share rule, which stage 2 must follow.
    pieces = plan.share_plan(prefix_lens, ctas, min_share).pieces()
    part_o, part_lse = _random_partials(ctas, heads, draft_len, device)
    out = _merge_shares(batch, part_o, part_lse, ctas, min_share, column_blocks, warps=warps)

    for b, slots in enumerate(pieces):
        rows = slice(b * draft_len, (b + 1) * draft_len)
        if len(slots) == 1:
            assert torch.isnan(out[rows]).all(), f"request {b} is one share's: stage 1 writes it"
        else:
            # Weights 2^lse, normalised; [L, H, 512] like the output rows.
            weights = torch.softmax(part_lse[slots] * math.log(2), dim=0)
            merged = (weights[..., None] * part_o[slots]).sum(0).transpose(0, 1)
            check_close(out[rows], merged, what=f"request {b}: slots {slots}")


def test_merge_after_shares_ragged_and_empty_rows(device):
    """With ragged draft counts, stage 2 writes a split request's own rows
    alone (q packs the requests back to back), finding each head's rows
    where a request of E drafts packs them (row h E + i of one head block
    here), and a row every partial of which is empty (lse -inf: a mask hid
    all its keys) gets 0, not NaN."""
    heads, draft_len, ctas, min_share = 3, 3, 12, 4
    prefix_lens, counts = [2000, 64, 700], [1, 3, 2]
    batch = make_batch(heads, draft_len, prefix_lens, draft_counts=counts, device=device)
    model = plan.head_block_plan(prefix_lens, counts, heads, heads, draft_len, ctas, min_share)
    assert [len(model.pieces(b, 0)) > 1 for b in range(3)] == [True, False, True]
    gen = torch.Generator(device=device).manual_seed(0)
    rows = 2 * ctas * heads * draft_len
    part_o = torch.randn(rows, 512, generator=gen, device=device)
    part_lse = 4 * torch.randn(rows, generator=gen, device=device)
    hidden = [rows[1] for rows in model.pieces(2, 1)]
    part_lse[hidden] = float("-inf")  # request 2, head 1, draft 1 saw nothing
    part_o[hidden] = 0.0
    out = _merge_shares(batch, part_o, part_lse, ctas, min_share, column_blocks=4)
    _check_merged(out, model, part_o, part_lse, heads, draft_len, counts)
    assert bool((out[5, 1] == 0).all())


def _check_merged(out, model, part_o, part_lse, heads, draft_len, counts):
    """Each (request, head) that several CTAs hold is the softmax-weighted
    merge of its partials at the model's rows; the others are stage 1's
    to write (still NaN)."""
    first = 0  # each request's first row of q and the output
    for b, count in enumerate(counts):
        for h in range(heads):
            pieces = model.pieces(b, h)
            got = out[first : first + count, h]
            if len(pieces) == 1:
                assert torch.isnan(got).all(), f"request {b} head {h}: stage 1 writes it"
                continue
            rows = torch.tensor([piece[:count] for piece in pieces], device=out.device)
            weights = torch.softmax(part_lse[rows] * math.log(2), dim=0).nan_to_num()
            merged = (weights[..., None] * part_o[rows]).sum(0)
            check_close(got, merged, what=f"request {b} head {h}: rows {pieces}")
        first += count


@pytest.mark.parametrize(
    "heads,block_h,draft_len,ctas,min_share,counts",
    [
        # 4 head blocks of 2 heads at L = 4, 8 rows a tile; a request of 1
        # draft packs its 8 rows into one head block, of 2 drafts into two,
        # of 3 into three (24 rows; heads 2 and 5 straddle two tiles);
        # their head blocks get fewer CTAs.
        (8, 2, 4, 5, 1, [1, 2, 3, 4, 1, 1, 2, 4]),
        (8, 2, 4, 3, 4, [4, 1, 1, 1, 1, 1, 1, 1]),
        # 5 heads, 3 head blocks of 2 (the last one short); L = 3.
        (5, 2, 3, 7, 2, [2, 1, 3, 2, 3, 1]),
        # Every request has L drafts: each head block gets `ctas` CTAs.
        (6, 2, 2, 4, 1, [2] * 6),
    ],
)
@pytest.mark.parametrize("equal_prefixes", [False, True])
def test_merge_after_shares_over_head_blocks(
    heads, block_h, draft_len, ctas, min_share, counts, equal_prefixes, device
):
    """A ragged batch over several head blocks: stage 2 follows the host
    model of the Hopper kernel's plan (aligned shares, as many CTAs a head
    block as it has shares, a request of fewer drafts in fewer head blocks)
    for every (request, head); with prefixes of equal length too, where
    only aligned shares weigh the drafts as a ragged batch's."""
    prefix_lens = [600 if equal_prefixes else (b * 431) % 1500 for b in range(len(counts))]
    _check_over_head_blocks(heads, block_h, draft_len, ctas, min_share, counts, prefix_lens, device)


def test_merge_after_shares_aligned_many_pieces(device):
    """Aligned shares (one length over all head blocks) cut the 600-token
    request into 5 pieces, more than the 4 that equal cuts of 9 CTAs
    could: a bound on a request's pieces that stage 2 takes from the
    batch's lengths must allow for the aligned plan (wide merges: at L2
    a request of at most 4 pieces is merged by its first column block)."""
    model = plan.head_block_plan([1500, 600], [1, 1], 4, 2, 2, 9, 1)
    assert len(model.shares[0].pieces()[1]) == 5
    _check_over_head_blocks(4, 2, 2, 9, 1, [1, 1], [1500, 600], device)


def _check_over_head_blocks(
    heads, block_h, draft_len, ctas, min_share, counts, prefix_lens, device
):
    batch = make_batch(heads, draft_len, prefix_lens, draft_counts=counts, device=device)
    model = plan.head_block_plan(prefix_lens, counts, heads, block_h, draft_len, ctas, min_share)
    blocks = hopper.head_blocks(heads, block_h)
    if min(counts) == draft_len:
        assert model.first_ctas == [k * ctas for k in range(blocks)]
    else:
        shares = [plan.shares if plan else 0 for plan in model.shares]
        assert shares == sorted(shares, reverse=True), "head block 0 holds every request"
    rows = 2 * blocks * ctas * model.tile_rows
    gen = torch.Generator(device=device).manual_seed(1)
    part_o = torch.randn(rows, 512, generator=gen, device=device)
    part_lse = 4 * torch.randn(rows, generator=gen, device=device)
    out = _merge_shares(batch, part_o, part_lse, ctas, min_share, 2, block_h=block_h)
    _check_merged(out, model, part_o, part_lse, heads, draft_len, counts)


@pytest.mark.parametrize(
    "heads,block_h,draft_len,ctas,min_share,counts,prefix_lens",
    [
        (64, 16, 4, 33, 1, [2, 3, 1, 4, 2, 1, 3, 3], [16384] * 8),
        (128, 16, 4, 16, 2, [1, 4, 2, 3, 3, 2], [3000, 64, 0, 700, 5000, 130]),
        (40, 8, 3, 26, 1, [2, 1, 3, 1, 2, 2, 1, 3], [(b * 977) % 6000 for b in range(8)]),
        (16, 4, 4, 1, 1, [4, 1, 2], [900, 4000, 10]),  # one CTA a head block
    ],
)
def test_ragged_plan_aligns_head_blocks(
    heads, block_h, draft_len, ctas, min_share, counts, prefix_lens
):
    """Where some request has no heads in some head block, the plan cuts
    every head block's positions into shares of one length and orders the
    requests most drafts first: a request's prefix tile sits at the same
    position, so the same offset into a share, in every head block that
    holds it (their CTAs read it at about the same time, and the L2 serves
    the later reads). The head blocks' CTAs follow one another within the
    grid, and each holds at least min_share positions but the last."""
    model = plan.head_block_plan(prefix_lens, counts, heads, block_h, draft_len, ctas, min_share)
    blocks = hopper.head_blocks(heads, block_h)
    assert not all(all(p.present) for p in model.shares if p), "some head block lacks a request"
    used = [p.shares if p else 0 for p in model.shares]
    assert model.first_ctas == [sum(used[:k]) for k in range(blocks)]
    assert sum(used) <= blocks * ctas
    first = model.shares[0]
    share_len = first.starts[1] - first.starts[0]
    assert share_len >= min_share
    order = plan.ragged_order(counts)
    for share in model.shares:
        if share is None:
            continue
        # The cuts fall anywhere, so the drafts weigh a segment's fixed
        # cost even where every request holds as many tiles.
        assert share.drafts == hopper.DRAFT_POSITIONS
        total = share.starts[-1]
        assert share.starts == [min(c * share_len, total) for c in range(share.shares + 1)]
        held = [b for b in order if share.present[b]]
        assert held == order[: len(held)], "a head block's requests come first in the order"
        for b in held:
            assert share.bases[b] == first.bases[b], f"request {b}: one position everywhere"


@pytest.mark.parametrize(
    "batch_size,heads,draft_len,share_ctas,expected",
    [
        (8, 128, 1, 66, 1),  # 8 pieces of 512 a pair: one block
        (8, 64, 1, 132, 1),  # 16 pieces of 512: still one
        (8, 16, 2, 132, 4),  # 16 pieces x 2 drafts, and 16 heads: 4 blocks
        (8, 8, 8, 132, 8),  # 16 pieces x 8 drafts
        (1, 64, 1, 132, 8),
        (1, 16, 4, 132, 16),  # 132 pieces x 4 drafts: the most blocks
        (64, 16, 4, 132, 4),  # few pieces on average, but 16 heads: 4 blocks
        (64, 128, 4, 16, 1),  # every request whole
        (3, 5, 1, 1, 16),  # 5 heads: 13 blocks for 64 programs, rounded up
        (256, 12, 4, 132, 1),  # 3072 pairs: the program cap
        (256, 8, 2, 132, 2),
    ],
)
def test_merge_column_blocks(batch_size, heads, draft_len, share_ctas, expected):
    blocks = plan.merge_column_blocks(batch_size, heads, draft_len, share_ctas)
    assert blocks == expected
    assert 512 % blocks == 0


@pytest.mark.parametrize(
    ("cuda", "capability", "expected"),
    [
        ("13.0", (9, 0), True),
        ("13.0", (10, 0), True),
        ("13.0", (8, 0), False),
        (None, (9, 4), False),
    ],
)
def test_dependent_launch_only_on_cuda_sm90_and_later(monkeypatch, cuda, capability, expected):
    # launch_pdl is an option of CUDA's backend alone, and griddepcontrol
    # needs sm90; a ROCm build (torch.version.cuda None) never gets it.
    assert not plan.dependent_launch(torch.device("cpu"))
    monkeypatch.setattr(plan, "INTERPRETED", False)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    device_facts._capability.cache_clear()
    try:
        assert plan.dependent_launch(torch.device("cuda", 0)) is expected
    finally:
        device_facts._capability.cache_clear()


def test_stale_workspace_never_leaks(device):
    """A short request after a long one: splits the short one leaves empty
    still hold the long call's partials (and then NaN); neither may leak."""
    long = make_batch(4, 2, [90, 90], device=device)
    _run_and_check(long, SMALL, device)
    short = make_batch(4, 2, [2, 90], device=device)
    out = short.new_output()
    short.run(out, SMALL)  # workspace not re-poisoned: stale partials remain
    check_close(out, short.reference())


def test_pool_over_2_pow_31_elements(device):
    """Slots past 2**31 / 576: slot * stride must be 64-bit."""
    slots = (1 << 31) // 576 + 4096
    big = torch.empty(slots, 1, 576, dtype=torch.bfloat16, device=device)
    batch = make_batch(2, 2, [20, 13], device=device)
    high = torch.arange(slots - 40, slots - 7, device=device, dtype=torch.int32)
    big[high] = batch.k_buffer[batch.kv_indices]
    batch.k_buffer, batch.v_buffer = big, big[..., :512]
    batch.kv_indices = high
    _run_and_check(batch, SMALL, device)


def test_every_tile_candidate_is_correct(device):
    """Whatever the tuner may pick computes the same function."""
    batch = make_batch(8, 2, [70, 5], device=device)
    ref = batch.reference()
    for cand in tile_candidates(8, 2, "sm90") + tile_candidates(8, 2, "gfx950"):
        for splits in (1, 3):
            config = cand.with_splits(splits)
            _poison_workspace(device)
            out = batch.new_output()
            batch.run(out, config)
            check_close(out, ref, what=str(config))


def test_hopper_config_elsewhere_runs_the_triton_kernel_with_its_tile(device):
    """A "gluon_sm90" config where that kernel cannot run (the interpreter,
    another GPU, fp16) falls back to the Triton kernel, same answer."""
    batch = make_batch(8, 4, [70, 130], device=device)
    if plan.uses_gluon_sm90(batch.q, batch.k_buffer, 4, True):
        pytest.skip("this machine runs the Hopper kernel itself (GPU lane tests it)")
    _run_and_check(batch, hopper_config(8, 4, 2).with_splits(3), device)


@pytest.mark.parametrize(
    "kernel_name,kv_dtype,score_value",
    [
        ("gluon_sm90_sv", torch.bfloat16, True),
        ("gluon_sm90_sv", torch.float8_e4m3fn, True),
        ("gluon_sm90", torch.bfloat16, False),
        ("gluon_sm90", torch.float8_e4m3fn, False),
    ],
)
def test_hopper_config_picks_its_schedule(monkeypatch, device, kernel_name, kv_dtype, score_value):
    """Score/value runs where the config asks for it (MLA, bf16 or fp8
    KV), columns where it names columns."""
    launched = []
    monkeypatch.setattr(plan, "uses_gluon_sm90", lambda *args: True)
    monkeypatch.setattr(plan, "sm_count", lambda device: 132)
    fake_hopper = SimpleNamespace(launch_prefix=lambda *a, **kw: launched.append(kw["score_value"]))
    monkeypatch.setattr(hopper, "gluon_kernel", lambda *args, **kwargs: fake_hopper)
    batch = make_batch(16, 2, [70, 5], kv_dtype=kv_dtype, device=device)
    batch.run(batch.new_output(), hopper_config(16, 2, 2, kernel_name))
    assert launched == [score_value]


# --------------------------------------------------------------------- GPU lane

GPU_SHAPES = [
    # heads, draft_len, prefix_lens
    (8, 2, [65536] * 4),
    (16, 4, [16384] * 16),
    (128, 2, [4096] * 8),
    (64, 8, [8192] * 4),
    (12, 3, [3000, 1, 0, 16384, 77]),
    (16, 4, [65536] + [512] * 63),  # one long request among many short ones
    (8, 2, [(b * 7919) % 5000 for b in range(300)]),  # ragged, past PLAN_BLOCK
    (128, 1, [100, 20000]),
    (32, 5, [512] * 7),
    (128, 4, [2048] * 64),
    # Short ragged requests: on fine plans, shares that begin in a request's
    # later draft positions, and shares that hold nothing else.
    (8, 2, [0, 1, 0, 5, 64, 0, 0, 3, 130, 2]),
]


# Each GPU test runs bf16 KV and fp8 KV (the latter with the scales a
# calibrated fp8 cache carries: _gpu_batch).
gpu_kv_dtypes = pytest.mark.parametrize(
    "kv_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"]
)


def _gpu_batch(heads, draft_len, prefix_lens, kv_dtype, **kwargs):
    """A GPU batch in a pool about twice its prefix tokens, with fp8 KV's
    scales where kv_dtype is fp8."""
    scales = {} if kv_dtype == torch.bfloat16 else {"k_scale": 0.75, "v_scale": 1.25}
    return make_batch(
        heads,
        draft_len,
        prefix_lens,
        kv_dtype=kv_dtype,
        device="cuda",
        pool_slots=sum(prefix_lens) * 2 + 64,
        **scales,
        **kwargs,
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "heads,draft_len,prefix_lens",
    GPU_SHAPES,
    ids=[f"H{h}_L{l}_bs{len(p)}_max{max(p)}" for h, l, p in GPU_SHAPES],
)
@gpu_kv_dtypes
def test_gpu_matches_reference(heads, draft_len, prefix_lens, kv_dtype):
    _run_and_check(_gpu_batch(heads, draft_len, prefix_lens, kv_dtype), None, "cuda")


ON_HOPPER = (
    torch.cuda.is_available()
    and torch.cuda.get_device_capability() == (9, 0)
    and hopper.available()
)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU and Gluon")
@pytest.mark.parametrize("schedule", HOPPER_KERNELS)
@gpu_kv_dtypes
@pytest.mark.parametrize(
    "heads,draft_len,prefix_lens",
    GPU_SHAPES,
    ids=[f"H{h}_L{l}_bs{len(p)}_max{max(p)}" for h, l, p in GPU_SHAPES],
)
def test_gpu_hopper_kernel_matches_reference(
    heads, draft_len, prefix_lens, kv_dtype, schedule, monkeypatch
):
    batch = _gpu_batch(heads, draft_len, prefix_lens, kv_dtype)
    # The call must take the Gluon kernel, not the Triton fallback.
    assert _runs_hopper_kernel(batch, schedule)
    ref = batch.reference()
    for sms, min_share in SHARE_PLANS:
        _check_share_plan(batch, ref, schedule, sms, min_share, monkeypatch)


# (multiprocessors, share floor): the device's with the default floor, and
# plans that cut the batch finer (many small shares, most requests split;
# the finest, one position a share up to the cap of about 1 + 4 sqrt(P)
# shares a request of P positions) and coarser (few shares, most requests
# whole).
SHARE_PLANS = [(None, None), (7, 1), (None, 1), (None, 16)]


def _runs_hopper_kernel(batch, schedule) -> bool:
    """Whether a ``schedule`` config runs the Hopper kernel for ``batch``
    (MLA), not the Triton fallback."""
    score_value = runs_score_value(schedule, kv_dtype_name(batch.k_buffer.dtype))
    return plan.uses_gluon_sm90(
        batch.q, batch.k_buffer, batch.draft_len, True, score_value=score_value
    )


def _check_share_plan(batch, ref, schedule, sms, min_share, monkeypatch):
    if sms is not None:
        monkeypatch.setattr(plan, "sm_count", lambda device: sms)
    config = hopper_config(batch.num_heads, batch.draft_len, batch.batch_size, schedule)
    config = config.with_min_share(min_share)
    _poison_workspace("cuda")
    out = batch.new_output()
    assert batch.run(out, config) is True
    check_close(out, ref, what=f"{config}, {sms} SMs")
    monkeypatch.undo()


# How a call hands its drafts to the Hopper kernel: v_extend a tensor of its
# own (SGLang) or a view of k_extend; k_scale and v_scale scale the prefix
# only, v_extend_scale the drafts' values; with fp8 KV the consumers load
# the drafts themselves.
DRAFT_VARIANTS = {
    "v_extend_view": {"v_extend_from_k": True},
    "k_scale": {"k_scale": 0.5},
    "v_scale": {"v_scale": 1.5},
    "view_and_scales": {"v_extend_from_k": True, "k_scale": 0.75, "v_scale": 1.25},
    "fp8_kv": {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.75, "v_scale": 1.25},
    "v_extend_scale": {"v_scale": 1.5, "v_extend_scale": 0.7},
    "paged_scales": {"v_extend_from_k": True, "v_scale": 1.3, "v_extend_scale": 1.3},
    "fp8_paged_scales": {
        "kv_dtype": torch.float8_e4m3fn,
        "v_extend_from_k": True,
        "k_scale": 0.75,
        "v_scale": 1.3,
        "v_extend_scale": 1.3,
    },
}


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU and Gluon")
@pytest.mark.parametrize("schedule", HOPPER_KERNELS)
@pytest.mark.parametrize("variant", list(DRAFT_VARIANTS))
@pytest.mark.parametrize(
    "heads,draft_len,prefix_lens",
    [(16, 4, [3000, 1, 0, 700]), (128, 2, [64, 5000]), (8, 8, [130] * 5)],
    ids=["H16_L4_ragged", "H128_L2", "H8_L8"],
)
def test_gpu_hopper_kernel_draft_variants(
    heads, draft_len, prefix_lens, variant, schedule, monkeypatch
):
    batch = make_batch(heads, draft_len, prefix_lens, device="cuda", **DRAFT_VARIANTS[variant])
    assert _runs_hopper_kernel(batch, schedule)
    ref = batch.reference()
    for sms, min_share in SHARE_PLANS:
        _check_share_plan(batch, ref, schedule, sms, min_share, monkeypatch)


if hopper.available():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    _fp8_to_bf16 = hopper.gluon_kernel().fp8_to_bf16  # a kernel calls jitted functions by name

    @gluon.jit
    def _widen_codes(CODES, OUT):
        layout: gl.constexpr = gl.BlockedLayout([4], [32], [2], [0])
        offs = gl.arange(0, 256, layout=layout)
        gl.store(OUT + offs, _fp8_to_bf16(gl.load(CODES + offs)))


@triton.jit
def _widen_codes_triton(CODES, OUT):
    offs = tl.arange(0, 256)
    tl.store(OUT + offs, kernel._widen(tl.load(CODES + offs), tl.bfloat16, True))


def _check_widened_codes(widen) -> None:
    # widen(codes, out) writes the 256 e4m3 codes widened to bf16: bit for
    # bit torch's conversion but for the two NaNs (subnormals and -0 too).
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    codes = codes.cuda()
    out = torch.full((256,), float("nan"), dtype=torch.bfloat16, device="cuda")
    widen(codes, out)
    expected = codes.to(torch.bfloat16)
    finite = ~torch.isnan(expected)
    assert int(finite.sum()) == 254
    got, want = out[finite].view(torch.int16), expected[finite].view(torch.int16)
    wrong = (got != want).nonzero().flatten().tolist()
    assert not wrong, f"codes {[hex(int(finite.nonzero()[i])) for i in wrong[:8]]} differ"


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU and Gluon")
def test_gpu_fp8_to_bf16_is_exact_on_every_finite_code():
    """The Hopper kernel's e4m3 -> bf16 widening, against torch's."""
    _check_widened_codes(lambda codes, out: _widen_codes[(1,)](codes, out, num_warps=2))


@pytest.mark.gpu
@pytest.mark.skipif(torch.version.hip is not None, reason="PTX: NVIDIA only")
def test_gpu_triton_kernel_widens_fp8_exactly_on_every_finite_code():
    """The Triton kernel's e4m3 -> bf16 widening by PTX (NVIDIA), against
    torch's."""
    _check_widened_codes(lambda codes, out: _widen_codes_triton[(1,)](codes, out))


@pytest.mark.gpu
def test_gpu_strided_separate_v_fp16():
    batch = make_batch(
        16, 4, [5000, 33, 64], dtype=torch.float16, strided_q=True, separate_v=True, device="cuda"
    )
    _run_and_check(batch, None, "cuda")


@pytest.mark.gpu
def test_gpu_every_tile_candidate_is_correct():
    batch = make_batch(16, 4, [3000, 64, 1], device="cuda")
    ref = batch.reference()
    for cand in tile_candidates(16, 4, "sm90"):
        for splits in (1, 7):
            _poison_workspace("cuda")
            out = batch.new_output()
            batch.run(out, cand.with_splits(splits))
            check_close(out, ref, what=str(cand))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.5, "v_scale": 1.5}],
    ids=["bf16", "fp8"],
)
def test_gpu_value_chunks_are_correct(kwargs):
    """Every tile the NVIDIA search tries with value chunks of its own
    (V_CHUNK), on the GPU: MLA's 512 columns in chunks of 128 and of 64."""
    batch = make_batch(8, 4, [3000, 64, 1], device="cuda", **kwargs)
    ref = batch.reference()
    chunked = [c for c in tile_candidates(8, 4, "sm90", kernel="triton") if c.V_CHUNK]
    assert chunked
    for cand in chunked:
        _poison_workspace("cuda")
        out = batch.new_output()
        assert batch.run(out, cand.with_splits(7)) is True
        check_close(out, ref, what=str(cand))


@pytest.mark.gpu
def test_gpu_pool_over_2_pow_31_elements():
    slots = 3_800_000  # 2.19e9 elements of 576
    batch = make_batch(32, 2, [4096] * 8, device="cuda", pool_slots=slots)
    assert batch.k_buffer.numel() > 2**31
    _run_and_check(batch, None, "cuda")


# Every call an engine makes besides the uniform causal MLA one: trees,
# ragged draft counts, hidden prefix keys, ordinary attention's head dims.
GPU_VERIFY_CASES = [
    # id, heads, draft_len, prefix_lens, make_batch kwargs
    ("d256_H4", 4, 4, [16384] * 8, {"head_dims": (256, 256), "separate_v": True}),
    ("d256_H8_v_view", 8, 4, [8192] * 16, {"head_dims": (256, 256)}),
    ("d128_H16", 16, 4, [8192] * 8, {"head_dims": (128, 128), "separate_v": True}),
    (
        "ragged_empty_prefixes_H16_L4",
        16,
        4,
        [0 if b % 3 == 0 else (b * 7919) % 5000 for b in range(64)],
        {"draft_counts": [1 + b % 4 for b in range(64)]},
    ),
    (
        "ragged_past_plan_block_H8_L3",
        8,
        3,
        [(b * 7919) % 5000 for b in range(300)],
        {"draft_counts": [1 + b % 3 for b in range(300)]},
    ),
    (
        "d128_H8_v_view_ragged",
        8,
        3,
        [100, 0, 20000],
        {"head_dims": (128, 128), "draft_counts": [2, 3, 1]},
    ),
    ("tree_H16_L8", 16, 8, [4096] * 16, {"mask": "tree"}),
    (
        "tree_prefix_bits_H128_L4",
        128,
        4,
        [2048] * 8,
        {"mask": "tree", "hide_prefix": 0.2, "skip_prefix_custom_mask": False},
    ),
    (
        "tree_ragged_H16_L8",
        16,
        8,
        [3000, 0, 1, 16384, 77, 512],
        {"mask": "tree", "draft_counts": [8, 3, 1, 6, 8, 2]},
    ),
    (
        "prefix_all_hidden_H16_L4",
        16,
        4,
        [8192] * 4,
        {"mask": "tree", "hide_prefix": 1.0, "skip_prefix_custom_mask": False},
    ),
    (
        # The bench's ragged rows, smaller: equal prefixes, ragged drafts
        # over several head blocks (the aligned plan), where stage 1 once
        # planned from the wrong requests (fixed in 965e95d).
        "ragged_equal_prefixes_H64_L4",
        64,
        4,
        [2048] * 32,
        {"draft_counts": [1 + b % 4 for b in range(32)]},
    ),
    (
        # Ragged, but every request has rows in every head block (3 or 4
        # drafts of 32 heads: 96 or 128 rows, two tiles of 64; at H64 a
        # 3-draft request's 192 rows miss the fourth): each head block
        # keeps its row of CTAs, positions in the ragged order.
        "ragged_in_every_head_block_H32_L4",
        32,
        4,
        [(b * 7919) % 6000 for b in range(24)],
        {"draft_counts": [3 + b % 2 for b in range(24)]},
    ),
    (
        "d256_H16_tree_ragged",
        16,
        6,
        [4096] * 32,
        {
            "head_dims": (256, 256),
            "separate_v": True,
            "mask": "tree",
            "draft_counts": [1 + b % 6 for b in range(32)],
        },
    ),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "heads,draft_len,prefix_lens,kwargs",
    [c[1:] for c in GPU_VERIFY_CASES],
    ids=[c[0] for c in GPU_VERIFY_CASES],
)
@gpu_kv_dtypes
def test_gpu_verify_cases_match_reference(heads, draft_len, prefix_lens, kwargs, kv_dtype):
    _run_and_check(_gpu_batch(heads, draft_len, prefix_lens, kv_dtype, **kwargs), None, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "heads,draft_len,prefix_lens,kwargs",
    [c[1:] for c in GPU_VERIFY_CASES] + [(16, 4, [3000, 0, 129], {"dtype": torch.float16})],
    ids=[c[0] for c in GPU_VERIFY_CASES] + ["fp16_q_H16_L4"],
)
def test_gpu_triton_kernel_fp8_matches_reference(heads, draft_len, prefix_lens, kwargs):
    """fp8 KV on the Triton kernel, with its portable config (on NVIDIA
    its tiles widened by PTX; bf16 and fp16 queries)."""
    batch = _gpu_batch(heads, draft_len, prefix_lens, torch.float8_e4m3fn, **kwargs)
    head_dims = (batch.q.shape[-1], batch.v_buffer.shape[-1])
    config = block_config(
        heads, draft_len, batch.batch_size, "fp8_e4m3", kernel="triton", head_dims=head_dims
    )
    assert config.kernel == "triton"
    _run_and_check(batch, config, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(8))
def test_gpu_random_trees(seed):
    batch, _ = _random_tree_batch(seed, "cuda", big=True)
    _run_and_check(batch, None, "cuda")


HOPPER_CALLS = [
    # id, make_batch kwargs
    ("ragged", {"draft_counts": [4, 2, 1, 3, 1]}),
    ("tree", {"mask": "tree"}),
    ("tree_ragged", {"mask": "tree", "draft_counts": [1, 4, 3, 2, 4]}),
    ("causal_mask", {"mask": "causal"}),
    ("prefix_bits", {"mask": "tree", "hide_prefix": 0.3, "skip_prefix_custom_mask": False}),
    (
        "prefix_bits_ragged",
        {
            "mask": "causal",
            "hide_prefix": 0.2,
            "skip_prefix_custom_mask": False,
            "draft_counts": [3, 1, 4, 4, 2],
        },
    ),
]


def _call_plan(batch, config):
    return plan.plan_call(
        batch.q,
        batch.k_extend,
        batch.v_extend,
        batch.k_buffer,
        batch.v_buffer,
        batch_size=len(batch.prefix_lens),
        draft_len=batch.draft_len,
        config=config,
        masked=batch.custom_mask is not None,
        skip_prefix_mask=batch.skip_prefix_custom_mask,
    )


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU and Gluon")
@pytest.mark.parametrize("kwargs", [c[1] for c in HOPPER_CALLS], ids=[c[0] for c in HOPPER_CALLS])
@gpu_kv_dtypes
@pytest.mark.parametrize("schedule", HOPPER_KERNELS)
def test_gpu_hopper_kernel_runs_ragged_and_masked_calls(schedule, kv_dtype, kwargs):
    """Ragged drafts, tree masks and prefix mask bits run on the Hopper
    kernel, in both schedules, with requests held whole by one CTA and
    split over several (3000 tokens), empty prefixes included."""
    batch = _gpu_batch(16, 4, [3000, 64, 1, 0, 700], kv_dtype, **kwargs)
    config = hopper_config(16, 4, 5, schedule)
    assert _call_plan(batch, config).hopper
    _run_and_check(batch, config, "cuda")


# Ragged drafts over several head blocks: a request of E drafts packs its
# H E rows densely, so it has rows in fewer head blocks, and those get
# fewer CTAs (plan.head_block_plan); a head's drafts may straddle two tiles
# (at H64 L4, three drafts: heads 21 and 42). 40 heads at L = 3: tiles of
# 63 rows (21 heads at L), one draft's 40 rows in one tile, two drafts'
# 80 in two (head 31 straddling them).
PACKED_CALLS = [
    # id, heads, draft_len, make_batch kwargs
    ("H64_L4", 64, 4, {"draft_counts": [1, 4, 2, 3, 1, 1, 2, 4]}),
    ("H128_L2_tree", 128, 2, {"mask": "tree", "draft_counts": [1, 2, 1, 1, 2, 1, 2, 1]}),
    (
        "H40_L3_prefix_bits",
        40,
        3,
        {
            "mask": "causal",
            "hide_prefix": 0.2,
            "skip_prefix_custom_mask": False,
            "draft_counts": [2, 1, 3, 1, 2, 2, 1, 3],
        },
    ),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU and Gluon")
@pytest.mark.parametrize("schedule", HOPPER_KERNELS)
@gpu_kv_dtypes
@pytest.mark.parametrize(
    "heads,draft_len,kwargs", [c[1:] for c in PACKED_CALLS], ids=[c[0] for c in PACKED_CALLS]
)
def test_gpu_hopper_kernel_packs_ragged_drafts(
    heads, draft_len, kwargs, kv_dtype, schedule, monkeypatch
):
    """Ragged drafts packed into fewer tiles, over every share plan:
    requests held whole and split (5000 tokens), empty prefixes included."""
    prefix_lens = [3000, 64, 1, 0, 700, 5000, 130, 9]
    batch = _gpu_batch(heads, draft_len, prefix_lens, kv_dtype, **kwargs)
    config = hopper_config(heads, draft_len, len(prefix_lens), schedule)
    assert _call_plan(batch, config).hopper
    model = plan.head_block_plan(
        prefix_lens, kwargs["draft_counts"], heads, config.BLOCK_H, draft_len, 16, 1
    )
    assert len(model.first_ctas) > 1 and model.shares[-1].present.count(True) < len(prefix_lens)
    ref = batch.reference()
    for sms, min_share in SHARE_PLANS:
        _check_share_plan(batch, ref, schedule, sms, min_share, monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU and Gluon")
@pytest.mark.parametrize("schedule", HOPPER_KERNELS)
@pytest.mark.parametrize("prefix_len", [20, 5000], ids=["whole", "split"])
def test_gpu_hopper_row_that_sees_no_key_gets_zero(schedule, prefix_len):
    """On the Hopper kernel too, a row whose bits are all off gets 0, whether
    one CTA holds its request or several do (then every partial of the row
    is empty and the merge gets sum 0)."""
    batch = make_batch(
        16, 4, [prefix_len, 6], mask="tree", skip_prefix_custom_mask=False, device="cuda"
    )
    width = prefix_len + 4  # request 0's row: its prefix, then its drafts
    start = int(batch.mask_indptr[0]) + 2 * width
    batch.custom_mask[start : start + width] = False
    config = hopper_config(16, 4, 2, schedule)
    assert _call_plan(batch, config).hopper
    ref = batch.reference()
    assert bool((ref[2] == 0).all())
    _run_and_check(batch, config, "cuda")


# Ordinary attention on the Hopper kernel: V a cache of its own (as SGLang
# passes it) or K itself, drafts causal, ragged or masked, scaled prefixes.
SHARED_KV_CALLS = [
    # id, make_batch kwargs
    ("v_separate", {"separate_v": True}),
    ("v_is_k", {}),
    ("ragged_tree", {"separate_v": True, "mask": "tree", "draft_counts": [1, 4, 3, 2, 4]}),
    (
        "prefix_bits",
        {"separate_v": True, "mask": "tree", "hide_prefix": 0.3, "skip_prefix_custom_mask": False},
    ),
    ("scales", {"separate_v": True, "k_scale": 0.75, "v_scale": 1.25}),
]
# Their fp8 KV runs the columns schedule only (a score/value config runs it
# too); MLA's fp8 takes both.
FP8_SHARED_KV_CALLS = [
    ("fp8_scales", {"separate_v": True, "k_scale": 0.75, "v_scale": 1.25}),
    ("fp8_v_is_k", {}),
    ("fp8_ragged_tree", {"separate_v": True, "mask": "tree", "draft_counts": [1, 4, 3, 2, 4]}),
    (
        "fp8_prefix_bits",
        {"separate_v": True, "mask": "tree", "hide_prefix": 0.3, "skip_prefix_custom_mask": False},
    ),
]
SHARED_KV_SCHEDULE_CALLS = [
    *[(schedule, name, kwargs) for schedule in HOPPER_KERNELS for name, kwargs in SHARED_KV_CALLS],
    *[
        ("gluon_sm90", name, {**kwargs, "kv_dtype": torch.float8_e4m3fn})
        for name, kwargs in FP8_SHARED_KV_CALLS
    ],
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs an sm90 GPU and Gluon")
@pytest.mark.parametrize("head_dims", [(256, 256), (128, 128)], ids=["d256", "d128"])
@pytest.mark.parametrize(
    "schedule,kwargs",
    [c[::2] for c in SHARED_KV_SCHEDULE_CALLS],
    ids=[f"{c[0]}-{c[1]}" for c in SHARED_KV_SCHEDULE_CALLS],
)
def test_gpu_hopper_kernel_runs_shared_kv_head_dims(head_dims, schedule, kwargs, monkeypatch):
    """256/256 and 128/128 (one KV head, no rope) run on either schedule of
    the Hopper kernel, fp8 KV on columns, over every share plan, requests
    held whole and split, empty prefixes included."""
    batch = make_batch(16, 4, [3000, 64, 1, 0, 700], device="cuda", head_dims=head_dims, **kwargs)
    assert _call_plan(batch, hopper_config(16, 4, 5, schedule)).hopper
    ref = batch.reference()
    for sms, min_share in SHARE_PLANS:
        _check_share_plan(batch, ref, schedule, sms, min_share, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["uniform", "ragged", "tree"])
def test_gpu_graph_replay_after_lengths_change(kind):
    """One captured graph replays after the engine rewrites prefix lengths,
    slots and contents in place (same batch size), and for ragged and tree
    batches the draft counts and mask bits too: the kernels read them all on
    the device."""
    import mla_verify

    heads, draft_len, bs, slots = 16, 4, 8, 80_000
    mask = "tree" if kind == "tree" else None
    masked = {"mask": mask, "hide_prefix": 0.1, "skip_prefix_custom_mask": False} if mask else {}
    ragged = kind != "uniform"
    first = make_batch(
        heads,
        draft_len,
        [4000] * bs,
        draft_counts=[4, 1, 3, 2, 4, 1, 2, 3] if ragged else None,
        device="cuda",
        pool_slots=slots,
        seed=1,
        **masked,
    )
    second = make_batch(
        heads,
        draft_len,
        [7000, 1, 0, 513, 64, 9000, 3, 2048],
        # As many rows in all: q keeps its shape.
        draft_counts=[1, 4, 2, 3, 2, 3, 4, 1] if ragged else None,
        device="cuda",
        pool_slots=slots,
        seed=2,
        **masked,
    )
    mla_verify.prepare_workspace(bs, heads, draft_len)
    # Static buffers the graph reads, sized for the larger lists.
    kv_indices = torch.zeros(slots, dtype=torch.int32, device="cuda")
    kv_indices[: first.kv_indices.numel()] = first.kv_indices
    custom_mask = mask_indptr = None
    if mask:
        custom_mask = torch.zeros(slots * draft_len, dtype=torch.bool, device="cuda")
        custom_mask[: first.custom_mask.numel()] = first.custom_mask
        mask_indptr = first.mask_indptr
    out = first.new_output()

    def call():
        verify_mla_fwd(
            first.q,
            first.k_extend,
            first.v_extend,
            out,
            first.k_buffer,
            first.v_buffer,
            first.qo_indptr,
            first.kv_indptr,
            kv_indices,
            custom_mask,
            True,
            mask_indptr,
            draft_len,
            sm_scale=first.sm_scale,
            skip_prefix_custom_mask=first.skip_prefix_custom_mask,
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compile and warm up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    out.fill_(float("nan"))
    graph.replay()
    first.kv_indices = kv_indices[: first.kv_indices.numel()]
    if mask:
        first.custom_mask = custom_mask[: first.custom_mask.numel()]
    check_close(out, first.reference(), what="first replay")

    names = ["q", "k_extend", "v_extend", "k_buffer", "qo_indptr", "kv_indptr"]
    for name in names + (["mask_indptr"] if mask else []):
        getattr(first, name).copy_(getattr(second, name))
    kv_indices[: second.kv_indices.numel()] = second.kv_indices
    if mask:
        custom_mask[: second.custom_mask.numel()] = second.custom_mask
        second.custom_mask = custom_mask[: second.custom_mask.numel()]
    out.fill_(float("nan"))
    graph.replay()
    second.kv_indices = kv_indices[: second.kv_indices.numel()]
    check_close(out, second.reference(), what="replay after lengths and counts changed")
