"""The float32 reference against a plain per-row computation, on the cases
it generalises to: ragged draft counts and head dims other than MLA's. CPU
only."""

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
            scores = batch.q[row].double() @ keys[sees].T * batch.sm_scale  # [H, keys]
            out[row] = (torch.softmax(scores, -1) @ values[sees]).float()
    return out


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"draft_counts": [3, 1, 2]},
        {"head_dims": (256, 256), "separate_v": True, "draft_counts": [1, 3, 2]},
        {"head_dims": (128, 128), "kv_dtype": torch.float8_e4m3fn, "k_scale": 0.5, "v_scale": 2.0},
    ],
    ids=["uniform", "ragged", "d256_ragged", "d128_fp8"],
)
def test_reference_matches_per_row_softmax(kwargs):
    batch = make_batch(3, 3, [7, 0, 12], seed=5, **kwargs)
    torch.testing.assert_close(batch.reference(), _per_row(batch), atol=1e-4, rtol=1e-4)
