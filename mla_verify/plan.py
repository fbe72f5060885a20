"""Host planning: everything one call's launch needs, derived once from
shapes, dtypes, strides and the config, never from tensor values.

``plan_call`` picks stage 1's kernel (the Hopper kernel where it can run
the call, else the Triton kernel with the same tile), the grid, the
workspace's partial rows, whether V is a view of K and which mask bits
the kernels read; ``kernel.launch`` only reads the plan. The Hopper
kernel runs MLA, 256/256 and 128/128 calls (``hopper.supports``; ragged
drafts and tree masks included); other calls take the Triton kernel.
``head_block_plan`` (with ``share_plan``) is the host-side model of the
Hopper kernel's plan, which both stages compute on the device and the
tests hold them to.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import triton

from . import hopper
from .config import HOPPER_KERNELS, VerifyConfig, runs_score_value, splits_scores
from .device import has_dependent_launch, is_cuda_sm90, sm_count
from .kernel import (
    INTERPRETED,
    MERGE_MAX_BLOCKS,
    MERGE_MAX_PROGRAMS,
    MERGE_PROGRAM_ELEMENTS,
    MERGE_REQUEST_PROGRAMS,
)
from .problem import KV_DTYPE_NAMES, MAX_BATCH_SIZE, MLA_HEAD_DIMS, QK_HEAD_DIM, V_HEAD_DIM


def v_is_k_view(k: torch.Tensor, v: torch.Tensor) -> bool:
    """MLA passes V as the view k[..., :512] (ordinary attention may pass K
    itself): then one load feeds both products. Metadata only."""
    return v.data_ptr() == k.data_ptr() and v.stride(0) == k.stride(0) and v.dtype == k.dtype


def uses_gluon_sm90(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    draft_len: int,
    v_from_k: bool,
    v_dim: int = V_HEAD_DIM,
    score_value: bool = True,
    others: tuple[torch.Tensor, ...] = (),
) -> bool:
    """Whether a Hopper config runs the Hopper kernel for this call's
    tensors (compiled, on an sm90 device, bf16 q, and what
    ``hopper.supports`` names: MLA with V a view of K, or 256/256 and
    128/128; fp8 KV on score/value for MLA only; q, k_buffer and
    ``others``, the call's other inputs, ``hopper.copy_aligned``); otherwise the
    Triton kernel runs the same tile. Metadata only: both kernels read the
    draft counts and masks on the device."""
    return (
        hopper.available()
        and not INTERPRETED
        and q.dtype == torch.bfloat16
        and is_cuda_sm90(q.device)
        and hopper.supports(
            draft_len,
            KV_DTYPE_NAMES.get(k_buffer.dtype, ""),
            v_from_k,
            (q.shape[-1], v_dim),
            score_value,
        )
        and all(hopper.copy_aligned(t) for t in (q, k_buffer, *others))
    )


def dependent_launch(device: torch.device) -> bool:
    """Whether stage 2 goes out as a programmatic dependent launch (CUDA,
    sm90 and later): its grid launches while stage 1 drains, plans, and
    waits in the kernel for stage 1's partials, so the gap between the two
    launches overlaps stage 1's tail."""
    return not INTERPRETED and has_dependent_launch(device)


def for_separate_v(
    config: VerifyConfig, head_dims: tuple[int, int] = MLA_HEAD_DIMS
) -> VerifyConfig:
    """The config to launch when V is not a view of K's columns: the Triton
    kernel.

    A separate V tile adds its columns to the KV bytes a stage holds in
    shared memory. For MLA that doubles them (344 KB for 2 stages of 64
    tokens on the H200, over the 227 KB limit), so such calls run one stage
    of at most 32 tokens; MLA engines pass the view and never take this
    path. Where K and V together are no wider than MLA's K (ordinary
    attention: 512 or 256 columns, the way SGLang passes its caches), the
    tile fits as tuned.
    """
    if sum(head_dims) <= QK_HEAD_DIM:
        return dataclasses.replace(config, kernel="triton", MIN_SHARE=None)
    return dataclasses.replace(
        config, num_stages=1, BLOCK_N=min(config.BLOCK_N, 32), kernel="triton", MIN_SHARE=None
    )


def fit_grid(config: VerifyConfig, batch_size: int, triton_kernel: bool = False) -> VerifyConfig:
    """Stage 1's second grid dimension (batch x NUM_KV_SPLITS) is capped by
    CUDA at 65535: very large batches get fewer units per request.

    ``triton_kernel`` (the Triton kernel's launches): at least two units a
    request. The kernel cuts the batch's prefix tokens into batch x
    (NUM_KV_SPLITS - 1) equal shares, so one split would leave a single
    share, one program, for the whole batch; with two, a uniform batch
    gets one unit a request, the spare slots holding the partials of
    shares that meet two requests. Batches past half the cap get one
    split, and one program: correct, not fast."""
    splits = max(2, config.NUM_KV_SPLITS) if triton_kernel else config.NUM_KV_SPLITS
    splits = min(splits, max(1, MAX_BATCH_SIZE // batch_size))
    return config if splits == config.NUM_KV_SPLITS else config.with_splits(splits)


def min_share(config: VerifyConfig) -> int:
    """Positions a share of the Hopper kernel holds at least: the config's,
    else the kernel's default."""
    return config.MIN_SHARE or hopper.DEFAULT_MIN_SHARE


def partial_rows(
    batch_size: int,
    num_heads: int,
    draft_len: int,
    num_kv_splits: int,
    share_ctas: int,
    block_h: int,
) -> int:
    """Partial rows stage 1 writes: two slots a CTA of one tile's rows each
    (the Hopper kernel, ``share_ctas`` CTAs per head block), then each
    CTA's order of a ragged batch's requests; or one row a (unit, head,
    draft) of batch x NUM_KV_SPLITS units."""
    if share_ctas:
        return hopper.partial_rows(share_ctas, num_heads, draft_len, block_h) + hopper.order_rows(
            share_ctas, num_heads, block_h, batch_size
        )
    return batch_size * num_kv_splits * num_heads * draft_len


def workspace_numel(rows: int, v_dim: int = V_HEAD_DIM) -> tuple[int, int]:
    """fp32 elements of (part_o, part_lse) for ``rows`` partial rows,
    ``v_dim`` values a row."""
    return rows * v_dim, rows


def merge_column_blocks(
    batch_size: int, num_heads: int, draft_len: int, share_ctas: int, v_dim: int = V_HEAD_DIM
) -> int:
    """Column blocks of stage 2 after the Hopper kernel's shares
    (``share_ctas`` per head block; ``v_dim`` output columns): more blocks
    give each program a narrower tile with more pieces per load and spread
    a request over more programs, but each program pays the plan and its
    loads' latency. Sized from the pieces a request holds on average; a
    power of two."""
    pieces = max(1, share_ctas // batch_size)
    elements = pieces * triton.next_power_of_2(draft_len) * v_dim
    by_work = pow2_at_most(elements // MERGE_PROGRAM_ELEMENTS)
    by_request = triton.next_power_of_2(-(-MERGE_REQUEST_PROGRAMS // num_heads))
    most = pow2_at_most(MERGE_MAX_PROGRAMS // (batch_size * num_heads))
    # MERGE_MAX_BLOCKS for MLA's 512 columns: blocks of 32 columns at least.
    return min(MERGE_MAX_BLOCKS * v_dim // V_HEAD_DIM, most, max(by_work, by_request))


def pow2_at_most(n: int) -> int:
    """The largest power of two <= n, and 1 for n < 1."""
    return 1 << (max(1, n).bit_length() - 1)


@dataclass(frozen=True)
class Plan:
    """One call's launch, derived from metadata only.

    config           the config launched (separate V and CUDA's grid limit
                     applied)
    v_from_k         V is a view of K's latent columns: one load feeds both
                     products
    v_extend_from_k  likewise for the drafts
    share_ctas       the Hopper kernel's shares per head block (one wave of
                     CTAs); 0 where the Triton kernel runs
    score_value      the Hopper kernel runs the call on its score/value
                     schedule (False where the Triton kernel runs it)
    dependent        stage 2 is a programmatic dependent launch
    merge_blocks     column blocks of stage 2 after the shares
    ragged           some request may have fewer than draft_len drafts (q
                     has fewer rows than batch x draft_len) and there is
                     more than one head block: the Hopper kernel packs its
                     rows and plans by them
    head_dims        (q/k, v) head dims; the q/k columns past v are rope
    prefix_mask      stage 1 reads the mask's prefix bits
    draft_mask       the mask's draft block replaces the causal one (the
                     Hopper kernel reads it in stage 1, the Triton path in
                     stage 2)
    paged            k_buffer is a paged MLA cache whose full prefix tiles
                     the Hopper kernel loads whole by TMA (its PAGED module,
                     hopper.loads_pages)
    split_scores     the Triton kernel runs on Hopper with a tile whose score
                     dots split the keys between warpgroups
                     (config.splits_scores)
    """

    config: VerifyConfig
    batch_size: int
    num_heads: int
    draft_len: int
    v_from_k: bool
    v_extend_from_k: bool
    share_ctas: int
    score_value: bool
    dependent: bool
    merge_blocks: int
    ragged: bool
    head_dims: tuple[int, int] = MLA_HEAD_DIMS
    prefix_mask: bool = False
    draft_mask: bool = False
    paged: bool = False
    split_scores: bool = False

    @property
    def hopper(self) -> bool:
        return self.share_ctas > 0

    @property
    def min_share(self) -> int:
        return min_share(self.config)

    @property
    def partial_rows(self) -> int:
        return partial_rows(
            self.batch_size,
            self.num_heads,
            self.draft_len,
            self.config.NUM_KV_SPLITS,
            self.share_ctas,
            self.config.BLOCK_H,
        )


def plan_call(
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    *,
    batch_size: int,
    draft_len: int,
    config: VerifyConfig,
    masked: bool = False,
    skip_prefix_mask: bool = True,
    page_size: int = 1,
) -> Plan:
    """The plan of one call with ``config`` (tuned or forced). ``masked``:
    the call has a custom mask; ``skip_prefix_mask``: its prefix bits are
    not read (every row sees the whole prefix); ``page_size``: ``k_buffer``
    is a paged cache seen as a page-size-1 pool, each request's prefix
    begins a page and its ``kv_indices`` run through each page's slots in
    order (``verify_mla_paged``'s translation); 1: any slots.

    Either kernel reads the draft counts (at most draft_len each) and the
    mask on the device."""
    num_heads = q.shape[1]
    head_dims = (q.shape[-1], v_buffer.shape[-1])
    v_from_k = v_is_k_view(k_buffer, v_buffer)
    kv_dtype = KV_DTYPE_NAMES[k_buffer.dtype]
    score_value = runs_score_value(config.kernel, kv_dtype, head_dims)
    hopper_kernel = config.kernel in HOPPER_KERNELS and uses_gluon_sm90(
        q,
        k_buffer,
        draft_len,
        v_from_k,
        head_dims[1],
        score_value,
        (v_buffer, k_extend, v_extend),
    )
    if not (v_from_k or hopper_kernel):
        config = for_separate_v(config, head_dims)
    config = fit_grid(config, batch_size, triton_kernel=not hopper_kernel)
    share_ctas = 0
    if hopper_kernel:
        share_ctas = hopper.ctas_per_head_block(sm_count(q.device), num_heads, config.BLOCK_H)
    return Plan(
        config=config,
        batch_size=batch_size,
        num_heads=num_heads,
        draft_len=draft_len,
        v_from_k=v_from_k,
        v_extend_from_k=v_is_k_view(k_extend, v_extend),
        share_ctas=share_ctas,
        score_value=hopper_kernel and score_value,
        dependent=dependent_launch(q.device),
        merge_blocks=(
            merge_column_blocks(batch_size, num_heads, draft_len, share_ctas, head_dims[1])
            if share_ctas
            else 1
        ),
        head_dims=head_dims,
        # With one head block every request has rows in it: packing would
        # cut no tile and only add the plan of draft counts.
        ragged=(
            q.shape[0] < batch_size * draft_len
            and hopper.head_blocks(num_heads, config.BLOCK_H) > 1
        ),
        prefix_mask=masked and not skip_prefix_mask,
        draft_mask=masked,
        paged=(
            hopper_kernel and head_dims == MLA_HEAD_DIMS and hopper.loads_pages(page_size, k_buffer)
        ),
        split_scores=(
            not hopper_kernel
            and not INTERPRETED
            and is_cuda_sm90(q.device)
            and splits_scores(config, draft_len)
        ),
    )


# --- the share rule, modelled on the host ------------------------------------


@dataclass(frozen=True)
class SharePlan:
    """How the Hopper kernel cuts one head block's positions: share c holds
    positions ``starts[c] .. starts[c + 1] - 1``; request r's positions
    begin at ``bases[r]`` (its prefix tiles, then its drafts; in index
    order, or a ragged call's order, ``ragged_order``); a request not
    ``present`` (no heads in the head block) holds none."""

    tiles: list[int]
    drafts: int
    starts: list[int]
    bases: list[int]
    present: list[bool]

    @property
    def shares(self) -> int:
        return len(self.starts) - 1

    def pieces(self) -> list[list[int]]:
        """Partial slots of each request: a share works on a request where
        its range holds one of the request's tiles or its drafts' first
        position; the first request a share works on writes slot 2c, a later
        one 2c + 1."""
        pieces: list[list[int]] = [[] for _ in self.tiles]
        for c in range(self.shares):
            lo, hi = self.starts[c], self.starts[c + 1]
            worked = sorted(
                (
                    r
                    for r, (base, tiles, present) in enumerate(
                        zip(self.bases, self.tiles, self.present)
                    )
                    if present and lo <= base + tiles and base < hi
                ),
                key=lambda r: self.bases[r],
            )
            for k, r in enumerate(worked):
                pieces[r].append(2 * c + (k > 0))
        return pieces


def _positions(
    tiles: list[int], present: list[bool], drafts: int | None = None
) -> tuple[list[int], int]:
    """Each request's positions in a head block, and the drafts' weight:
    its prefix tiles, then its drafts, ``drafts`` of them, by default
    DRAFT_POSITIONS (a segment's fixed cost) unless every request present
    holds as many tiles (then one); none for a request not present."""
    if drafts is None:
        uniform = len({t for t, p in zip(tiles, present) if p}) <= 1
        drafts = 1 if uniform else hopper.DRAFT_POSITIONS
    return [t + drafts if p else 0 for t, p in zip(tiles, present)], drafts


def ragged_order(draft_counts: list[int]) -> list[int]:
    """The order a ragged call's requests take their positions in: most
    drafts first, then by index. A request of E drafts has heads in the
    head blocks below some bound that grows with E, so each head block's
    requests come first, in the same order, in every head block."""
    return sorted(range(len(draft_counts)), key=lambda b: (-draft_counts[b], b))


def _bases(positions: list[int], order: list[int] | None) -> list[int]:
    bases = [0] * len(positions)
    done = 0
    for r in order if order is not None else range(len(positions)):
        bases[r] = done
        done += positions[r]
    return bases


def share_plan(
    prefix_lens: list[int],
    ctas: int,
    min_share: int,
    present: list[bool] | None = None,
    order: list[int] | None = None,
) -> SharePlan:
    """The Hopper kernel's shares of one head block (``kernel_sm90._share_count``
    and ``kernel._share_count`` compute the same on the device), over the
    requests ``present`` in it (all by default), B of them, their positions
    in index order or ``order``:

    - each request's prefix tiles and its drafts are positions (``_positions``);
    - one share a CTA, of ``min_share`` positions at least, and at most
      ``B + floor(4 sqrt(total B))`` in all (about 1 + 4 sqrt(P) a request
      of P positions: past that, merging more partials costs more than
      shorter shares save; the kernels take a float32 sqrt, equal to this
      wherever the cap can bind);
    - where every request holds as many positions, the nearest count below
      that cuts only at request boundaries, if that costs at most a
      sixteenth of the shares.
    """
    tokens = hopper.TOKENS
    tiles = [-(-n // tokens) for n in prefix_lens]
    present = [True] * len(tiles) if present is None else list(present)
    positions, drafts = _positions(tiles, present)
    total, batch_size = sum(positions), sum(present)
    used = min(ctas, -(-total // min_share), math.isqrt(16 * total * batch_size) + batch_size)
    if drafts == 1:
        each = max(positions)
        boundaries = {b * each for b in range(batch_size + 1)}

        def cuts(count: int) -> set[int]:
            return {k * total // count for k in range(count + 1)}

        aligned = max(
            c for c in range(1, used + 1) if cuts(c) <= boundaries or boundaries <= cuts(c)
        )
        if 16 * aligned >= 15 * used:
            used = aligned
    starts = [c * total // used for c in range(used + 1)]
    bases = _bases(positions, order)
    return SharePlan(tiles=tiles, drafts=drafts, starts=starts, bases=bases, present=present)


def _has_rows(head_block: int, tile_rows: int, num_heads: int, draft_count: int) -> bool:
    """Whether a request of ``draft_count`` drafts has rows in head block
    ``head_block``: its H E rows packed densely, tile_rows = BLOCK_H x L a
    tile, a head's drafts straddling two tiles where they fall so
    (kernel_sm90._min_rows)."""
    return head_block * tile_rows < num_heads * draft_count or head_block == 0


@dataclass(frozen=True)
class HeadBlockPlan:
    """The Hopper kernel's plan of a batch over its head blocks: head block
    k works on CTAs ``first_ctas[k] ..`` of the grid, cut as ``shares[k]``
    (None where no request has heads in it). A ``ragged`` call (some
    request with fewer than L drafts; ``plan_call`` picks that module over
    several head blocks only) packs a request's H E rows densely
    (``_has_rows``) and writes partial rows (slot, tile row), the slots the
    grid's CTAs'; another writes rows (slot, head, draft), the slots its
    head block's CTAs'."""

    first_ctas: list[int]
    shares: list[SharePlan | None]
    draft_counts: list[int]
    num_heads: int
    draft_len: int
    tile_rows: int
    ragged: bool

    def pieces(self, request: int, head: int) -> list[list[int]]:
        """The partial rows of a (request, head) that several CTAs hold,
        one list a piece, one row a draft; one piece: its CTA wrote the
        output."""
        if not self.ragged:
            block = head // (self.tile_rows // self.draft_len)
            slots = self.shares[block].pieces()[request]
            first = [(s * self.num_heads + head) * self.draft_len for s in slots]
            return [[row + i for i in range(self.draft_len)] for row in first]
        rows = max(self.draft_counts[request], 1)
        blocks = [(head * rows + i) // self.tile_rows for i in range(rows)]
        # A straddling head's blocks hold the request at the same positions
        # (the requests before it have as many drafts or more), so their
        # shares give it the same pieces.
        slots = self.shares[blocks[0]].pieces()[request]
        return [
            [
                (2 * self.first_ctas[block] + s) * self.tile_rows
                + (head * rows + i) % self.tile_rows
                for i, block in enumerate(blocks)
            ]
            for s in slots
        ]


def head_block_plan(
    prefix_lens: list[int],
    draft_counts: list[int],
    num_heads: int,
    block_h: int,
    draft_len: int,
    ctas: int,
    min_share: int,
) -> HeadBlockPlan:
    """The host-side model of ``kernel_sm90._head_block_plan`` (and stage
    2's ``kernel._head_block_shares``) with ``ctas`` CTAs per head block:
    a request of E drafts has rows in head blocks k with
    k * BLOCK_H L < H E (``_has_rows``); a ragged call's requests take their
    positions in ``ragged_order``.

    Where every request has heads in every head block, each head block
    keeps its row of ``ctas`` CTAs and cuts its positions into equal shares
    (``share_plan``). Else the shares are aligned: one share length S for
    every head block, share c holding positions c S .. (c + 1) S - 1, so
    that the CTAs of the head blocks that read one prefix tile read it at
    about the same time and the L2 serves all but the first read (with
    shares cut apart, the ragged H64 L4 row read its KV from memory 2.5
    times). Head block k takes ceil(T_k / S) CTAs, one head block after
    another, T_k its positions (drafts weighing DRAFT_POSITIONS, even
    where every request holds as many tiles: the cuts fall anywhere); S
    is the least that fits the grid, ceil(sum T / (grid - head blocks)),
    at least ``min_share`` and no shorter than the cap of ``share_plan``
    allows the first head block (it holds every request)."""
    blocks = hopper.head_blocks(num_heads, block_h)
    tile_rows = block_h * draft_len
    tiles = [-(-n // hopper.TOKENS) for n in prefix_lens]
    present = [[_has_rows(k, tile_rows, num_heads, e) for e in draft_counts] for k in range(blocks)]
    ragged = min(draft_counts) < draft_len
    order = ragged_order(draft_counts) if ragged else None
    first_ctas = [k * ctas for k in range(blocks)]
    if all(all(p) for p in present):
        shares = [share_plan(prefix_lens, ctas, min_share, p, order) for p in present]
    else:
        # The drafts weigh DRAFT_POSITIONS in every head block: aligned
        # shares cut requests wherever they fall, even where every request
        # holds as many tiles.
        drafts = hopper.DRAFT_POSITIONS
        positions = [_positions(tiles, p, drafts)[0] for p in present]
        totals = [sum(p) for p in positions]
        grid, batch_size = blocks * ctas, len(tiles)
        cap = math.isqrt(16 * totals[0] * batch_size) + batch_size
        fit = -(-sum(totals) // (grid - blocks)) if grid > blocks else totals[0]
        share_len = max(fit, min_share, -(-totals[0] // cap))
        used = [-(-total // share_len) for total in totals]
        first_ctas = [sum(used[:k]) for k in range(blocks)]
        shares = [
            SharePlan(
                tiles=tiles,
                drafts=drafts,
                starts=[min(c * share_len, total) for c in range(n + 1)],
                bases=_bases(w, order),
                present=p,
            )
            if n
            else None
            for n, total, w, p in zip(used, totals, positions, present)
        ]
    return HeadBlockPlan(
        first_ctas=first_ctas,
        shares=shares,
        draft_counts=list(draft_counts),
        num_heads=num_heads,
        draft_len=draft_len,
        tile_rows=tile_rows,
        ragged=ragged,
    )
