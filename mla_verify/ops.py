"""torch.library custom ops: the entry points inside ``torch.compile`` graphs.

    mla_verify::verify_mla_paged(Tensor q, Tensor kv_cache, Tensor block_table,
        Tensor cache_seqlens, float? sm_scale=None, float k_scale=1., float v_scale=1.,
        Tensor? qo_indptr=None, Tensor? kv_indptr=None, Tensor? kv_indices=None) -> Tensor
    mla_verify::verify_mla_paged_out(Tensor q, Tensor kv_cache, Tensor block_table,
        Tensor cache_seqlens, Tensor(a!) out, float? sm_scale=None, float k_scale=1.,
        float v_scale=1., Tensor? qo_indptr=None, Tensor? kv_indptr=None,
        Tensor? kv_indices=None) -> ()
    mla_verify::paged_metadata_out(Tensor kv_cache, Tensor block_table,
        Tensor cache_seqlens, int draft_len, Tensor(a!) qo_indptr, Tensor(b!) kv_indptr,
        Tensor(c!) kv_indices) -> ()
    mla_verify::verify_mla_fwd(Tensor q_extend, Tensor k_extend, Tensor v_extend,
        Tensor(a!) o_extend, Tensor k_buffer, Tensor v_buffer, Tensor qo_indptr,
        Tensor kv_indptr, Tensor kv_indices, Tensor? custom_mask, bool is_causal,
        Tensor? mask_indptr, int max_len_extend, float k_scale=1., float v_scale=1.,
        float? sm_scale=None, bool skip_prefix_custom_mask=True, int? max_bs=None) -> ()

Registered when ``mla_verify`` is imported (no GPU work). The compiler sees
each op as one opaque node with a fake implementation for shapes; the
workspace the ops use for partials and translations is scratch, consumed
within the call in stream order.

``mla_verify.verify_mla_paged`` and ``mla_verify.paged_metadata`` dispatch
to the paged ops by themselves while compiling (a step's metadata passed
as its three tensors). For SGLang's convention, ``verify_mla_fwd`` below is the twin of
``mla_verify.verify_mla_fwd`` (same arguments, same bool): the gate runs on
metadata at trace time, and only an accepted call becomes the op, which
declares that it writes ``o_extend``; on False the caller falls back, as in
eager mode.
"""

# No `from __future__ import annotations`: custom_op reads the annotations
# as objects to infer the schemas.
import torch

from . import api, paged
from .problem import V_HEAD_DIM


def _paged(q, kv_cache, block_table, cache_seqlens, out, scales, metadata_tensors):
    # Both paged ops: paged_forward, given the step's metadata as its three
    # tensors (all or none).
    if all(t is None for t in metadata_tensors):
        metadata = None
    elif any(t is None for t in metadata_tensors):
        raise ValueError(
            "qo_indptr, kv_indptr, kv_indices: expected all three (a paged_metadata's "
            f"tensors) or none, got {sum(t is not None for t in metadata_tensors)} of them"
        )
    else:
        metadata = paged.metadata_of(kv_cache, block_table, q.shape[1], *metadata_tensors)
    sm_scale, k_scale, v_scale = scales
    return paged.paged_forward(
        q,
        kv_cache,
        block_table,
        cache_seqlens,
        sm_scale=sm_scale,
        k_scale=k_scale,
        v_scale=v_scale,
        out=out,
        metadata=metadata,
    )


@torch.library.custom_op("mla_verify::verify_mla_paged", mutates_args=())
def verify_mla_paged_op(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    qo_indptr: torch.Tensor | None = None,
    kv_indptr: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    scales = (sm_scale, k_scale, v_scale)
    tensors = (qo_indptr, kv_indptr, kv_indices)
    return _paged(q, kv_cache, block_table, cache_seqlens, None, scales, tensors)


@verify_mla_paged_op.register_fake
def _(q, kv_cache, block_table, cache_seqlens, *args, **kwargs):
    return q.new_empty(*q.shape[:3], V_HEAD_DIM)


@torch.library.custom_op("mla_verify::verify_mla_paged_out", mutates_args=("out",))
def verify_mla_paged_out_op(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    qo_indptr: torch.Tensor | None = None,
    kv_indptr: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
) -> None:
    scales = (sm_scale, k_scale, v_scale)
    tensors = (qo_indptr, kv_indptr, kv_indices)
    _paged(q, kv_cache, block_table, cache_seqlens, out, scales, tensors)


@verify_mla_paged_out_op.register_fake
def _(*args, **kwargs):  # writes out in place: nothing to return
    return None


@torch.library.custom_op(
    "mla_verify::paged_metadata_out", mutates_args=("qo_indptr", "kv_indptr", "kv_indices")
)
def paged_metadata_out_op(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    draft_len: int,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> None:
    paged.validate_metadata_args(kv_cache, block_table, cache_seqlens, draft_len)
    metadata = paged.metadata_of(kv_cache, block_table, draft_len, qo_indptr, kv_indptr, kv_indices)
    paged.check_metadata(metadata, kv_cache, block_table, draft_len)
    paged.write_metadata(metadata, kv_cache, block_table, cache_seqlens)


@paged_metadata_out_op.register_fake
def _(*args, **kwargs):  # writes the metadata's tensors in place
    return None


@torch.library.custom_op("mla_verify::verify_mla_fwd", mutates_args=("o_extend",))
def verify_mla_fwd_op(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    is_causal: bool,
    mask_indptr: torch.Tensor | None,
    max_len_extend: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sm_scale: float | None = None,
    skip_prefix_custom_mask: bool = True,
    max_bs: int | None = None,
) -> None:
    wrote = api.verify_mla_fwd(
        q_extend,
        k_extend,
        v_extend,
        o_extend,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        is_causal,
        mask_indptr,
        max_len_extend,
        k_scale=k_scale,
        v_scale=v_scale,
        sm_scale=sm_scale,
        skip_prefix_custom_mask=skip_prefix_custom_mask,
        max_bs=max_bs,
    )
    if not wrote:
        raise ValueError(
            "mla_verify::verify_mla_fwd: expected a call can_handle accepts, got one it "
            "refuses; gate with mla_verify.can_handle (or call mla_verify.ops.verify_mla_fwd)"
        )


@verify_mla_fwd_op.register_fake
def _(*args, **kwargs):  # writes o_extend in place: nothing to return
    return None


def verify_mla_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    is_causal: bool,
    mask_indptr: torch.Tensor | None,
    max_len_extend: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sm_scale: float | None = None,
    logit_cap: float = 0.0,
    skip_prefix_custom_mask: bool = True,
    sliding_window_size: int = -1,
    sinks: torch.Tensor | None = None,
    window_kv_offsets: torch.Tensor | None = None,
    xai_temperature_len: int = -1,
    max_bs: int | None = None,
) -> bool:
    """``mla_verify.verify_mla_fwd`` for compiled graphs: False, writing
    nothing, where ``can_handle`` refuses (decided from metadata, at trace
    time); else the op ``mla_verify::verify_mla_fwd`` writes ``o_extend``
    and this returns True. Works in eager mode too (through the
    dispatcher)."""
    if window_kv_offsets is not None:  # sliding-window offsets: refused, as the gate does
        return False
    if not api.can_handle(
        q_extend,
        k_extend,
        v_extend,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        is_causal,
        mask_indptr,
        max_len_extend,
        sliding_window_size,
        sinks,
        logit_cap,
        xai_temperature_len,
    ):
        return False
    verify_mla_fwd_op(
        q_extend,
        k_extend,
        v_extend,
        o_extend,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        is_causal,
        mask_indptr,
        max_len_extend,
        k_scale,
        v_scale,
        sm_scale,
        skip_prefix_custom_mask,
        max_bs,
    )
    return True
