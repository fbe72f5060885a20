"""The gate and the drop-in entry point, in SGLang's calling convention.

``can_handle`` decides from shapes, dtypes and Python scalars alone (it works
on ``meta`` tensors and inside CUDA/HIP graph capture). ``verify_mla_fwd``
returns False where the gate refuses, writing nothing, so the caller falls
back to its baseline; otherwise it validates the arguments' consistency
(ValueError naming the argument), picks the tuned config and launches.

Values that would need a GPU sync to check are trusted: every slot in
``kv_indices[kv_indptr[0]:kv_indptr[-1]]`` must be a valid row of
``k_buffer``, ``kv_indptr`` must be non-decreasing, every draft count
``qo_indptr[b+1] - qo_indptr[b]`` must be in 1..max_len_extend with
``qo_indptr[-1]`` at most q_extend's rows (and each count max_len_extend
where q_extend holds batch x max_len_extend rows), and ``mask_indptr`` must
give request b ``E_b * (P_b + E_b)`` mask bytes within ``custom_mask``. Set
``MLA_VERIFY_DEBUG=1`` (or call ``set_debug(True)``) to have them checked on
every call outside graph capture.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from dataclasses import dataclass, field

import torch

from . import kernel, launcher, prepared
from .config import VerifyConfig, default_config
from .device import current_arch
from .lookup import block_config
from .plan import Plan, plan_call
from .problem import (
    HEAD_DIMS,
    INDEX_DTYPES,
    KV_DTYPES,
    MASK_DTYPES,
    MAX_BATCH_SIZE,
    MAX_DRAFT_LEN,
    MAX_HEADS,
    MAX_POOL_SLOTS,
    MIN_DRAFT_LEN,
    Q_DTYPES,
    check_range,
)
from .workspace import capturing, get_workspace, prepare_workspace

logger = logging.getLogger(__name__)

_debug = os.environ.get("MLA_VERIFY_DEBUG", "0") not in ("", "0")


def set_debug(enabled: bool) -> None:
    """Check index values (a GPU sync) on every call made outside capture."""
    global _debug
    _debug = enabled


def can_handle(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    is_causal: bool,
    mask_indptr: torch.Tensor | None,
    max_len_extend: int,
    sliding_window_size: int = -1,
    sinks: torch.Tensor | None = None,
    logit_cap: float = 0.0,
    xai_temperature_len: int = -1,
) -> bool:
    """True when this kernel computes the call exactly. Reads no tensor value.

    Accepts one KV head shared by every query head with head dims (q/k, v)
    among ``problem.HEAD_DIMS`` (absorbed MLA 576/512, 256/256, 128/128),
    V a view of K or a cache of its own, bf16/fp16 q, bf16/fp16/fp8 KV;
    causal drafts, or a bool/uint8 ``custom_mask`` (which then decides,
    whatever ``is_causal`` says); up to ``bs * max_len_extend`` query rows
    (fewer: ragged draft counts, read on the device). Refuses sinks, sliding
    windows, logit caps, xai temperature, non-causal calls without a mask,
    several KV heads, and everything else it cannot compute exactly."""
    return (
        _refusal(
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
            max_len_extend,
            sliding_window_size,
            sinks,
            logit_cap,
            xai_temperature_len,
        )
        is None
    )


def _refusal(
    q,
    k_extend,
    v_extend,
    k_buffer,
    v_buffer,
    qo_indptr,
    kv_indptr,
    kv_indices,
    custom_mask,
    is_causal,
    max_len_extend,
    sliding_window_size,
    sinks,
    logit_cap,
    xai_temperature_len,
    window_kv_offsets=None,
) -> str | None:
    """Why the gate refuses, or None. Shapes, dtypes and scalars only."""
    if sinks is not None:
        return "attention sinks"
    if sliding_window_size is not None and sliding_window_size >= 0:
        return "sliding window"
    if window_kv_offsets is not None:
        return "sliding-window offsets"
    if logit_cap:
        return "logit cap"
    if xai_temperature_len is not None and xai_temperature_len > 0:
        return "xai temperature"
    if custom_mask is None and not is_causal:
        return "non-causal without a custom mask"
    if custom_mask is not None:  # the mask decides; is_causal adds nothing
        if not isinstance(custom_mask, torch.Tensor):
            return "non-tensor custom_mask"
        if custom_mask.dtype not in MASK_DTYPES:
            return f"custom_mask dtype {custom_mask.dtype} (needs bool or uint8)"
    tensors = (q, k_extend, v_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "non-tensor input"
    if (device := _device_refusal(q)) is not None:
        return device
    if q.dim() != 3 or k_buffer.dim() != 3 or v_buffer.dim() != 3:
        return "rank (expected [tokens, heads, dim] tensors)"
    if k_extend.dim() != 3 or v_extend.dim() != 3:
        return "rank of k_extend / v_extend"
    head_dims = (q.shape[-1], v_buffer.shape[-1])
    if head_dims not in HEAD_DIMS:
        return f"head dims (q {head_dims[0]}, v {head_dims[1]}; supported: {HEAD_DIMS})"
    if k_buffer.shape[-1] != head_dims[0] or k_extend.shape[-1] != head_dims[0]:
        return "k head dim"
    if v_extend.shape[-1] != head_dims[1]:
        return "v_extend head dim"
    if k_buffer.shape[1] != 1 or v_buffer.shape[1] != 1 or k_extend.shape[1] != 1:
        return "more than one KV head"
    if v_extend.shape[1] != 1:
        return "more than one KV head (v_extend)"
    if k_buffer.shape[0] > MAX_POOL_SLOTS:
        return f"a pool of {k_buffer.shape[0]} slots (at most {MAX_POOL_SLOTS})"
    if q.dtype not in Q_DTYPES:
        return f"q dtype {q.dtype}"
    if k_extend.dtype != q.dtype or v_extend.dtype != q.dtype:
        return "k_extend / v_extend dtype differs from q"
    if k_buffer.dtype not in KV_DTYPES or v_buffer.dtype != k_buffer.dtype:
        return f"kv dtype {k_buffer.dtype} / {v_buffer.dtype}"
    if k_buffer.dtype in Q_DTYPES and k_buffer.dtype != q.dtype:
        return "16-bit kv dtype differs from q"
    if any(t.stride(-1) != 1 for t in (q, k_extend, v_extend, k_buffer, v_buffer)):
        return "last dimension not contiguous"
    bs = qo_indptr.shape[0] - 1 if qo_indptr.dim() == 1 else -1
    if bs < 1 or not isinstance(max_len_extend, int):
        return "empty batch"
    if bs > MAX_BATCH_SIZE:
        return f"batch of {bs} requests (at most {MAX_BATCH_SIZE})"
    if not MIN_DRAFT_LEN <= max_len_extend <= MAX_DRAFT_LEN:
        return f"draft length {max_len_extend} outside {MIN_DRAFT_LEN}..{MAX_DRAFT_LEN}"
    if q.shape[1] > MAX_HEADS:
        return f"{q.shape[1]} heads (at most {MAX_HEADS})"
    # Ragged draft counts are read on the device; only their bound is a shape.
    if q.shape[0] > bs * max_len_extend:
        return "more q_extend rows than batch * max_len_extend"
    return None


def _device_refusal(q: torch.Tensor) -> str | None:
    """Why the call cannot run on q's device, or None. CPU tensors run only
    in Triton's interpreter, chosen when the kernels were decorated (at
    import). Meta tensors pass: engines ask the gate under fake-tensor
    tracing, and ``verify_mla_fwd`` then names the device."""
    if q.device.type == "cpu" and not kernel.INTERPRETED:
        return "CPU tensors without Triton's interpreter (TRITON_INTERPRET=1 before the import)"
    if q.device.type not in ("cuda", "cpu", "meta"):
        return f"{q.device.type} tensors (CUDA/ROCm only)"
    return None


def _expect(ok: bool, name: str, expected: str, actual: object) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {actual}")


def _validate(q, k_extend, v_extend, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices):
    """Consistency between arguments the gate accepted (no value reads)."""
    tokens, heads = q.shape[0], q.shape[1]
    _expect(heads >= 1, "q_extend", "at least one head", tuple(q.shape))
    for name, t in (("k_extend", k_extend), ("v_extend", v_extend)):
        _expect(t.shape[0] == tokens, f"{name}.shape[0]", f"{tokens} (q_extend rows)", t.shape[0])
    _expect(
        v_buffer.shape[0] == k_buffer.shape[0],
        "v_buffer.shape[0]",
        f"{k_buffer.shape[0]} (k_buffer slots)",
        v_buffer.shape[0],
    )
    _expect(
        kv_indptr.dim() == 1 and kv_indptr.shape == qo_indptr.shape,
        "kv_indptr.shape",
        f"{tuple(qo_indptr.shape)} (like qo_indptr)",
        tuple(kv_indptr.shape),
    )
    _expect(kv_indices.dim() == 1, "kv_indices.dim()", "1", kv_indices.dim())
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        _expect(t.dtype in INDEX_DTYPES, f"{name}.dtype", "torch.int32 or torch.int64", t.dtype)
        _expect(t.stride(0) == 1 or t.numel() <= 1, f"{name}", "a contiguous tensor", t.stride())
    _expect(isinstance(o, torch.Tensor), "o_extend", "a tensor", type(o).__name__)
    expected_o = (tokens, heads, v_buffer.shape[-1])
    _expect(tuple(o.shape) == expected_o, "o_extend.shape", expected_o, tuple(o.shape))
    _expect(o.dtype == q.dtype, "o_extend.dtype", q.dtype, o.dtype)
    _expect(o.stride(-1) == 1, "o_extend.stride(-1)", "1", o.stride(-1))
    device = q.device
    for name, t in (
        ("k_extend", k_extend),
        ("v_extend", v_extend),
        ("o_extend", o),
        ("k_buffer", k_buffer),
        ("v_buffer", v_buffer),
        ("qo_indptr", qo_indptr),
        ("kv_indptr", kv_indptr),
        ("kv_indices", kv_indices),
    ):
        _expect(t.device == device, f"{name}.device", f"{device} (q_extend's)", t.device)


def _validate_mask(q, qo_indptr, custom_mask, mask_indptr, max_len_extend):
    """The custom mask's arguments, as far as shapes tell (no value reads):
    both or neither; mask_indptr [bs+1]; a flat mask no shorter than any
    batch of these shapes needs (bs x L x L bytes for a uniform one, where
    every request has L rows; one a request otherwise)."""
    if custom_mask is None and mask_indptr is None:
        return
    if mask_indptr is None:
        raise ValueError("mask_indptr: expected a [bs+1] tensor with custom_mask, got None")
    if custom_mask is None:
        raise ValueError("custom_mask: expected a flat tensor with mask_indptr, got None")
    bs = qo_indptr.shape[0] - 1
    _expect(isinstance(mask_indptr, torch.Tensor), "mask_indptr", "a tensor", type(mask_indptr))
    _expect(
        mask_indptr.dim() == 1 and mask_indptr.shape[0] == bs + 1,
        "mask_indptr.shape",
        f"({bs + 1},) (like qo_indptr)",
        tuple(mask_indptr.shape),
    )
    _expect(
        mask_indptr.dtype in INDEX_DTYPES,
        "mask_indptr.dtype",
        "torch.int32 or torch.int64",
        mask_indptr.dtype,
    )
    _expect(mask_indptr.stride(0) == 1, "mask_indptr", "a contiguous tensor", mask_indptr.stride())
    _expect(custom_mask.dim() == 1, "custom_mask.dim()", "1 (a flat mask)", custom_mask.dim())
    _expect(
        custom_mask.stride(0) == 1 or custom_mask.numel() <= 1,
        "custom_mask",
        "a contiguous tensor",
        custom_mask.stride(),
    )
    uniform = q.shape[0] == bs * max_len_extend
    least = bs * max_len_extend * max_len_extend if uniform else bs
    _expect(
        custom_mask.numel() >= least,
        "custom_mask.numel()",
        f"at least {least} ({bs} requests' rows x their drafts, mask_indptr {bs + 1} long)",
        custom_mask.numel(),
    )
    for name, t in (("custom_mask", custom_mask), ("mask_indptr", mask_indptr)):
        _expect(t.device == q.device, f"{name}.device", f"{q.device} (q_extend's)", t.device)


def _check_values(
    k_buffer, rows, qo_indptr, kv_indptr, kv_indices, draft_len, custom_mask, mask_indptr
):
    """Debug mode: the checks that need the values (synchronises)."""
    bs = qo_indptr.shape[0] - 1
    qo = qo_indptr.long()
    counts = qo[1:] - qo[:-1]
    if int(qo[0]) < 0 or bool((counts < 1).any()) or bool((counts > draft_len).any()):
        raise ValueError(
            f"qo_indptr: expected draft counts qo_indptr[b+1] - qo_indptr[b] in "
            f"1..{draft_len} from qo_indptr[0] >= 0, got {qo_indptr}"
        )
    _expect(int(qo[-1]) <= rows, "qo_indptr[-1]", f"<= {rows} (q_extend rows)", int(qo[-1]))
    if rows == bs * draft_len and not bool((counts == draft_len).all()):
        raise ValueError(
            f"qo_indptr: expected b * {draft_len} for b in 0..{bs} (q_extend holds batch x "
            f"max_len_extend rows, a uniform call), got {qo_indptr}"
        )
    if bool((kv_indptr[1:] < kv_indptr[:-1]).any()) or int(kv_indptr[0]) < 0:
        raise ValueError(f"kv_indptr: expected non-decreasing and >= 0, got {kv_indptr}")
    end = int(kv_indptr[-1])
    _expect(end <= kv_indices.numel(), "kv_indptr[-1]", f"<= {kv_indices.numel()}", end)
    used = kv_indices[int(kv_indptr[0]) : end]
    if used.numel():
        lo, hi = int(used.min()), int(used.max())
        slots = k_buffer.shape[0]
        _expect(lo >= 0 and hi < slots, "kv_indices", f"slots in [0, {slots})", f"[{lo}, {hi}]")
    if custom_mask is not None:
        kv = kv_indptr.long()
        need = counts * (kv[1:] - kv[:-1] + counts)
        spans = mask_indptr.long()[1:] - mask_indptr.long()[:-1]
        if int(mask_indptr[0]) < 0 or not torch.equal(spans, need):
            raise ValueError(
                "mask_indptr: expected >= 0 and spans of E_b * (P_b + E_b) bytes, "
                f"{need.tolist()}, got {mask_indptr}"
            )
        end = int(mask_indptr[-1])
        length = custom_mask.numel()
        _expect(end <= length, "mask_indptr[-1]", f"<= {length} (custom_mask's length)", end)


def _as_scale(value: float, name: str, *, positive: bool = False, nonzero: bool = False) -> float:
    _expect(
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        name,
        "a finite Python float (tensor scales would need a GPU sync)",
        repr(value),
    )
    # The Hopper kernel scales each row's score maximum, not every score
    # before the maximum: the same only for a positive score scale.
    _expect(not positive or value > 0, name, "a positive score scale", repr(value))
    # The kernels divide by a drafts' value scale (kernel_sm90.launch_prefix).
    _expect(not nonzero or value != 0, name, "a nonzero value scale", repr(value))
    return float(value)


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
    *,
    config: VerifyConfig | None = None,
    page_size: int = 1,
    v_extend_scale: float = 1.0,
) -> bool:
    """Target-verify attention with one shared KV head; a drop-in for
    SGLang's extend attention (and its verify launcher's newer signature).

    Computes, for every request b (its E_b draft rows ``qo_indptr[b] ..
    qo_indptr[b+1] - 1``, 1 <= E_b <= L = ``max_len_extend``), head h and
    draft i, attention of ``q_extend[qo_indptr[b] + i, h]`` over the
    request's prefix (rows ``k_buffer[kv_indices[kv_indptr[b]:kv_indptr[b+1]]]``,
    P_b of them, scores scaled by ``sm_scale * k_scale``, both positive,
    values by ``v_scale``) and over its own drafts (``k_extend`` /
    ``v_extend`` at the same rows, unscaled), and writes the result into
    ``o_extend`` [T, H, Dv]. Without a mask, row i sees the whole prefix and
    drafts 0..i. With ``custom_mask`` (flat, bool or uint8, SGLang's layout)
    and ``mask_indptr`` [bs+1], row i sees key j (the prefix keys first,
    then the drafts) where ``custom_mask[mask_indptr[b] + i * (P_b + E_b) +
    j]`` is set; ``is_causal`` then adds nothing. With
    ``skip_prefix_custom_mask=True`` (SGLang's default) the prefix is
    visible to every row and only the E_b x E_b draft bits are read; pass
    False to have the prefix bits honoured too. A row that sees no key at
    all gets 0.

    Head dims (q/k, v): absorbed MLA's (576, 512), where V is K's first 512
    latent columns and the other 64 are the rope part, or ordinary
    attention's (256, 256) and (128, 128). Shapes: q_extend [T, H, Dqk]
    (bf16/fp16, any head/token strides), T <= bs * L rows (T = bs * L: every
    request has L drafts), k_extend [T, 1, Dqk], v_extend [T, 1, Dv],
    k_buffer [slots, 1, Dqk] (bf16/fp16 like q, or fp8 e4m3), v_buffer
    [slots, 1, Dv] (a pool of its own, or the view ``k_buffer[..., :Dv]``,
    which is then read only once), indptrs [bs+1] and kv_indices
    int32/int64. ``sm_scale`` defaults to 1/sqrt(Dqk).

    ``max_bs``: the largest batch the caller will run (SGLang's verify
    launcher passes it). Outside graph capture the first call with a new
    value sizes the workspace for every batch up to it, as
    ``prepare_workspace`` does, so later calls (captured ones included)
    allocate nothing; during capture it is not acted on.

    ``v_extend_scale`` (nonzero) multiplies the drafts' values, in float32:
    1.0 is SGLang's convention; ``verify_mla_paged``, whose drafts live in
    the scaled cache, passes its ``v_scale``.

    Returns False, writing nothing, where ``can_handle`` refuses (sinks,
    sliding window, logit cap, non-causal without a mask, ...); the caller
    then runs its own kernel. Returns True after writing ``o_extend``.
    Raises ValueError for inconsistent arguments. ``config`` overrides the
    tuned table (for tuning and tests). ``page_size`` > 1 (what
    ``verify_mla_paged`` passes) promises that ``k_buffer`` is a paged cache
    of pages of that many tokens seen as a page-size-1 pool, that each
    request's prefix begins a page and that its ``kv_indices`` run through
    each page's slots in order: the Hopper kernel then loads whole tiles of
    a page by TMA (MLA; pages of a multiple of 64 tokens). Graph-capture
    safe once the workspace is prepared (see ``prepare_workspace``): draft counts, lengths, slots
    and mask bits may change between replays.
    """
    tensors = (q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr)
    tensors += (kv_indptr, kv_indices, custom_mask, mask_indptr)
    options = dict(
        is_causal=is_causal,
        max_len_extend=max_len_extend,
        k_scale=k_scale,
        v_scale=v_scale,
        sm_scale=sm_scale,
        logit_cap=logit_cap,
        skip_prefix_custom_mask=skip_prefix_custom_mask,
        sliding_window_size=sliding_window_size,
        sinks=sinks,
        window_kv_offsets=window_kv_offsets,
        xai_temperature_len=xai_temperature_len,
        max_bs=max_bs,
        config=config,
        page_size=page_size,
        v_extend_scale=v_extend_scale,
    )
    return run_prepared(kept_call(tensors, options), tensors)


# verify_mla_fwd's defaults past the tensors (fwd_options).
_FWD_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(verify_mla_fwd).parameters.items()
    if p.default is not inspect.Parameter.empty
}


def fwd_options(**given) -> dict:
    """``kept_call``'s ``options``: ``given``, and verify_mla_fwd's
    defaults for the rest (``is_causal`` and ``max_len_extend`` have none)."""
    return {**_FWD_DEFAULTS, **given}


def kept_call(tensors: tuple, options: dict) -> _Refused | _Prepared:
    """The host work of a ``verify_mla_fwd`` call (its ``tensors`` in
    ``_prepare``'s order, its other arguments ``options``): kept for its
    signature (``prepared``), or done now."""
    key = None
    if not _debug:  # the debug mode reads values on every call
        # The gate reads only whether sinks and window offsets are given;
        # plan.v_is_k_view reads whether V shares K's data.
        given = dict(
            options,
            sinks=options["sinks"] is None,
            window_kv_offsets=options["window_kv_offsets"] is None,
        )
        _, k_extend, v_extend, _, k_buffer, v_buffer = tensors[:6]
        key = prepared.signature(
            tensors, tuple(given.values()), same_data=((k_buffer, v_buffer), (k_extend, v_extend))
        )
    call = prepared.get(key)
    if call is None:
        call = _prepare(*tensors, **options)
        prepared.keep(key, call)
    return call


def run_prepared(call: _Refused | _Prepared, tensors: tuple) -> bool:
    """``verify_mla_fwd``'s launches, with its host work ``call`` done
    before (``kept_call``) for ``tensors`` (in ``_prepare``'s order) of
    these very shapes, strides, dtypes, devices and alignments: False
    where it refused."""
    if isinstance(call, _Refused):
        logger.debug("verify_mla_fwd refuses: %s", call.reason)
        return False
    q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer = tensors[:6]
    qo_indptr, kv_indptr, kv_indices, custom_mask, mask_indptr = tensors[6:]
    plan = call.plan
    device = q_extend.device
    if call.reserve is not None and not capturing(device):
        _reserve_for(*call.reserve)
    if _debug and not capturing(device):
        _check_values(
            k_buffer,
            q_extend.shape[0],
            qo_indptr,
            kv_indptr,
            kv_indices,
            plan.draft_len,
            custom_mask,
            mask_indptr,
        )
    part_o, part_lse = get_workspace(device).views(call.partial_rows, plan.head_dims[1])
    # The kernels this signature launched the first time (launcher.Recording).
    with launcher.replayed(call.launches):
        kernel.launch(
            plan,
            q_extend,
            k_extend,
            v_extend,
            o_extend,
            k_buffer,
            v_buffer,
            qo_indptr,
            kv_indptr,
            kv_indices,
            part_o,
            part_lse,
            sm_scale=call.sm_scale,
            k_scale=call.k_scale,
            v_scale=call.v_scale,
            v_extend_scale=call.v_extend_scale,
            # The kernels read mask bytes; a bool mask is the same bytes.
            custom_mask=None if custom_mask is None else custom_mask.view(torch.uint8),
            mask_indptr=mask_indptr,
        )
    return True


@dataclass(frozen=True)
class _Refused:
    reason: str


@dataclass(frozen=True)
class _Prepared:
    """A call's host work (``prepared``): its plan, the scales checked, and
    the workspace reservation ``max_bs`` asks for."""

    plan: Plan
    partial_rows: int  # plan.partial_rows, a property: computed once here
    sm_scale: float
    k_scale: float
    v_scale: float
    v_extend_scale: float
    reserve: tuple | None
    launches: launcher.Recording = field(default_factory=launcher.Recording, compare=False)


def _prepare(
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
    mask_indptr,
    *,
    is_causal,
    max_len_extend,
    k_scale,
    v_scale,
    sm_scale,
    logit_cap,
    skip_prefix_custom_mask,
    sliding_window_size,
    sinks,
    window_kv_offsets,
    xai_temperature_len,
    max_bs,
    config,
    page_size,
    v_extend_scale,
) -> _Refused | _Prepared:
    """``verify_mla_fwd``'s work before its launches, from metadata alone:
    the gate, the checks (raising ValueError), the config and the plan."""
    reason = _refusal(
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
        max_len_extend,
        sliding_window_size,
        sinks,
        logit_cap,
        xai_temperature_len,
        window_kv_offsets,
    )
    if reason is not None:
        return _Refused(reason)
    _validate(
        q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices
    )
    _expect(
        q_extend.device.type != "meta",
        "q_extend.device",
        "a CUDA/ROCm device, or cpu in Triton's interpreter (meta tensors hold no data)",
        q_extend.device,
    )
    _validate_mask(q_extend, qo_indptr, custom_mask, mask_indptr, max_len_extend)
    _expect(isinstance(page_size, int) and page_size >= 1, "page_size", "an int >= 1", page_size)
    k_scale = _as_scale(k_scale, "k_scale", positive=True)
    v_scale = _as_scale(v_scale, "v_scale")
    v_extend_scale = _as_scale(v_extend_scale, "v_extend_scale", nonzero=True)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q_extend.shape[-1])
    sm_scale = _as_scale(sm_scale, "sm_scale", positive=True)

    bs = qo_indptr.shape[0] - 1
    head_dims = (q_extend.shape[-1], v_buffer.shape[-1])
    device = q_extend.device
    reserve = None
    if max_bs is not None:
        max_bs = max(bs, check_range("max_bs", max_bs, 1, MAX_BATCH_SIZE))
        reserve = (max_bs, q_extend.shape[1], max_len_extend, k_buffer.dtype, device, head_dims)
    if config is None:
        config = _tuned_config(
            q_extend, q_extend.shape[1], max_len_extend, bs, k_buffer.dtype, head_dims
        )
    plan = plan_call(
        q_extend,
        k_extend,
        v_extend,
        k_buffer,
        v_buffer,
        batch_size=bs,
        draft_len=max_len_extend,
        config=config,
        masked=custom_mask is not None,
        skip_prefix_mask=bool(skip_prefix_custom_mask),
        page_size=page_size,
    )
    return _Prepared(plan, plan.partial_rows, sm_scale, k_scale, v_scale, v_extend_scale, reserve)


# (device, heads, draft length, kv dtype, head dims, max_bs) the workspace holds.
_reserved: set[tuple] = set()


def _reserve_for(max_bs, num_heads, draft_len, kv_dtype, device, head_dims) -> None:
    """The workspace for every batch up to ``max_bs``, sized once per shape."""
    key = (device, num_heads, draft_len, kv_dtype, head_dims, max_bs)
    if key not in _reserved:
        prepare_workspace(max_bs, num_heads, draft_len, kv_dtype, device, head_dims)
        _reserved.add(key)


def _tuned_config(q, num_heads, draft_len, batch_size, kv_dtype, head_dims) -> VerifyConfig:
    if q.device.type != "cuda":  # Triton's CPU interpreter: no GPU to tune for
        return default_config(num_heads, draft_len, batch_size, "cpu", head_dims=head_dims)
    arch = current_arch(q.device)
    return block_config(num_heads, draft_len, batch_size, kv_dtype, arch, head_dims=head_dims)
