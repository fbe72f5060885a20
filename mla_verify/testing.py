"""Generated verify batches for tests, the tuner, the benchmark and the demo.

A batch is random non-zero data in a paged pool with scattered slots; the
slots no request uses are NaN, so a kernel that reads outside a request's
prefix shows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .api import verify_mla_fwd
from .config import VerifyConfig
from .reference import verify_mla_reference

Q_DIM = 576
V_DIM = 512

# bf16 tolerance: bf16 operands and output land near 3e-3 relative error
# (measured); a 1% bug in any term must fail.
MAX_RELATIVE_ERROR = 6e-3
ATOL = RTOL = 1e-2


@dataclass
class VerifyBatch:
    q: torch.Tensor  # [bs*L, H, 576]
    k_extend: torch.Tensor  # [bs*L, 1, 576]
    v_extend: torch.Tensor  # [bs*L, 1, 512]
    k_buffer: torch.Tensor  # [slots, 1, 576]
    v_buffer: torch.Tensor  # [slots, 1, 512]
    qo_indptr: torch.Tensor  # [bs+1] int32
    kv_indptr: torch.Tensor  # [bs+1] int32
    kv_indices: torch.Tensor  # [sum(prefix)] int32
    draft_len: int
    prefix_lens: list[int]
    sm_scale: float
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]

    def new_output(self) -> torch.Tensor:
        """An output poisoned with NaN, so unwritten elements show."""
        shape = (self.q.shape[0], self.num_heads, V_DIM)
        return torch.full(shape, float("nan"), dtype=self.q.dtype, device=self.q.device)

    def run(self, o: torch.Tensor, config: VerifyConfig | None = None) -> bool:
        return verify_mla_fwd(
            self.q,
            self.k_extend,
            self.v_extend,
            o,
            self.k_buffer,
            self.v_buffer,
            self.qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            None,
            True,
            None,
            self.draft_len,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            sm_scale=self.sm_scale,
            config=config,
        )

    def reference(self) -> torch.Tensor:
        return verify_mla_reference(
            self.q,
            self.k_extend,
            self.v_extend,
            self.k_buffer,
            self.v_buffer,
            self.qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            sm_scale=self.sm_scale,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
        )


def make_batch(
    num_heads: int,
    draft_len: int,
    prefix_lens: list[int],
    *,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    pool_slots: int | None = None,
    pool: torch.Tensor | None = None,
    separate_v: bool = False,
    v_extend_from_k: bool = False,
    strided_q: bool = False,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sm_scale: float | None = None,
    seed: int | None = None,
    kv_slots: torch.Tensor | None = None,
) -> VerifyBatch:
    """A random batch: request b has ``prefix_lens[b]`` prefix tokens at
    scattered slots of a pool of ``pool_slots`` (default: used + 64), or of
    the given ``pool`` [slots, 1, 576] (shared by many batches, left as is).
    ``separate_v``: a V pool of its own instead of the view of K's first 512
    columns. ``v_extend_from_k``: v_extend is the view k_extend[..., :512]
    (by default it is a tensor of its own, as SGLang passes it).
    ``kv_slots``: the prefix slots to use, request after request (default:
    distinct random slots), so callers can keep several batches' slots
    apart in one pool."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else torch.seed() % (2**31))
    kv_dtype = kv_dtype or dtype
    bs, used = len(prefix_lens), sum(prefix_lens)
    slots = max(pool_slots or used + 64, used)
    rows = bs * draft_len

    def randn(*shape: int) -> torch.Tensor:
        # Values in +-[0.25, 2.25]: random, and never zero.
        x = torch.rand(*shape, generator=gen, device=device) * 2 + 0.25
        sign = torch.randint(0, 2, shape, generator=gen, device=device) * 2 - 1
        return x * sign

    # The pool is filled on the device in chunks: real-size pools are GBs.
    if pool is not None:
        slots = pool.shape[0]
        if used > slots:
            raise ValueError(f"pool: expected at least {used} slots, got {slots}")
    if kv_slots is None:
        perm = torch.randperm(slots, generator=gen, device=device)[:used]
    elif kv_slots.numel() != used:
        raise ValueError(
            f"kv_slots: expected {used} slots (the prefix lengths' sum), got {kv_slots.numel()}"
        )
    else:
        perm = kv_slots.to(device=device, dtype=torch.int64)
    if pool is not None:
        k_buffer = pool
    else:
        k_buffer = _nan_pool(slots, Q_DIM, kv_dtype, device)
        for start in range(0, used, 1 << 16):
            idx = perm[start : start + (1 << 16)]
            k_buffer[idx] = randn(idx.numel(), 1, Q_DIM).to(kv_dtype)
    if separate_v:
        v_buffer = _nan_pool(slots, V_DIM, kv_dtype, device)
        v_buffer[perm] = randn(used, 1, V_DIM).to(kv_dtype)
    else:
        v_buffer = k_buffer[..., :V_DIM]

    if strided_q:
        # Heads and tokens out of order in memory: [H, T, 576] transposed.
        q = randn(num_heads, rows, Q_DIM).to(dtype).transpose(0, 1)
    else:
        q = randn(rows, num_heads, Q_DIM).to(dtype)
    lens = torch.tensor([0, *prefix_lens])
    k_extend = randn(rows, 1, Q_DIM).to(dtype)
    v_extend = k_extend[..., :V_DIM] if v_extend_from_k else randn(rows, 1, V_DIM).to(dtype)
    return VerifyBatch(
        q=q,
        k_extend=k_extend,
        v_extend=v_extend,
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        qo_indptr=(torch.arange(bs + 1) * draft_len).to(torch.int32).to(device),
        kv_indptr=lens.cumsum(0).to(torch.int32).to(device),
        kv_indices=perm.to(torch.int32),
        draft_len=draft_len,
        prefix_lens=list(prefix_lens),
        sm_scale=sm_scale if sm_scale is not None else 1.0 / math.sqrt(Q_DIM),
        k_scale=k_scale,
        v_scale=v_scale,
    )


def make_pool(
    slots: int, kv_dtype: torch.dtype, device: str | torch.device, seed: int = 0
) -> torch.Tensor:
    """A random [slots, 1, 576] pool, for many batches to share."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    pool = torch.empty(slots, 1, Q_DIM, dtype=kv_dtype, device=device)
    for start in range(0, slots, 1 << 18):
        chunk = pool[start : start + (1 << 18)]
        values = torch.rand(chunk.shape, generator=gen, device=device) * 4 - 2
        chunk.copy_(values.to(kv_dtype))
    return pool


def _nan_pool(slots: int, dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    pool = torch.empty(slots, 1, dim, dtype=dtype, device=device)
    if dtype.itemsize == 1:  # fill_ has no fp8 kernel on every backend
        pool.view(torch.uint8).fill_(0x80 if "fnuz" in str(dtype) else 0x7F)  # NaN
    else:
        pool.fill_(float("nan"))
    return pool


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||; NaN anywhere in ``out`` gives inf."""
    out = out.float()
    if not bool(torch.isfinite(out).all()):
        return math.inf
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def check_close(out: torch.Tensor, ref: torch.Tensor, *, what: str = "output") -> float:
    """Every element within bf16 tolerance (ATOL/RTOL) and the whole within
    MAX_RELATIVE_ERROR of the reference; returns the
    relative error. Raises AssertionError naming the worst element."""
    err = relative_error(out, ref)
    out = out.float()
    bad = ~torch.isclose(out, ref, atol=ATOL, rtol=RTOL)
    if err > MAX_RELATIVE_ERROR or bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0]) if bool(bad.any()) else None
        detail = f"; first mismatch at {where}: {out[where]} vs {ref[where]}" if where else ""
        raise AssertionError(f"{what}: relative error {err:.3g}{detail}")
    return err
