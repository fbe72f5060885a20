"""Generated verify batches for tests, the tuner, the benchmark and the demo.

A batch is random non-zero data in a paged pool with scattered slots; the
slots no request uses are NaN, so a kernel that reads outside a request's
prefix shows it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
    q: torch.Tensor  # [T, H, Dqk], T = sum of the draft counts
    k_extend: torch.Tensor  # [T, 1, Dqk]
    v_extend: torch.Tensor  # [T, 1, Dv]
    k_buffer: torch.Tensor  # [slots, 1, Dqk]
    v_buffer: torch.Tensor  # [slots, 1, Dv]
    qo_indptr: torch.Tensor  # [bs+1] int32
    kv_indptr: torch.Tensor  # [bs+1] int32
    kv_indices: torch.Tensor  # [sum(prefix)] int32
    draft_len: int  # max_len_extend
    prefix_lens: list[int]
    sm_scale: float
    k_scale: float = 1.0
    v_scale: float = 1.0
    v_extend_scale: float = 1.0  # the drafts' values' (verify_mla_fwd)
    custom_mask: torch.Tensor | None = None  # flat, SGLang's layout
    mask_indptr: torch.Tensor | None = None  # [bs+1] int32
    skip_prefix_custom_mask: bool = True
    draft_counts: list[int] | None = None  # per request; None: draft_len each

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]

    def new_output(self) -> torch.Tensor:
        """An output poisoned with NaN, so unwritten elements show."""
        shape = (self.q.shape[0], self.num_heads, self.v_buffer.shape[-1])
        return torch.full(shape, float("nan"), dtype=self.q.dtype, device=self.q.device)

    def run(
        self,
        o: torch.Tensor,
        config: VerifyConfig | None = None,
        *,
        fwd: Callable[..., bool] = verify_mla_fwd,
    ) -> bool:
        """``fwd`` on this batch, writing ``o``, as SGLang calls it. ``fwd``:
        another revision's ``verify_mla_fwd`` where the benchmark times one
        beside this package (``scripts/bench_revisions.py``, ``rev:`` contenders),
        which may not know ``v_extend_scale``: passed only where not 1."""
        drafts = {} if self.v_extend_scale == 1.0 else {"v_extend_scale": self.v_extend_scale}
        return fwd(
            *self.sglang_args(o),
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            sm_scale=self.sm_scale,
            skip_prefix_custom_mask=self.skip_prefix_custom_mask,
            config=config,
            **drafts,
        )

    def sglang_args(self, o: torch.Tensor) -> tuple:
        """``verify_mla_fwd``'s positional arguments as SGLang passes them
        for this batch, writing ``o`` (is_causal True)."""
        return (
            self.q,
            self.k_extend,
            self.v_extend,
            o,
            self.k_buffer,
            self.v_buffer,
            self.qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            self.custom_mask,
            True,
            self.mask_indptr,
            self.draft_len,
        )

    def reference(self) -> torch.Tensor:
        return verify_mla_reference(
            self.q,
            self.k_extend,
            self.v_extend.float() * self.v_extend_scale,
            self.k_buffer,
            self.v_buffer,
            self.qo_indptr,
            self.kv_indptr,
            self.kv_indices,
            sm_scale=self.sm_scale,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            custom_mask=self.custom_mask,
            mask_indptr=self.mask_indptr,
            skip_prefix_custom_mask=self.skip_prefix_custom_mask,
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
    v_extend_scale: float = 1.0,
    sm_scale: float | None = None,
    seed: int | None = None,
    kv_slots: torch.Tensor | None = None,
    head_dims: tuple[int, int] = (Q_DIM, V_DIM),
    draft_counts: list[int] | None = None,
    mask: str | None = None,
    hide_prefix: float = 0.0,
    skip_prefix_custom_mask: bool = True,
    mask_dtype: torch.dtype = torch.bool,
) -> VerifyBatch:
    """A random batch: request b has ``prefix_lens[b]`` prefix tokens at
    scattered slots of a pool of ``pool_slots`` (default: used + 64), or of
    the given ``pool`` [slots, 1, width] (shared by many batches, left as
    is; K is its first Dqk columns). ``head_dims``: (q/k, v), MLA's by
    default. ``separate_v``: a V pool of its own instead of the view of K's
    first Dv columns (from a given pool: its columns Dqk .. Dqk + Dv, where
    it is that wide). ``v_extend_from_k``: v_extend is the view
    k_extend[..., :Dv] (by default it is a tensor of its own, as SGLang
    passes it). ``kv_slots``: the prefix slots to use, request after
    request (default: distinct random slots), so callers can keep several
    batches' slots apart in one pool.

    ``draft_counts``: request b's drafts (ragged; default ``draft_len``
    each, which stays max_len_extend). ``mask``: a custom mask in SGLang's
    layout, ``"causal"`` (drafts causal) or ``"tree"`` (a random tree per
    request: row i sees its ancestors and itself), every prefix bit set but
    a ``hide_prefix`` share of them, drawn at random;
    ``skip_prefix_custom_mask`` is passed with it."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    seed = seed if seed is not None else torch.seed() % (2**31)
    gen.manual_seed(seed)
    kv_dtype = kv_dtype or dtype
    qk_dim, v_dim = head_dims
    bs, used = len(prefix_lens), sum(prefix_lens)
    slots = max(pool_slots or used + 64, used)
    counts = list(draft_counts) if draft_counts is not None else [draft_len] * bs
    if len(counts) != bs or not all(1 <= e <= draft_len for e in counts):
        raise ValueError(f"draft_counts: expected {bs} counts in 1..{draft_len}, got {counts}")
    rows = sum(counts)

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
        k_buffer = pool[..., :qk_dim]
    else:
        k_buffer = _nan_pool(slots, qk_dim, kv_dtype, device)
        for start in range(0, used, 1 << 16):
            idx = perm[start : start + (1 << 16)]
            k_buffer[idx] = randn(idx.numel(), 1, qk_dim).to(kv_dtype)
    if separate_v and pool is not None and pool.shape[-1] >= qk_dim + v_dim:
        v_buffer = pool[..., qk_dim : qk_dim + v_dim]
    elif separate_v:
        v_buffer = _nan_pool(slots, v_dim, kv_dtype, device)
        v_buffer[perm] = randn(used, 1, v_dim).to(kv_dtype)
    else:
        v_buffer = k_buffer[..., :v_dim]

    if strided_q:
        # Heads and tokens out of order in memory: [H, T, Dqk] transposed.
        q = randn(num_heads, rows, qk_dim).to(dtype).transpose(0, 1)
    else:
        q = randn(rows, num_heads, qk_dim).to(dtype)
    lens = torch.tensor([0, *prefix_lens])
    k_extend = randn(rows, 1, qk_dim).to(dtype)
    v_extend = k_extend[..., :v_dim] if v_extend_from_k else randn(rows, 1, v_dim).to(dtype)
    custom_mask = mask_indptr = None
    if mask is not None:
        custom_mask, mask_indptr = _random_mask(mask, counts, prefix_lens, hide_prefix, seed)
        custom_mask = custom_mask.to(mask_dtype).to(device)
        mask_indptr = mask_indptr.to(device)
    return VerifyBatch(
        q=q,
        k_extend=k_extend,
        v_extend=v_extend,
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        qo_indptr=torch.tensor([0, *counts]).cumsum(0).to(torch.int32).to(device),
        kv_indptr=lens.cumsum(0).to(torch.int32).to(device),
        kv_indices=perm.to(torch.int32),
        draft_len=draft_len,
        prefix_lens=list(prefix_lens),
        sm_scale=sm_scale if sm_scale is not None else 1.0 / math.sqrt(qk_dim),
        k_scale=k_scale,
        v_scale=v_scale,
        v_extend_scale=v_extend_scale,
        custom_mask=custom_mask,
        mask_indptr=mask_indptr,
        skip_prefix_custom_mask=skip_prefix_custom_mask,
        draft_counts=counts,
    )


def _random_mask(
    kind: str, counts: list[int], prefix_lens: list[int], hide_prefix: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat bool mask, int32 mask_indptr) in SGLang's layout: request b's
    E_b rows of P_b prefix bits, then E_b draft bits."""
    if kind not in ("causal", "tree"):
        raise ValueError(f"mask: expected 'causal' or 'tree', got {kind!r}")
    gen = torch.Generator().manual_seed(seed + 1)
    grids = []
    for e, p in zip(counts, prefix_lens):
        drafts = torch.ones(e, e, dtype=torch.bool).tril()
        if kind == "tree":
            # Draft i's parent comes before it (or it is a root): row i sees
            # its ancestors and itself.
            drafts = torch.eye(e, dtype=torch.bool)
            for i in range(1, e):
                parent = int(torch.randint(-1, i, (1,), generator=gen))
                if parent >= 0:
                    drafts[i] |= drafts[parent]
        prefix = torch.rand(e, p, generator=gen) >= hide_prefix
        grids.append(torch.cat([prefix, drafts], dim=1).flatten())
    sizes = torch.tensor([0] + [g.numel() for g in grids])
    return torch.cat(grids), sizes.cumsum(0).to(torch.int32)


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


# --- paged batches (FlashMLA's convention) ------------------------------------


@dataclass
class PagedBatch:
    """A paged verify call: sequence b holds ``prefix_lens[b]`` tokens and
    then its L drafts in pages listed by ``block_table[b]``; every cache row
    no sequence uses (unlisted blocks, the tail of each last page) is NaN,
    and so is one spare block the unused block-table columns point to."""

    q: torch.Tensor  # [bs, L, H, 576]
    kv_cache: torch.Tensor  # [num_blocks, page, 1, 576]
    block_table: torch.Tensor  # [bs, max_blocks] int32
    cache_seqlens: torch.Tensor  # [bs] int32, drafts included
    draft_len: int
    prefix_lens: list[int]
    sm_scale: float
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def page_size(self) -> int:
        return self.kv_cache.shape[1]

    @property
    def num_heads(self) -> int:
        return self.q.shape[2]

    def new_output(self) -> torch.Tensor:
        """An output poisoned with NaN, so unwritten elements show."""
        shape = (*self.q.shape[:3], V_DIM)
        return torch.full(shape, float("nan"), dtype=self.q.dtype, device=self.q.device)

    def run(self, out: torch.Tensor | None = None, metadata=None) -> torch.Tensor:
        from .paged import verify_mla_paged

        return verify_mla_paged(
            self.q,
            self.kv_cache,
            self.block_table,
            self.cache_seqlens,
            sm_scale=self.sm_scale,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            out=out,
            metadata=metadata,
        )

    def metadata(self, out=None, num_heads: int | None = None):
        """``paged_metadata`` of this batch's block table and lengths."""
        from .paged import paged_metadata

        return paged_metadata(
            self.kv_cache,
            self.block_table,
            self.cache_seqlens,
            self.draft_len,
            num_heads=num_heads,
            out=out,
        )

    def slots(self, b: int) -> torch.Tensor:
        """Pool slots (block * page + offset) of sequence b's positions, on
        the host."""
        page = self.page_size
        row_stride = self.kv_cache.stride(1) if page > 1 else self.kv_cache.stride(0)
        per_block = self.kv_cache.stride(0) // row_stride
        pos = torch.arange(self.prefix_lens[b] + self.draft_len)
        blocks = self.block_table[b].cpu().long()[pos // page]
        return blocks * per_block + pos % page

    def reference(self) -> torch.Tensor:
        """float32 [bs, L, H, 512], through the token-indexed reference:
        the prefix from the pool, the drafts' rows gathered and scaled in
        float32 (so scaled like the prefix, as the paged semantics say)."""
        from .paged import token_pool

        bs, L = len(self.prefix_lens), self.draft_len
        pool = token_pool(self.kv_cache)
        slots = [self.slots(b) for b in range(bs)]
        prefix = [s[: self.prefix_lens[b]] for b, s in enumerate(slots)]
        drafts = torch.cat([s[self.prefix_lens[b] :] for b, s in enumerate(slots)])
        rows = _rows_as_float(pool, drafts.to(pool.device))  # [bs*L, 576]
        lens = torch.tensor([0, *self.prefix_lens])
        out = verify_mla_reference(
            self.q.reshape(bs * L, self.num_heads, Q_DIM),
            (rows * self.k_scale)[:, None],
            (rows[:, :V_DIM] * self.v_scale)[:, None],
            pool,
            pool[..., :V_DIM],
            (torch.arange(bs + 1) * L).to(torch.int32),
            lens.cumsum(0).to(torch.int32),
            torch.cat(prefix).to(torch.int32).to(pool.device),
            sm_scale=self.sm_scale,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
        )
        return out.view(bs, L, self.num_heads, V_DIM)


def make_paged_batch(
    num_heads: int,
    draft_len: int,
    prefix_lens: list[int],
    *,
    page_size: int,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    extra_columns: int = 1,
    max_blocks: int | None = None,
    num_blocks: int | None = None,
    row_stride: int = Q_DIM,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sm_scale: float | None = None,
    seed: int | None = None,
) -> PagedBatch:
    """A random paged batch: sequence b has ``prefix_lens[b] + draft_len``
    tokens in shuffled blocks of ``page_size``. The block table has
    ``extra_columns`` columns past the longest sequence's pages, or
    ``max_blocks`` in all (the unused ones point at the spare NaN block);
    the cache has two blocks more than used, or ``num_blocks`` (shapes fixed
    for graph replays); ``row_stride`` > 576 pads each token row (a cache
    view into wider rows)."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else torch.seed() % (2**31))
    kv_dtype = kv_dtype or dtype
    bs = len(prefix_lens)
    seqlens = [n + draft_len for n in prefix_lens]
    pages = [-(-n // page_size) for n in seqlens]
    max_blocks = max_blocks or max(pages) + extra_columns
    num_blocks = num_blocks or sum(pages) + 2  # a spare block, and one no column names
    if max_blocks < max(pages) or num_blocks < sum(pages) + 1:
        raise ValueError(
            f"max_blocks / num_blocks: expected >= {max(pages)} / {sum(pages) + 1}, "
            f"got {max_blocks} / {num_blocks}"
        )
    perm = torch.randperm(num_blocks, generator=gen, device=device).cpu()
    spare = int(perm[-1])
    table = torch.full((bs, max_blocks), spare, dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[used : used + n].to(torch.int32)
        used += n

    rows = _nan_pool(num_blocks * page_size, row_stride, kv_dtype, device)
    kv_cache = rows[..., :Q_DIM].view(num_blocks, page_size, 1, Q_DIM)
    batch = PagedBatch(
        q=_signed_uniform(gen, (bs, draft_len, num_heads, Q_DIM), device).to(dtype),
        kv_cache=kv_cache,
        block_table=table.to(device),
        cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device=device),
        draft_len=draft_len,
        prefix_lens=list(prefix_lens),
        sm_scale=sm_scale if sm_scale is not None else 1.0 / math.sqrt(Q_DIM),
        k_scale=k_scale,
        v_scale=v_scale,
    )
    pool = rows[:, 0, :Q_DIM]  # [slots, 576]
    slots = torch.cat([batch.slots(b) for b in range(bs)]).to(device)
    values = _signed_uniform(gen, (slots.numel(), Q_DIM), device).to(kv_dtype)
    if kv_dtype.itemsize == 1:  # index_put has no fp8 kernel on every backend
        pool.view(torch.uint8)[slots] = values.view(torch.uint8)
    else:
        pool[slots] = values
    return batch


def _signed_uniform(gen: torch.Generator, shape: tuple[int, ...], device) -> torch.Tensor:
    """Values in +-[0.25, 2.25]: random, and never zero."""
    x = torch.rand(*shape, generator=gen, device=device) * 2 + 0.25
    sign = torch.randint(0, 2, shape, generator=gen, device=device) * 2 - 1
    return x * sign


def _rows_as_float(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """pool[slots, 0] as float32; fp8 rows move as bytes."""
    if pool.element_size() == 1:
        return pool[:, 0].view(torch.uint8)[slots].view(pool.dtype).float()
    return pool[slots, 0].float()
