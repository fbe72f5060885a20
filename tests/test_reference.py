"""The float32 reference against a plain per-row computation, on the cases
it generalises to: ragged draft counts, masks (prefix bits read or not),
rows that see nothing, and head dims other than MLA's. CPU only."""

from __future__ import annotations

import pytest
import torch

from mla_verify.testing import make_batch


def _per_row(batch) -> torch.Tensor:
    """Each row of each request on its own, float64: the keys it sees, one
    softmax."""
    qo, kv = batch.qo_indptr.tolist(), batch.kv_indptr.tolist()
    out = torch.zeros(batch.q.shape[0], batch.num_heads, batch.v_buffer.shape[-1])
    k_buffer = (
        batch.k_buffer[:, 0].view(torch.uint8) if batch.k_buffer.element_size() == 1 else None
    )
    for b in range(batch.batch_size):
        rows, slots = range(qo[b], qo[b + 1]), batch.kv_indices[kv[b] : kv[b + 1]].long()
        e, p = len(rows), len(slots)
        if k_buffer is not None:  # fp8 rows move as bytes
            k_pre = k_buffer[slots].view(batch.k_buffer.dtype).double()
            v_pre = batch.v_buffer[:, 0].view(torch.uint8)[slots].view(batch.v_buffer.dtype)
        else:
            k_pre, v_pre = batch.k_buffer[slots, 0].double(), batch.v_buffer[slots, 0]
        keys = torch.cat(
            [k_pre * batch.k_scale, batch.k_extend[rows.start : rows.stop, 0].double()]
        )
        values = torch.cat(
            [v_pre.double() * batch.v_scale, batch.v_extend[rows.start : rows.stop, 0].double()]
        )
        for i, row in enumerate(rows):
            sees = torch.cat([torch.ones(p, dtype=torch.bool), torch.arange(e) <= i])
            if batch.custom_mask is not None:
                start = int(batch.mask_indptr[b]) + i * (p + e)
                bits = batch.custom_mask[start : start + p + e].bool()
                sees = bits.clone()
                if batch.skip_prefix_custom_mask:
                    sees[:p] = True
            if not bool(sees.any()):
                continue  # sees nothing: 0
            scores = batch.q[row].double() @ keys[sees].T * batch.sm_scale  # [H, keys]
            out[row] = (torch.softmax(scores, -1) @ values[sees]).float()
    return out


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"draft_counts": [3, 1, 2]},
        {"mask": "tree", "draft_counts": [3, 1, 2]},
        {"mask": "tree", "hide_prefix": 0.5, "skip_prefix_custom_mask": False},
        {"mask": "tree", "hide_prefix": 0.5, "skip_prefix_custom_mask": True},
        {"mask": "causal", "hide_prefix": 1.0, "skip_prefix_custom_mask": False},
        {"head_dims": (256, 256), "separate_v": True, "mask": "tree"},
        {"head_dims": (128, 128), "kv_dtype": torch.float8_e4m3fn, "k_scale": 0.5, "v_scale": 2.0},
    ],
    ids=[
        "uniform",
        "ragged",
        "tree_ragged",
        "prefix_bits_read",
        "prefix_bits_skipped",
        "prefix_all_hidden",
        "d256_tree",
        "d128_fp8",
    ],
)
def test_reference_matches_per_row_softmax(kwargs):
    batch = make_batch(3, 3, [7, 0, 12], seed=5, **kwargs)
    torch.testing.assert_close(batch.reference(), _per_row(batch), atol=1e-4, rtol=1e-4)


def test_reference_gives_a_row_that_sees_nothing_zero():
    batch = make_batch(2, 3, [5, 4], mask="tree", skip_prefix_custom_mask=False, seed=1)
    start = int(batch.mask_indptr[1]) + 1 * (4 + 3)  # request 1, row 1
    batch.custom_mask[start : start + 7] = False
    ref = batch.reference()
    assert bool((ref[4] == 0).all()) and bool(torch.isfinite(ref).all())
    torch.testing.assert_close(ref, _per_row(batch), atol=1e-4, rtol=1e-4)
