"""Arch facts and device queries. A leaf module: everything else imports it.

Queries are cached per device index, so after the first call they cost no
driver call and are safe under graph capture.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection

import torch

# Multiprocessor / compute-unit counts of the archs we know, for sizing
# grids of a named arch without its GPU (the tuner's offline tables, the
# workspace of a named arch). Unknown archs get DEFAULT_SM_COUNT.
SM_COUNT: dict[str, int] = {
    "sm80": 108,
    "sm86": 84,
    "sm89": 128,
    "sm90": 132,
    "sm100": 148,
    "gfx942": 304,
    "gfx950": 256,
}
DEFAULT_SM_COUNT = 128
# Shared memory a block may use (opt-in maximum, bytes), from the CUDA
# programming guide's per-compute-capability table; LDS a workgroup may use
# on AMD. The Triton kernel's default tile is sized to fit it (config.py).
# An NVIDIA arch not listed gets the smallest of recent generations.
SHARED_MEMORY: dict[str, int] = {
    "sm80": 166912,
    "sm86": 101376,
    "sm87": 166912,
    "sm89": 101376,
    "sm90": 232448,
    "sm100": 232448,
    "sm120": 101376,
    "gfx942": 65536,
    "gfx950": 163840,
}
DEFAULT_NVIDIA_SHARED_MEMORY = 101376
# A bound for checking a given multiprocessor count (the largest GPU has 304).
MAX_SM_COUNT = 4096

# How the tables spell an arch: ``sm`` and the compute capability on NVIDIA
# (sm90, sm100), the gcnArchName on AMD (gfx942, gfx90a, gfx1100).
ARCH_PATTERN = re.compile(r"sm\d{2,3}|gfx[0-9a-f]{3,4}")
# The arch configs are picked for under Triton's CPU interpreter: no GPU to
# tune for, so always the built-in default.
INTERPRETER_ARCH = "cpu"


def check_arch(value: object, name: str = "arch", known: Collection[str] | None = None) -> str:
    """``value`` if it is an arch name as the tables spell it (one of
    ``known`` when given), else a ValueError naming the argument, the
    allowed values and the value."""
    if known is not None:
        ok = value in known
        allowed = f"one of {', '.join(sorted(known))}"
    else:
        ok = isinstance(value, str) and ARCH_PATTERN.fullmatch(value) is not None
        allowed = f"an arch name like 'sm90' or 'gfx950' (known: {', '.join(SM_COUNT)})"
    if not ok:
        raise ValueError(f"{name}: expected {allowed}, got {value!r}")
    return value


def is_amd_arch(arch: str) -> bool:
    return arch.startswith("gfx")


def arch_sm_count(arch: str | None) -> int:
    """Multiprocessors of a named arch, from the table."""
    return SM_COUNT.get(arch or "", DEFAULT_SM_COUNT)


def arch_shared_memory(arch: str) -> int:
    """Shared memory (LDS) a block of a named arch may use, in bytes."""
    if arch in SHARED_MEMORY:
        return SHARED_MEMORY[arch]
    if is_amd_arch(arch):
        return SHARED_MEMORY["gfx942"]  # 64 KB: every CDNA before gfx950
    return DEFAULT_NVIDIA_SHARED_MEMORY


def device_index(device: torch.device | int | str | None) -> int:
    """The CUDA/ROCm device index of ``device`` (None: the current one)."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: expected a CUDA/ROCm device, got {device}")
    return torch.cuda.current_device() if device.index is None else device.index


def current_arch(device: torch.device | int | str | None = None) -> str:
    """Arch name of a GPU as the tables spell it: ``sm90`` on NVIDIA, the
    ``gcnArchName`` before any ':' (``gfx942``) on ROCm."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            "mla_verify: no CUDA or ROCm GPU is visible, so the arch cannot be "
            "detected; name it where the function takes one (arch='sm90', 'gfx950', ...)"
        )
    return _arch_of(device_index(device))


@functools.cache
def _arch_of(index: int) -> str:
    if torch.version.hip:
        return torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA/ROCm device, from the device."""
    return _sm_count(device_index(device))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def is_cuda_sm90(device: torch.device) -> bool:
    """An NVIDIA Hopper device (the Gluon kernel's target)."""
    return (
        device.type == "cuda"
        and torch.version.cuda is not None
        and _capability(device_index(device)) == (9, 0)
    )


def has_dependent_launch(device: torch.device) -> bool:
    """CUDA sm90 and later: programmatic dependent launches."""
    return (
        device.type == "cuda"
        and torch.version.cuda is not None
        and _capability(device_index(device))[0] >= 9
    )


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)
