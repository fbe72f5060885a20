"""Float32 PyTorch reference of target-verify attention with one shared KV
head: the truth for the tests, the tuner and the benchmarks.

Vectorised over requests (padded to the longest prefix and the most drafts,
in chunks that bound memory), so it also serves as a GPU baseline. It reads
``qo_indptr``, ``kv_indptr`` and ``mask_indptr`` on the host: it
synchronises, unlike the kernel.
"""

from __future__ import annotations

import math

import torch

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
    custom_mask: torch.Tensor | None = None,
    mask_indptr: torch.Tensor | None = None,
    skip_prefix_custom_mask: bool = True,
) -> torch.Tensor:
    """o[T, H, Dv] in float32 for q[T, H, Dqk].

    Request b's rows qo_indptr[b]..qo_indptr[b+1] (E_b of them) attend to its
    prefix kv_indices[kv_indptr[b]:kv_indptr[b+1]] (P_b keys, scaled by
    k_scale / v_scale) and to its own drafts k_extend/v_extend (unscaled):
    causally, or where ``custom_mask[mask_indptr[b] + i * (P_b + E_b) + j]``
    is set (prefix keys first; with ``skip_prefix_custom_mask`` the prefix
    is visible to every row). A row that sees no key gets 0, as do rows past
    qo_indptr[-1].

    For row i of request b and head h, over the keys t it sees::

        score(t) = sm_scale * s_t * (q[i, h, :] . k[t, :])   s_t: k_scale on the prefix, 1 on drafts
        p(t)     = exp(score(t)) / sum_u exp(score(u))
        o[i, h]  = sum_t p(t) * r_t * v[t, :]                r_t: v_scale on the prefix, 1 on drafts

    with k rows of width Dqk (MLA: 512 latent + 64 rope columns) and v rows
    of width Dv (MLA: 512, the first latent columns).
    """
    num_tokens, num_heads, head_dim = q.shape
    dv = v_buffer.shape[-1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    qo = qo_indptr.tolist()
    kv = kv_indptr.tolist()
    bs = len(qo) - 1
    counts = [qo[b + 1] - qo[b] for b in range(bs)]
    lens = [kv[b + 1] - kv[b] for b in range(bs)]
    if custom_mask is not None:  # request b's bits: E_b rows of P_b + E_b
        starts = mask_indptr.tolist()
        grids = [
            custom_mask[starts[b] : starts[b] + counts[b] * (lens[b] + counts[b])]
            for b in range(bs)
        ]

    out = torch.zeros(num_tokens, num_heads, dv, dtype=torch.float32, device=q.device)
    max_prefix, max_drafts = max(lens + [0]), max(counts + [1])
    per_request = (max_prefix + max_drafts) * (head_dim + dv + num_heads * max_drafts * 2) * 4
    chunk = max(1, _CHUNK_BYTES // max(per_request, 1))
    for first in range(0, bs, chunk):
        reqs = range(first, min(bs, first + chunk))
        bits = None if custom_mask is None else [grids[b] for b in reqs]
        _attend_chunk(
            out,
            q,
            k_extend,
            v_extend,
            k_buffer,
            v_buffer,
            kv_indices,
            [(qo[b], qo[b + 1]) for b in reqs],
            [(kv[b], kv[b + 1]) for b in reqs],
            bits,
            skip_prefix_custom_mask,
            sm_scale,
            k_scale,
            v_scale,
        )
    return out


def _attend_chunk(
    out: torch.Tensor,  # [T, H, Dv], written at the chunk's rows
    q: torch.Tensor,  # [T, H, D]
    k_extend: torch.Tensor,  # [T, 1, D]
    v_extend: torch.Tensor,  # [T, 1, Dv]
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indices: torch.Tensor,
    rows: list[tuple[int, int]],
    spans: list[tuple[int, int]],
    bits: list[torch.Tensor] | None,
    skip_prefix_mask: bool,
    sm_scale: float,
    k_scale: float,
    v_scale: float,
) -> None:
    n = len(spans)
    device = q.device
    lens = torch.tensor([e - s for s, e in spans], device=device)
    counts = torch.tensor([e - s for s, e in rows], device=device)
    max_len = int(lens.max().item()) if n else 0
    max_rows = max(1, int(counts.max().item()) if n else 0)

    # Padded drafts [n, E]: request k's rows rows[k][0] + i for i < E_k.
    offs_e = torch.arange(max_rows, device=device)
    own = offs_e[None, :] < counts[:, None]  # [n, E]
    q_first = torch.tensor([s for s, _ in rows], device=device)
    row = (q_first[:, None] + offs_e[None, :]).clamp(max=max(q.shape[0] - 1, 0))
    qr = q[row].float()  # [n, E, H, D]
    ke = k_extend[row, 0].float()  # [n, E, D]
    ve = v_extend[row, 0].float()  # [n, E, Dv]

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

    # Which key each row sees: [n, E, P] and [n, E, E].
    sees_pre = valid[:, None, :].expand(n, max_rows, max_len).clone()
    causal = torch.ones(max_rows, max_rows, dtype=torch.bool, device=device).tril()
    sees_ext = causal[None] & own[:, None, :]
    if bits is not None:
        sees_ext = torch.zeros_like(sees_ext)
        for k, b in enumerate(bits):
            e, p = int(counts[k]), int(lens[k])
            grid = b.to(device=device, dtype=torch.bool).view(e, p + e)
            sees_ext[k, :e, :e] = grid[:, p:]
            if not skip_prefix_mask:
                sees_pre[k, :e, :p] &= grid[:, :p]

    s_pre = torch.einsum("nlhd,npd->nhlp", qr, k_pre) * sm_scale
    s_pre = s_pre.masked_fill(~sees_pre[:, None], float("-inf"))
    s_ext = torch.einsum("nlhd,njd->nhlj", qr, ke) * sm_scale
    s_ext = s_ext.masked_fill(~sees_ext[:, None], float("-inf"))

    # A row that sees nothing has all -inf scores: softmax gives NaN, and it gets 0.
    probs = torch.softmax(torch.cat([s_pre, s_ext], dim=-1), dim=-1).nan_to_num(0.0)
    o = torch.einsum("nhlp,npd->nlhd", probs[..., :max_len], v_pre)
    o += torch.einsum("nhlj,njd->nlhd", probs[..., max_len:], ve)
    out[row[own]] = o[own]


def _gather(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """buffer[slots, 0] as float32; fp8 rows move as bytes (CPU indexing
    kernels do not cover every fp8 dtype)."""
    if buffer.element_size() == 1 and buffer.dtype != torch.uint8:
        return buffer[:, 0].view(torch.uint8)[slots].view(buffer.dtype).float()
    return buffer[slots, 0].float()
