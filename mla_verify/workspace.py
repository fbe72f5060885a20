"""Partial-result workspace of the kernel, one per device, sized ahead.

An engine calls ``prepare_workspace`` before graph capture with its largest
batch; then no call allocates. Casual callers need not: the workspace grows
on demand outside capture. Growth never frees a buffer a captured graph may
still write into.
"""

from __future__ import annotations

import logging

import torch

from . import hopper
from .config import HOPPER_KERNELS
from .device import arch_sm_count, current_arch, sm_count
from .lookup import block_config
from .plan import partial_slots, workspace_numel
from .problem import D_NOPE, check_shape

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
    (``sms``: the GPU's multiprocessors, by default the arch's count)."""
    num_heads, draft_len, max_batch_size = check_shape(num_heads, draft_len, max_batch_size)
    if sms is None:
        sms = arch_sm_count(arch)
    slots = 0
    for bs in range(1, max_batch_size + 1):
        config = block_config(num_heads, draft_len, bs, kv_dtype, arch)
        # A Hopper config runs the Hopper kernel's shares where it can, and
        # the Triton kernel's units elsewhere: room for either.
        slots = max(slots, partial_slots(bs, config.NUM_KV_SPLITS, 0))
        if config.kernel in HOPPER_KERNELS:
            ctas = hopper.ctas_per_head_block(sms, num_heads, config.BLOCK_H)
            slots = max(slots, partial_slots(bs, config.NUM_KV_SPLITS, ctas))
    return workspace_numel(slots, num_heads, draft_len)[1] * (D_NOPE + 1) * 4


def prepare_workspace(
    max_batch_size: int,
    num_heads: int,
    draft_len: int,
    kv_dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
) -> int:
    """Allocate, before graph capture, the workspace every batch size up to
    ``max_batch_size`` needs with the tuned configs; returns its bytes."""
    device = torch.device(device) if device is not None else torch.device("cuda")
    arch = current_arch(device) if device.type == "cuda" else "cpu"
    sms = sm_count(device) if device.type == "cuda" else None
    nbytes = workspace_bytes(max_batch_size, num_heads, draft_len, kv_dtype, arch, sms)
    get_workspace(device).reserve(nbytes // ((D_NOPE + 1) * 4))
    return nbytes


def capturing(device: torch.device) -> bool:
    """True while the current stream records a CUDA/HIP graph (no sync)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
