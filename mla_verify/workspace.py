"""Partial-result workspace of the kernel, one per device, sized ahead.

An engine calls ``prepare_workspace`` before graph capture with its largest
batch; then no call allocates. Casual callers need not: the workspace grows
on demand outside capture. Growth never frees a buffer a captured graph may
still write into.
"""

from __future__ import annotations

import logging

import torch

from . import kernel_sm90
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
from .plan import partial_slots, workspace_numel
from .problem import D_NOPE, check_range, check_shape, kv_dtype_name

logger = logging.getLogger(__name__)


class Workspace:
    """fp32 buffers for the per-split partial outputs and log-sum-exps."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.part_o = torch.empty(0, dtype=torch.float32, device=device)
        self.part_lse = torch.empty(0, dtype=torch.float32, device=device)
        self._used_in_capture = False
        self._kept_for_graphs: list[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        return (self.part_o.numel() + self.part_lse.numel()) * 4

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` (slot, head, draft) partial rows."""
        if rows <= self.part_lse.numel():
            return
        if capturing(self.device):
            raise RuntimeError(
                f"mla_verify: the workspace on {self.device} holds {self.part_lse.numel()} "
                f"partial rows but this call needs {rows}; call "
                "mla_verify.prepare_workspace(max_batch_size, num_heads, draft_len, ...) "
                "before graph capture"
            )
        if self._used_in_capture:
            # A captured graph may still write into the old buffers.
            self._kept_for_graphs += [self.part_o, self.part_lse]
        self.part_o = torch.empty(rows * D_NOPE, dtype=torch.float32, device=self.device)
        self.part_lse = torch.empty(rows, dtype=torch.float32, device=self.device)
        logger.debug("workspace on %s grown to %.1f MB", self.device, self.nbytes / 1e6)

    def views(
        self, slots: int, num_heads: int, draft_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n_o, n_lse = workspace_numel(slots, num_heads, draft_len)
        self.reserve(n_lse)
        if capturing(self.device):
            self._used_in_capture = True
        return self.part_o[:n_o], self.part_lse[:n_lse]


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
) -> int:
    """Workspace bytes the tuned configs need for any batch up to the max
    (``arch``: 'sm90', 'gfx950', ..., 'cpu' for Triton's CPU interpreter,
    None for this GPU's; ``sms``: the GPU's multiprocessors, by default the
    arch's count)."""
    num_heads, draft_len, max_batch_size = check_shape(
        num_heads, draft_len, max_batch_size, batch_name="max_batch_size"
    )
    kv_dtype_name(kv_dtype)  # names the choices before any lookup
    if arch is not None and arch != INTERPRETER_ARCH:
        check_arch(arch)
    if sms is None:
        sms = arch_sm_count(arch)
    sms = check_range("sms", sms, 1, MAX_SM_COUNT)
    slots = 0
    for bs in range(1, max_batch_size + 1):
        config = _launch_config(num_heads, draft_len, bs, kv_dtype, arch)
        # A Hopper config runs the Hopper kernel's shares where it can, and
        # the Triton kernel's units elsewhere: room for either.
        slots = max(slots, partial_slots(bs, config.NUM_KV_SPLITS, 0))
        if config.kernel in HOPPER_KERNELS:
            ctas = kernel_sm90.ctas_per_head_block(sms, num_heads, config.BLOCK_H)
            slots = max(slots, partial_slots(bs, config.NUM_KV_SPLITS, ctas))
    return workspace_numel(slots, num_heads, draft_len)[1] * (D_NOPE + 1) * 4


def _launch_config(num_heads, draft_len, batch_size, kv_dtype, arch) -> VerifyConfig:
    # What verify_mla_fwd launches: in the interpreter the built-in default
    # (no GPU to tune for, so no table and no warning), else the tables'.
    if arch == INTERPRETER_ARCH:
        return default_config(num_heads, draft_len, batch_size, INTERPRETER_ARCH)
    return block_config(num_heads, draft_len, batch_size, kv_dtype, arch)


def prepare_workspace(
    max_batch_size: int,
    num_heads: int,
    draft_len: int,
    kv_dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
) -> int:
    """Allocate, before graph capture, the workspace every batch size up to
    ``max_batch_size`` needs with the tuned configs; returns its bytes.
    ``device``: a CUDA/ROCm device (default: the current one), or 'cpu' for
    calls run in Triton's CPU interpreter."""
    check_shape(num_heads, draft_len, max_batch_size, batch_name="max_batch_size")
    kv_dtype_name(kv_dtype)
    device = _workspace_device(device)
    arch = current_arch(device) if device.type == "cuda" else INTERPRETER_ARCH
    sms = sm_count(device) if device.type == "cuda" else None
    nbytes = workspace_bytes(max_batch_size, num_heads, draft_len, kv_dtype, arch, sms)
    get_workspace(device).reserve(nbytes // ((D_NOPE + 1) * 4))
    return nbytes


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
