"""Partial-result workspace of the kernel, one per device, sized ahead.

An engine calls ``prepare_workspace`` before graph capture with its largest
batch (``prepare_paged_workspace`` for paged calls: it also sizes the
buffers ``verify_mla_paged`` translates its block table into); then no call
allocates. Casual callers need not: the workspace grows on demand outside
capture. Growth never frees a buffer a captured graph may still write into.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from . import hopper
from .config import HOPPER_KERNELS, VerifyConfig, default_config
from .device import (
    INTERPRETER_ARCH,
    MAX_SM_COUNT,
    arch_sm_count,
    check_arch,
    current_arch,
    sm_count,
)
from .lookup import block_config
from .plan import fit_grid, partial_rows, workspace_numel
from .problem import (
    MLA_HEAD_DIMS,
    QK_HEAD_DIM,
    V_HEAD_DIM,
    check_head_dims,
    check_range,
    check_shape,
    kv_dtype_name,
)

logger = logging.getLogger(__name__)

MAX_KEPT_VIEWS = 256  # call shapes whose views a workspace keeps; then it starts again


class Workspace:
    """fp32 buffers for the per-split partial outputs and log-sum-exps, and
    the paged calls' translation buffers (``paged_views``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.part_o = torch.empty(0, dtype=torch.float32, device=device)
        self.part_lse = torch.empty(0, dtype=torch.float32, device=device)
        self.paged_index = torch.empty(0, dtype=torch.int32, device=device)
        self.paged_drafts = torch.empty(0, dtype=torch.uint8, device=device)
        self._used_in_capture = False
        self._kept_for_graphs: list[torch.Tensor] = []
        # The views each call shape took, kept while the buffers last:
        # slicing them again cost a paged call 10-20 us of host time.
        self._views: dict[tuple, object] = {}

    @property
    def nbytes(self) -> int:
        partials = (self.part_o.numel() + self.part_lse.numel()) * 4
        return partials + self.paged_index.numel() * 4 + self.paged_drafts.numel()

    def reserve(self, rows: int, v_dim: int = V_HEAD_DIM) -> None:
        """Make room for ``rows`` (slot, head, draft) partial rows of
        ``v_dim`` values."""
        if rows <= self.part_lse.numel() and rows * v_dim <= self.part_o.numel():
            return
        self._before_growth(
            f"holds {self.part_lse.numel()} partial rows but this call needs {rows} of "
            f"{v_dim} values; call mla_verify.prepare_workspace(max_batch_size, num_heads, "
            "draft_len, ...) before graph capture",
            [self.part_o, self.part_lse],
        )
        rows = max(rows, self.part_lse.numel())
        n_o = max(rows * v_dim, self.part_o.numel())
        self._forget_views("partials")
        self.part_o = torch.empty(n_o, dtype=torch.float32, device=self.device)
        self.part_lse = torch.empty(rows, dtype=torch.float32, device=self.device)
        logger.debug("workspace on %s grown to %.1f MB", self.device, self.nbytes / 1e6)

    def views(self, rows: int, v_dim: int = V_HEAD_DIM) -> tuple[torch.Tensor, torch.Tensor]:
        """part_o and part_lse for ``rows`` partial rows of ``v_dim`` values."""
        if capturing(self.device):
            self._used_in_capture = True
        key = ("partials", rows, v_dim)
        views = self._views.get(key)
        if views is None:
            n_o, n_lse = workspace_numel(rows, v_dim)
            self.reserve(n_lse, v_dim)  # may clear the kept views: kept after
            views = self._keep_views(key, (self.part_o[:n_o], self.part_lse[:n_lse]))
        return views

    def _forget_views(self, kind: str) -> None:
        # The buffers of ``kind`` are replaced: their views go with them.
        self._views = {key: views for key, views in self._views.items() if key[0] != kind}

    def _keep_views(self, key: tuple, views):
        if len(self._views) >= MAX_KEPT_VIEWS:
            self._views.clear()
        self._views[key] = views
        return views

    def reserve_paged(self, index_numel: int, draft_bytes: int) -> None:
        """Make room for a paged call's translation (``paged_numel``)."""
        if index_numel <= self.paged_index.numel() and draft_bytes <= self.paged_drafts.numel():
            return
        self._before_growth(
            f"paged buffers hold {self.paged_index.numel()} indices and "
            f"{self.paged_drafts.numel()} draft bytes but this call needs {index_numel} and "
            f"{draft_bytes}; call mla_verify.prepare_paged_workspace(max_batch_size, num_heads, "
            "draft_len, max_blocks, page_size, ...) before graph capture",
            [self.paged_index, self.paged_drafts],
        )
        index_numel = max(index_numel, self.paged_index.numel())
        draft_bytes = max(draft_bytes, self.paged_drafts.numel())
        self._forget_views("paged")
        self.paged_index = torch.empty(index_numel, dtype=torch.int32, device=self.device)
        self.paged_drafts = torch.empty(draft_bytes, dtype=torch.uint8, device=self.device)
        logger.debug("workspace on %s grown to %.1f MB", self.device, self.nbytes / 1e6)

    def _before_growth(self, shortfall: str, old: list[torch.Tensor]) -> None:
        # Growing allocates: refused during capture. Outside it, a captured
        # graph may still write into the old buffers, so they are kept.
        if capturing(self.device):
            raise RuntimeError(f"mla_verify: the workspace on {self.device} {shortfall}")
        if self._used_in_capture:
            self._kept_for_graphs += old

    def paged_views(
        self,
        batch_size: int,
        draft_len: int,
        max_tokens: int,
        dtype: torch.dtype,
    ) -> PagedViews:
        """The token-indexed form of one paged call, carved from the paged
        buffers: kv_indices first, then the two indptrs (each 16-byte
        aligned, so the kernels' pointer specialisation never changes); the
        drafts' K rows in ``dtype``, V their view."""
        if capturing(self.device):
            self._used_in_capture = True
        key = ("paged", batch_size, draft_len, max_tokens, dtype)
        views = self._views.get(key)
        if views is not None:
            return views
        index_numel, draft_bytes = paged_numel(batch_size, draft_len, max_tokens)
        self.reserve_paged(index_numel, draft_bytes)  # may clear the kept views: kept after
        qo_start = _round_up(batch_size * max_tokens, 4)
        kv_start = qo_start + _round_up(batch_size + 1, 4)
        rows = batch_size * draft_len
        k_bytes = rows * QK_HEAD_DIM * dtype.itemsize
        k_extend = self.paged_drafts[:k_bytes].view(dtype).view(rows, 1, QK_HEAD_DIM)
        views = PagedViews(
            kv_indices=self.paged_index[: batch_size * max_tokens],
            qo_indptr=self.paged_index[qo_start : qo_start + batch_size + 1],
            kv_indptr=self.paged_index[kv_start : kv_start + batch_size + 1],
            k_extend=k_extend,
            v_extend=k_extend[..., :V_HEAD_DIM],
        )
        return self._keep_views(key, views)


@dataclass(frozen=True)
class PagedViews:
    """A paged call in the token-indexed form ``verify_mla_fwd`` takes."""

    kv_indices: torch.Tensor  # [bs * max_tokens] int32, the first kv_indptr[-1] used
    qo_indptr: torch.Tensor  # [bs+1] int32
    kv_indptr: torch.Tensor  # [bs+1] int32
    k_extend: torch.Tensor  # [bs*L, 1, 576] in q's dtype
    v_extend: torch.Tensor  # [bs*L, 1, 512]: k_extend's view, or rows of their own


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def paged_numel(batch_size: int, draft_len: int, max_tokens: int) -> tuple[int, int]:
    """(int32 indices, draft bytes) of a paged call's translation:
    ``max_tokens`` = block-table columns x page size bounds each sequence,
    so kv_indices takes batch x max_tokens; the drafts' rows are 16-bit."""
    index_numel = _round_up(batch_size * max_tokens, 4) + 2 * _round_up(batch_size + 1, 4)
    draft_bytes = batch_size * draft_len * QK_HEAD_DIM * 2
    return index_numel, draft_bytes


_workspaces: dict[torch.device, Workspace] = {}


def get_workspace(device: torch.device) -> Workspace:
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    ws = _workspaces.get(device)
    if ws is None:
        ws = _workspaces[device] = Workspace(device)
    return ws


def workspace_bytes(
    max_batch_size: int,
    num_heads: int,
    draft_len: int,
    kv_dtype: torch.dtype = torch.bfloat16,
    arch: str | None = None,
    sms: int | None = None,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> int:
    """Workspace bytes the tuned configs need for any batch up to the max
    (``arch``: 'sm90', 'gfx950', ..., 'cpu' for Triton's CPU interpreter,
    None for this GPU's; ``sms``: the GPU's multiprocessors, by default the
    arch's count; ``head_dims``: (q/k, v), MLA's by default). Ragged and
    masked calls need no more than uniform ones."""
    num_heads, draft_len, max_batch_size = check_shape(
        num_heads, draft_len, max_batch_size, batch_name="max_batch_size"
    )
    head_dims = check_head_dims(head_dims)
    kv_dtype_name(kv_dtype)  # names the choices before any lookup
    if arch is not None and arch != INTERPRETER_ARCH:
        check_arch(arch)
    if sms is None:
        sms = arch_sm_count(arch)
    sms = check_range("sms", sms, 1, MAX_SM_COUNT)
    rows = 0
    for bs in range(1, max_batch_size + 1):
        config = _launch_config(num_heads, draft_len, bs, kv_dtype, arch, head_dims)
        # A Hopper config runs the Hopper kernel's shares where it can, and
        # the Triton kernel's units elsewhere (as many as its launch makes:
        # fit_grid): room for either.
        splits = fit_grid(config, bs, triton_kernel=True).NUM_KV_SPLITS
        shapes = (bs, num_heads, draft_len, splits)
        rows = max(rows, partial_rows(*shapes, 0, config.BLOCK_H))
        if config.kernel in HOPPER_KERNELS:
            ctas = hopper.ctas_per_head_block(sms, num_heads, config.BLOCK_H)
            rows = max(rows, partial_rows(*shapes, ctas, config.BLOCK_H))
    return workspace_numel(rows)[1] * (head_dims[1] + 1) * 4


def _launch_config(num_heads, draft_len, batch_size, kv_dtype, arch, head_dims) -> VerifyConfig:
    # What verify_mla_fwd launches: in the interpreter the built-in default
    # (no GPU to tune for, so no table and no warning), else the tables'.
    if arch == INTERPRETER_ARCH:
        return default_config(
            num_heads, draft_len, batch_size, INTERPRETER_ARCH, head_dims=head_dims
        )
    return block_config(num_heads, draft_len, batch_size, kv_dtype, arch, head_dims=head_dims)


def prepare_workspace(
    max_batch_size: int,
    num_heads: int,
    draft_len: int,
    kv_dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> int:
    """Allocate, before graph capture, the workspace every batch size up to
    ``max_batch_size`` needs with the tuned configs; returns its bytes.
    ``device``: a CUDA/ROCm device (default: the current one), or 'cpu' for
    calls run in Triton's CPU interpreter. ``head_dims``: the model's (q/k,
    v), absorbed MLA's by default."""
    check_shape(num_heads, draft_len, max_batch_size, batch_name="max_batch_size")
    kv_dtype_name(kv_dtype)
    device = _workspace_device(device)
    arch = current_arch(device) if device.type == "cuda" else INTERPRETER_ARCH
    sms = sm_count(device) if device.type == "cuda" else None
    head_dims = check_head_dims(head_dims)
    nbytes = workspace_bytes(
        max_batch_size, num_heads, draft_len, kv_dtype, arch, sms, head_dims=head_dims
    )
    get_workspace(device).reserve(nbytes // ((head_dims[1] + 1) * 4), head_dims[1])
    return nbytes


def prepare_paged_workspace(
    max_batch_size: int,
    num_heads: int,
    draft_len: int,
    max_blocks: int,
    page_size: int,
    kv_dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
) -> int:
    """``prepare_workspace`` for ``verify_mla_paged``: also sizes the
    translation buffers for a block table of up to ``max_blocks`` columns of
    ``page_size``-token pages; returns the workspace's bytes. Call it before
    graph capture with the largest batch and block table the graphs use."""
    max_blocks = check_range("max_blocks", max_blocks, 1, 2**31 - 1)
    page_size = check_range("page_size", page_size, 1, 2**31 - 1)
    nbytes = prepare_workspace(max_batch_size, num_heads, draft_len, kv_dtype, device)
    device = torch.device(device) if device is not None else torch.device("cuda")
    if device.type == "cuda" and hopper.tiles_in_pages(page_size):
        # The seesaw kernel's partials (paged.seesaw_serves), where its
        # head blocks differ from the tuned configs'.
        rows = seesaw_partial_rows(num_heads, draft_len, sm_count(device))
        get_workspace(device).reserve(rows, V_HEAD_DIM)
        nbytes = max(nbytes, rows * (V_HEAD_DIM + 1) * 4)
    index_numel, draft_bytes = paged_numel(max_batch_size, draft_len, max_blocks * page_size)
    get_workspace(device).reserve_paged(index_numel, draft_bytes)
    return nbytes + index_numel * 4 + draft_bytes


def seesaw_grid(num_heads: int, draft_len: int, sms: int) -> tuple[int, int]:
    """The paged seesaw kernel's launch (kernel_seesaw.py), whatever the
    batch: heads a head block (``hopper.block_heads``), and CTAs a head
    block, one wave of them."""
    block_h = hopper.block_heads(num_heads, draft_len)
    return block_h, hopper.ctas_per_head_block(sms, num_heads, block_h)


def seesaw_partial_rows(num_heads: int, draft_len: int, sms: int) -> int:
    """Partial rows of that launch: the Hopper kernel's two slots a CTA."""
    block_h, ctas = seesaw_grid(num_heads, draft_len, sms)
    return hopper.partial_rows(ctas, num_heads, draft_len, block_h)


def _workspace_device(device: torch.device | str | None) -> torch.device:
    allowed = "a CUDA/ROCm device, or 'cpu' for Triton's CPU interpreter"
    try:
        parsed = torch.device("cuda" if device is None else device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected {allowed}, got {device!r}") from None
    if parsed.type not in ("cuda", "cpu"):
        raise ValueError(f"device: expected {allowed}, got {parsed}")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        given = "the default, cuda" if device is None else repr(device)
        raise ValueError(
            f"device: expected {allowed} (no CUDA or ROCm GPU is visible here), got {given}"
        )
    return parsed


def capturing(device: torch.device) -> bool:
    """True while the current stream records a CUDA/HIP graph (no sync)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
