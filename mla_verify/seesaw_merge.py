"""Stage 2 after the seesaw kernel, its pieces read from a step's plan.

``kernel.launch_merge_shares`` finds each request's pieces at every
program's start: it sums the batch's positions up to the request and cuts
them as the seesaw kernel's plan does, before it waits for stage 1. Where
a step's metadata holds the seesaw's shares (``paged_metadata(...,
num_heads=H)``), it holds each request's pieces too (``launch_plan``), and
stage 2 reads three numbers instead (``launch``): its programs that find
room only once stage 1 is done then wait on one load, not on the plan.
On an H100 (RESULTS.md, "Stage 2 from the step's plan") that made calls
with 2K contexts 1.06x faster at batch 64 (up to 1.145x at H128 L1, where
8,192 programs each planned for nothing) and 1.01-1.03x at batch 1-32.

A request's pieces, as ``kernel._merge_shares_kernel`` finds them for a
uniform batch (every request ``draft_len`` drafts, every head block's CTAs
cut alike, so the same pieces for every head): the slot of its first
partial, the slot of the CTA that holds its first position (the later
pieces are every second slot on), and how many CTAs hold it. One piece:
stage 1 wrote the request's output, and stage 2 leaves it.

``launch`` runs one program a (request, head, column block), as
``_merge_shares_kernel`` does; ``launch_rows`` one a (request, block of up
to 16 query rows of any heads, column block), where fewer, wider programs
pay (paged._rows_merge).

A dependent launch (after the seesaw kernel), each program lets the
kernel after it launch as it starts: the next layer's seesaw kernel, a
dependent launch too, is then placed and set up while this grid ends, and
waits for it before it reads anything.

The plan's arithmetic and the merge's branches repeat
``_merge_shares_kernel``'s, not shared with it: kernel.py's code is
hashed (code_hash.py), and a helper moved there would stale every tuned
record of the Hopper kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import hopper, launcher
from .config import COMPILE_OPTIONS
from .kernel import (
    MERGE_WARPS,
    PLAN_BLOCK,
    _dependent_options,
    _merge_pieces,
    _merge_request_columns,
    _share_count,
    _share_positions,
    merge_shares_tiles,
)
from .plan import pow2_at_most

# int32s a request's pieces take: three, padded (the pad stays as
# allocated: paged_metadata zeroes the plan).
MERGE_PLAN_FIELDS = 4

# Stage 2 over a request's rows (``launch_rows``): a program merges up to
# ROWS_MERGE_MAX_ROWS query rows of one request, of any heads, in loads of
# ROWS_MERGE_TILE elements (pieces x rows x columns), as many pieces a load
# as a request holds on average up to ROWS_MERGE_MAX_PIECES; the columns
# are what is left. At H16 L1 B8 that is 128 programs of 8 warps where
# ``launch`` (one head a program) makes 512 of 2. With 2K contexts the
# seesaw kernel leaves a third of the SMs free at batch 8 (its least
# share), where stage 2's programs that fit can start before stage 1 is
# done (a prediction: RESULTS.md, "Where H16 L1 B8 with 2K contexts
# goes"). Measured on an H100, fewer and wider programs made such calls
# 1.01-1.07x faster, and batches of 16-64, whose shares fill every SM,
# 1-3% slower (paged._rows_merge says where it runs).
ROWS_MERGE_TILE = 8192
ROWS_MERGE_MAX_ROWS = 16
ROWS_MERGE_MAX_PIECES = 16
ROWS_MERGE_WARPS = 8


def plan_numel(batch_size: int) -> int:
    """int32s of a batch's merge plan (``launch_plan``)."""
    return batch_size * MERGE_PLAN_FIELDS


@triton.jit(do_not_specialize=["batch_size", "share_ctas", "min_share"])
def _merge_plan_kernel(
    MERGE_PLAN,
    QO_INDPTR,
    KV_INDPTR,
    batch_size,
    share_ctas,
    min_share,
    BLOCK_B: tl.constexpr,
    TOKENS: tl.constexpr,
    DRAFT_POSITIONS: tl.constexpr,
    FIELDS: tl.constexpr,
):
    # Request program_id(0)'s pieces, as _merge_shares_kernel's uniform
    # path finds them (its equal cuts: the CTA that holds position p is
    # ((p + 1) * ctas - 1) // total).
    req = tl.program_id(0)
    num_rows = (tl.load(QO_INDPTR + req + 1) - tl.load(QO_INDPTR + req)).to(tl.int32)
    base, n, total, uniform, drafts, _ = _share_positions(
        KV_INDPTR, QO_INDPTR, req, num_rows, batch_size, 0, BLOCK_B, TOKENS, DRAFT_POSITIONS, False
    )
    base = base.to(tl.int64)
    ctas = _share_count(share_ctas, total, uniform, batch_size, min_share).to(tl.int64)
    c0 = ((base + 1) * ctas - 1) // total
    c1 = ((base + n - drafts + 1) * ctas - 1) // total
    start0 = c0 * total // ctas
    slot0 = 2 * c0.to(tl.int32)
    # CTA c0's part is its last segment (slot 2 c0 + 1) where an earlier
    # request has work in its range, else its first.
    first = slot0 + (start0 <= base - drafts).to(tl.int32)
    row = MERGE_PLAN + req * FIELDS
    tl.store(row, first)
    tl.store(row + 1, slot0)
    tl.store(row + 2, (c1 - c0 + 1).to(tl.int32))


@triton.jit
def _planned_merge_kernel(
    O,
    MERGE_PLAN,
    PART_O,
    PART_LSE,
    stride_o_tok,
    stride_o_head,
    num_heads,
    DRAFT_LEN: tl.constexpr,
    L_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    D_BLOCK: tl.constexpr,
    D_V: tl.constexpr,
    FIELDS: tl.constexpr,
    WIDE_PIECES: tl.constexpr,
    WIDE_BLOCKS: tl.constexpr,
    WIDE_ROWS: tl.constexpr,
    WAIT_PRIOR: tl.constexpr,
):
    # Columns of block program_id(2) of request program_id(0)'s head
    # program_id(1), merged from the pieces the plan gives; a request of
    # at most WIDE_PIECES pieces by the first WIDE_BLOCKS blocks alone,
    # each D_V // WIDE_BLOCKS columns wide (WIDE_BLOCKS 0: by every block),
    # as _merge_shares_kernel.
    if WAIT_PRIOR:
        gdc_launch_dependents()  # the next kernel may be placed (module docstring)
    req = tl.program_id(0)
    head = tl.program_id(1)
    block = tl.program_id(2)
    row = MERGE_PLAN + req * FIELDS
    first = tl.load(row)
    slot0 = tl.load(row + 1)
    pieces = tl.load(row + 2)
    # Partial rows (slot, head, draft): the seesaw's, for a uniform batch.
    request = (O, stride_o_tok, stride_o_head, head, req * DRAFT_LEN, DRAFT_LEN)
    partials = (PART_O, PART_LSE, num_heads * DRAFT_LEN, head * DRAFT_LEN, L_PAD, 0)
    pieces_at = (first, slot0, pieces)
    if WIDE_BLOCKS > 0 and pieces <= WIDE_PIECES:
        if pieces > 1 and block < WIDE_BLOCKS:
            if WAIT_PRIOR:  # the partials are stage 1's (a dependent launch)
                gdc_wait()
            D_WIDE: tl.constexpr = D_V // WIDE_BLOCKS
            _merge_request_columns(
                request, partials, pieces_at, block * D_WIDE, L_PAD, WIDE_ROWS, D_WIDE, D_V
            )
    elif pieces > 1:
        if WAIT_PRIOR:
            gdc_wait()
        _merge_request_columns(
            request, partials, pieces_at, block * D_BLOCK, L_PAD, ROWS, D_BLOCK, D_V
        )


@triton.jit
def _rows_merge_kernel(
    O,
    MERGE_PLAN,
    PART_O,
    PART_LSE,
    stride_o_tok,
    stride_o_head,
    num_rows,
    DRAFT_LEN: tl.constexpr,
    BLOCK_R: tl.constexpr,
    PIECES: tl.constexpr,
    D_BLOCK: tl.constexpr,
    D_V: tl.constexpr,
    FIELDS: tl.constexpr,
    WAIT_PRIOR: tl.constexpr,
):
    # Columns of block program_id(2) of request program_id(0)'s query rows
    # program_id(1) * BLOCK_R on, counted head by head (row h L + i: head h,
    # draft i), as stage 1 lays a slot's partial rows out: PIECES pieces a
    # load.
    if WAIT_PRIOR:
        gdc_launch_dependents()  # the next kernel may be placed (module docstring)
    req = tl.program_id(0)
    r0 = tl.program_id(1) * BLOCK_R
    col0 = tl.program_id(2) * D_BLOCK
    row = MERGE_PLAN + req * FIELDS
    pieces = tl.load(row + 2)
    if pieces > 1:
        first = tl.load(row)
        slot0 = tl.load(row + 1)
        if WAIT_PRIOR:  # the partials are stage 1's (a dependent launch)
            gdc_wait()
        # _merge_pieces' "drafts" are this program's rows here: a slot's
        # rows r0 .. r0 + BLOCK_R - 1, of which num_rows - r0 are the
        # request's.
        _, l_i, acc = _merge_pieces(
            PART_O,
            PART_LSE,
            num_rows,
            r0,
            first,
            slot0,
            2,
            pieces,
            num_rows - r0,
            col0,
            BLOCK_R,
            PIECES * BLOCK_R,
            D_BLOCK,
            D_V,
        )
        offs_r = r0 + tl.arange(0, BLOCK_R)
        head = offs_r // DRAFT_LEN
        q_row = (req * DRAFT_LEN + offs_r % DRAFT_LEN).to(tl.int64)
        offs_d = col0 + tl.arange(0, D_BLOCK)
        ptr_o = O + (q_row * stride_o_tok + head * stride_o_head)[:, None] + offs_d[None, :]
        # A row a mask hid every key from has sum 0 and output 0.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(ptr_o, out.to(O.dtype.element_ty), mask=(offs_r < num_rows)[:, None])


def rows_merge_tiles(batch_size: int, rows: int, share_ctas: int, d_v: int) -> dict[str, int]:
    """The tile constexprs of stage 2 over a request's rows
    (``launch_rows``), for a batch of ``batch_size`` requests of ``rows``
    query rows each (heads x drafts) cut over ``share_ctas`` CTAs a head
    block: a program's rows, the pieces a load (a request's average: its
    share of the CTAs, and one more where its cuts fall mid-share), and the
    columns that leave the load ROWS_MERGE_TILE elements."""
    block_r = min(triton.next_power_of_2(rows), ROWS_MERGE_MAX_ROWS)
    average = share_ctas // batch_size + 1
    pieces = min(triton.next_power_of_2(average), ROWS_MERGE_MAX_PIECES)
    d_block = min(d_v, pow2_at_most(ROWS_MERGE_TILE // (pieces * block_r)))
    return {"BLOCK_R": block_r, "PIECES": pieces, "D_BLOCK": d_block, "D_V": d_v}


def launch_rows(
    o: torch.Tensor,
    merge_plan: torch.Tensor,
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
    *,
    batch_size: int,
    draft_len: int,
    share_ctas: int,
    dependent: bool,
) -> None:
    """Stage 2 after the seesaw kernel as ``launch``, each program over up
    to ROWS_MERGE_MAX_ROWS query rows of a request, of any heads (a
    uniform batch cuts every head alike: ``rows_merge_tiles``)."""
    num_heads, d_v = o.shape[1], o.shape[2]
    rows = num_heads * draft_len
    tiles = rows_merge_tiles(batch_size, rows, share_ctas, d_v)
    grid = (batch_size, triton.cdiv(rows, tiles["BLOCK_R"]), d_v // tiles["D_BLOCK"])
    operands = (o, merge_plan, part_o, part_lse, rows)
    _launch_merge(_rows_merge_kernel, grid, operands, draft_len, dependent, ROWS_MERGE_WARPS, tiles)


def launch_plan(
    merge_plan: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    *,
    batch_size: int,
    share_ctas: int,
    min_share: int,
) -> None:
    """Each request's pieces into ``merge_plan`` [plan_numel(batch_size)]
    int32, from the indptrs of a uniform batch, for the seesaw's grid of
    ``share_ctas`` CTAs a head block and shares of ``min_share`` positions
    at least."""
    launcher.launch(
        _merge_plan_kernel,
        (batch_size,),
        merge_plan,
        qo_indptr,
        kv_indptr,
        batch_size,
        share_ctas,
        min_share,
        BLOCK_B=PLAN_BLOCK,
        TOKENS=hopper.TOKENS,
        DRAFT_POSITIONS=hopper.DRAFT_POSITIONS,
        FIELDS=MERGE_PLAN_FIELDS,
        num_warps=4,
        num_stages=1,
        **COMPILE_OPTIONS,
    )


def launch(
    o: torch.Tensor,
    merge_plan: torch.Tensor,
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
    *,
    batch_size: int,
    draft_len: int,
    column_blocks: int,
    dependent: bool,
    warps: int = MERGE_WARPS,
) -> None:
    """Stage 2 after the seesaw kernel, as ``kernel.launch_merge_shares``
    launches it for a uniform batch (the same programs, the same columns a
    program), each request's pieces read from ``merge_plan``
    (``launch_plan``). Writes ``o`` [bs * draft_len, heads, d_v] where a
    request's prefix was cut between CTAs."""
    num_heads, d_v = o.shape[1], o.shape[2]
    grid = (batch_size, num_heads, column_blocks)
    tiles = merge_shares_tiles(draft_len, d_v, column_blocks)
    operands = (o, merge_plan, part_o, part_lse, num_heads)
    _launch_merge(_planned_merge_kernel, grid, operands, draft_len, dependent, warps, tiles)


def _launch_merge(kernel, grid, operands, draft_len, dependent, warps, tiles) -> None:
    """One of the planned merges (``launch``, ``launch_rows``): ``operands``
    the output, the merge plan, the partials and the count the kernel
    takes after the output's strides."""
    o, merge_plan, part_o, part_lse, count = operands
    launcher.launch(
        kernel,
        grid,
        o,
        merge_plan,
        part_o,
        part_lse,
        o.stride(0),
        o.stride(1),
        count,
        DRAFT_LEN=draft_len,
        FIELDS=MERGE_PLAN_FIELDS,
        WAIT_PRIOR=dependent,
        num_warps=warps,
        num_stages=1,
        **tiles,
        **COMPILE_OPTIONS,
        **_dependent_options(dependent),
    )
