"""Float32 PyTorch reference of MLA target-verify attention: the truth for the
tests, the tuner and the benchmarks.

Vectorised over requests (padded to the longest prefix, in chunks that bound
memory), so it also serves as a GPU baseline. It reads ``qo_indptr`` and
``kv_indptr`` on the host: it synchronises, unlike the kernel.
"""

from __future__ import annotations

import math

import torch

D_NOPE = 512

# fp32 bytes the padded score/KV blocks of one chunk may take.
_CHUNK_BYTES = 2 << 30


def verify_mla_reference(
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    *,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """o[T, H, Dv] in float32 for q[T, H, D].

    Request b's rows qo_indptr[b]..qo_indptr[b+1] (L of them) attend to its
    whole prefix kv_indices[kv_indptr[b]:kv_indptr[b+1]] (scaled by k_scale /
    v_scale) and causally to its own drafts k_extend/v_extend (unscaled).
    For draft row i of request b and head h, over the keys t it sees (the
    prefix slots, then drafts 0..i)::

        score(t) = sm_scale * s_t * (q[i, h, :] . k[t, :])   s_t: k_scale on the prefix, 1 on drafts
        p(t)     = exp(score(t)) / sum_u exp(score(u))
        o[i, h]  = sum_t p(t) * r_t * v[t, :]                r_t: v_scale on the prefix, 1 on drafts

    with k rows of width D (576: 512 latent + 64 rope columns) and v rows of
    width Dv (512).
    """
    num_tokens, num_heads, head_dim = q.shape
    dv = v_buffer.shape[-1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    qo = qo_indptr.tolist()
    kv = kv_indptr.tolist()
    bs = len(qo) - 1
    draft_len = qo[1] - qo[0] if bs else 0
    if any(qo[b + 1] - qo[b] != draft_len for b in range(bs)):
        raise ValueError("qo_indptr: the reference expects one draft length for all requests")

    out = torch.empty(num_tokens, num_heads, dv, dtype=torch.float32, device=q.device)
    max_prefix = max([kv[b + 1] - kv[b] for b in range(bs)] + [0])
    per_request = (max_prefix + draft_len) * (head_dim + dv + num_heads * draft_len * 2) * 4
    chunk = max(1, _CHUNK_BYTES // max(per_request, 1))
    for first in range(0, bs, chunk):
        reqs = range(first, min(bs, first + chunk))
        rows = slice(qo[reqs[0]], qo[reqs[-1] + 1])
        out[rows] = _attend_chunk(
            q[rows].float(),
            k_extend[rows, 0].float(),
            v_extend[rows, 0].float(),
            k_buffer,
            v_buffer,
            kv_indices,
            [(kv[b], kv[b + 1]) for b in reqs],
            draft_len,
            sm_scale,
            k_scale,
            v_scale,
        )
    return out


def _attend_chunk(
    q: torch.Tensor,  # [n*L, H, D]
    k_ext: torch.Tensor,  # [n*L, D]
    v_ext: torch.Tensor,  # [n*L, Dv]
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indices: torch.Tensor,
    spans: list[tuple[int, int]],
    draft_len: int,
    sm_scale: float,
    k_scale: float,
    v_scale: float,
) -> torch.Tensor:
    n = len(spans)
    num_heads, head_dim = q.shape[1], q.shape[2]
    device = q.device
    lens = torch.tensor([e - s for s, e in spans], device=device)
    max_len = int(lens.max().item()) if n else 0

    # Padded prefix [n, P] gathered once per request; padding is masked out.
    pos = torch.arange(max_len, device=device)
    valid = pos[None, :] < lens[:, None]  # [n, P]
    starts = torch.tensor([s for s, _ in spans], device=device)
    flat = (starts[:, None] + pos[None, :]).clamp(max=max(kv_indices.numel() - 1, 0))
    slots = kv_indices[flat].long() if kv_indices.numel() else flat
    k_pre = _gather(k_buffer, slots) * k_scale  # [n, P, D]
    v_pre = _gather(v_buffer, slots) * v_scale  # [n, P, Dv]
    k_pre = torch.where(valid[..., None], k_pre, 0.0)
    v_pre = torch.where(valid[..., None], v_pre, 0.0)

    qr = q.view(n, draft_len, num_heads, head_dim)
    ke = k_ext.view(n, draft_len, head_dim)
    ve = v_ext.view(n, draft_len, -1)
    s_pre = torch.einsum("nlhd,npd->nhlp", qr, k_pre) * sm_scale
    s_pre = s_pre.masked_fill(~valid[:, None, None, :], float("-inf"))
    s_ext = torch.einsum("nlhd,njd->nhlj", qr, ke) * sm_scale
    causal = torch.ones(draft_len, draft_len, dtype=torch.bool, device=device).tril()
    s_ext = s_ext.masked_fill(~causal, float("-inf"))

    probs = torch.softmax(torch.cat([s_pre, s_ext], dim=-1), dim=-1)
    o = torch.einsum("nhlp,npd->nlhd", probs[..., :max_len], v_pre)
    o += torch.einsum("nhlj,njd->nlhd", probs[..., max_len:], ve)
    return o.reshape(n * draft_len, num_heads, -1)


def _gather(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """buffer[slots, 0] as float32; fp8 rows move as bytes (CPU indexing
    kernels do not cover every fp8 dtype)."""
    if buffer.element_size() == 1 and buffer.dtype != torch.uint8:
        return buffer[:, 0].view(torch.uint8)[slots].view(buffer.dtype).float()
    return buffer[slots, 0].float()
