"""Where stage 1 spills, read from its SASS: no GPU needed.

    python scripts/sass_report.py H64L4B32C16384-ragged H64L4B32C16384

compiles each shape's stage 1 for sm90 with the config the shipped table
gives it (``--schedule gluon_sm90_sv``: the Hopper kernel's tile on that
schedule instead; ``--triton``: the portable Triton kernel's own config,
``block_config(..., kernel="triton")``, what AMD GPUs run), as its launch
would (``aot.compile_stage1``), disassembles it
with the ``nvdisasm`` that ships with Triton (``aot.sass``), and prints its
instructions, registers and stack, then each loop that issues wgmma or
cp.async: its first instruction, nesting depth and size, and how many
wgmma, waits for wgmma, cp.async, local-memory accesses (spills) and CTA
barriers it holds. A chain of wgmma issued together shows one wait; a
wait for each wgmma means ptxas serialised them (too few registers for the
chain). A paged shape of 64-token pages (``-page64``, ``-page128``)
compiles the PAGED module, which loads whole pages by TMA; other page
sizes run the token-indexed stage 1, as the plain shape does.
Loops are the natural loops of the instructions' control-flow graph (a
branch back to a block that dominates it).

ptxas allocates registers for the whole function, every warp-specialised
partition at once: a change to one partition's code (even the plan before
``warp_specialize``) moves another's spills. Screen a kernel change here
before timing it (RESULTS.md, "A ragged CTA's start").
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import bench_shapes  # scripts/, first on the path when run as a script

from mla_verify import aot, hopper, lookup
from mla_verify.cli import Parser
from mla_verify.config import HOPPER_KERNELS, hopper_config

# bench.py's mask kinds as compile_stage1 takes them.
_MASKS = {"causal": "none", "tree": "draft", "treefull": "prefix"}
_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")
_END = re.compile(r"\b(?:EXIT|RET)\b")
_KINDS = {
    "wgmma": re.compile(r"\bHGMMA\b"),
    "waits": re.compile(r"\bWARPGROUP\.DEPBAR\b"),
    "cp.async": re.compile(r"\bLDGSTS\b"),
    "local": re.compile(r"\b(?:LDL|STL)\b"),
    "barrier": re.compile(r"\bBAR\.(?:SYNC|ARV|RED)"),
}


@dataclass(frozen=True)
class Loop:
    """A natural loop: the instructions of its blocks (the header's first
    is `first`), inside `depth` other loops."""

    first: int
    body: frozenset[int]
    depth: int


def parse_sass(text: str) -> tuple[list[str], dict[str, int]]:
    """nvdisasm's listing: its instructions in order, and each label's
    index (the instruction it precedes)."""
    instructions: list[str] = []
    labels: dict[str, int] = {}
    for line in text.splitlines():
        if label := _LABEL.match(line):
            labels[label.group(1)] = len(instructions)
        elif instruction := _INSTRUCTION.match(line):
            instructions.append(instruction.group(1))
    return instructions, labels


def _blocks(instructions: Sequence[str], labels: dict[str, int]) -> list[range]:
    """Basic blocks: a label or the instruction after a branch, an exit or a
    return begins one."""
    leaders = {0, *labels.values()}
    for index, instruction in enumerate(instructions):
        if _BRANCH.search(instruction) or _END.search(instruction):
            leaders.add(index + 1)
    bounds = sorted(i for i in leaders if i < len(instructions)) + [len(instructions)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def _successors(
    instructions: Sequence[str], labels: dict[str, int], blocks: list[range]
) -> list[list[int]]:
    """Each block's successors (indices into blocks): the branch target,
    and the next block unless the last instruction always leaves."""
    block_at = {block.start: k for k, block in enumerate(blocks)}
    successors = []
    for k, block in enumerate(blocks):
        last = instructions[block[-1]]
        always = not last.startswith("@")
        targets = []
        if branch := _BRANCH.search(last):
            targets.append(block_at[labels[branch.group(1)]])
        leaves = always and (branch is not None or _END.search(last) is not None)
        if not leaves and k + 1 < len(blocks):
            targets.append(k + 1)
        successors.append(targets)
    return successors


def _predecessors(successors: list[list[int]]) -> list[list[int]]:
    predecessors: list[list[int]] = [[] for _ in successors]
    for k, targets in enumerate(successors):
        for t in targets:
            predecessors[t].append(k)
    return predecessors


def _dominators(successors: list[list[int]]) -> list[set[int] | None]:
    """Each block's dominators from block 0 (None: unreachable)."""
    predecessors = _predecessors(successors)
    reachable, stack = {0}, [0]
    while stack:
        for t in successors[stack.pop()]:
            if t not in reachable:
                reachable.add(t)
                stack.append(t)
    dominators: list[set[int] | None] = [
        ({0} if k == 0 else set(reachable)) if k in reachable else None
        for k in range(len(successors))
    ]
    changed = True
    while changed:
        changed = False
        for k in sorted(reachable - {0}):
            incoming = [dominators[p] for p in predecessors[k] if dominators[p] is not None]
            new = set.intersection(*incoming) | {k} if incoming else {k}
            if new != dominators[k]:
                dominators[k], changed = new, True
    return dominators


def find_loops(instructions: Sequence[str], labels: dict[str, int]) -> list[Loop]:
    """The natural loops (a back edge's target dominates its source), one
    per header, by first instruction."""
    blocks = _blocks(instructions, labels)
    successors = _successors(instructions, labels, blocks)
    dominators = _dominators(successors)
    predecessors = _predecessors(successors)
    bodies: dict[int, set[int]] = {}
    for source, targets in enumerate(successors):
        for header in targets:
            if dominators[source] is not None and header in dominators[source]:
                body = bodies.setdefault(header, {header})
                stack = [source]
                while stack:
                    k = stack.pop()
                    if k not in body and dominators[k] is not None:  # reachable
                        body.add(k)
                        stack.extend(predecessors[k])
    spans = {
        header: frozenset(i for k in body for i in blocks[k]) for header, body in bodies.items()
    }
    return [
        Loop(
            blocks[header].start,
            span,
            sum(span < other for other in spans.values()),
        )
        for header, span in sorted(spans.items(), key=lambda item: blocks[item[0]].start)
    ]


def count(instructions: Sequence[str], loop: Loop) -> dict[str, int]:
    """The loop's wgmma, cp.async, local-memory and CTA-barrier instructions."""
    body = [instructions[i] for i in loop.body]
    return {kind: sum(bool(pattern.search(i)) for i in body) for kind, pattern in _KINDS.items()}


# A wgmma whose operand A is in registers (a register where a shared-memory
# descriptor would be), and the registers an instruction writes: its first
# operand, over as many registers as its width suffix says. Stores,
# barriers, uniform-datapath and wgmma instructions write none of the
# general registers A is read from.
_REGISTER_A = re.compile(r"\bHGMMA\.\S+\s+R\d+,\s*R(\d+),")
_OPCODE = re.compile(r"^(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*)$")
_NO_DESTINATION = (
    "ST", "RED", "ATOM", "BAR", "BRA", "WARPGROUP", "NOP", "EXIT", "RET", "LDGSTS",
    "SYNCS", "MEMBAR", "FENCE", "CALL", "DEPBAR", "U", "HGMMA",
)  # fmt: skip
_WIDTHS = tuple(
    (re.compile(pattern), n)
    for pattern, n in (
        (r"\.WIDE\b", 2),
        (r"\.64\b", 2),
        (r"\.128\b", 4),
        (r"^LDSM\..*\.4$", 4),
        (r"^LDSM\..*\.2$", 2),
    )
)


def _written(instruction: str) -> set[int]:
    opcode, operands = _OPCODE.match(instruction).groups()
    first = re.match(r"R(\d+)\b", operands)
    if opcode.startswith(_NO_DESTINATION) or first is None:
        return set()
    width = max((n for pattern, n in _WIDTHS if pattern.search(opcode)), default=1)
    return set(range(int(first.group(1)), int(first.group(1)) + width))


def overwritten_register_a(instructions: Sequence[str]) -> list[tuple[int, int]]:
    """(wgmma, writer) index pairs: a wgmma reading A from registers (four a
    thread, bf16 or fp16) whose registers an instruction writes before the
    next wgmma wait, in listing order. That is the miscompile
    triton-lang/triton#11781 reports of CUDA 12.9's ptxas: the wgmma may not
    have read them yet."""
    found = []
    for index, instruction in enumerate(instructions):
        operand_a = _REGISTER_A.search(instruction)
        if operand_a is None:
            continue
        registers = set(range(int(operand_a.group(1)), int(operand_a.group(1)) + 4))
        for later in range(index + 1, len(instructions)):
            if _KINDS["waits"].search(instructions[later]):
                break
            if _written(instructions[later]) & registers:
                found.append((index, later))
                break
    return found


def report(spec: bench_shapes.ShapeSpec, schedule: str | None = None, triton: bool = False) -> str:
    """One shape's stage 1: its config, size, registers and loops. The
    config is the shipped table's, or with ``schedule`` (one of
    ``HOPPER_KERNELS``) the Hopper kernel's tile on that schedule, or with
    ``triton`` the portable Triton kernel's own."""
    if schedule is not None:
        config = hopper_config(spec.num_heads, spec.draft_len, spec.batch_size, schedule)
    else:
        config = lookup.block_config(
            spec.num_heads,
            spec.draft_len,
            spec.batch_size,
            spec.kv_dtype,
            arch="sm90",
            kernel="triton" if triton else None,
            head_dims=spec.head_dims,
        )
    paged = spec.page_size > 0 and hopper.tiles_in_pages(spec.page_size)
    options = dict(mask=_MASKS[spec.mask], ragged=spec.ragged, paged=paged)
    compiled = aot.compile_stage1(
        config, spec.draft_len, spec.kv_dtype, "sm90", spec.head_dims, **options
    )
    resources = aot.resources(compiled, "sm90")
    instructions, labels = parse_sass(aot.sass(compiled))
    local = sum(bool(_KINDS["local"].search(i)) for i in instructions)
    # A Hopper config runs the Triton kernel where the Hopper one does not
    # take the call (hopper.supports), as its launch would.
    kernel = config.kernel if compiled.name == "_prefix_kernel_sm90" else "triton"
    tile = f"BLOCK_H {config.BLOCK_H}"
    if kernel == "triton":  # the rest of its tile is its own
        tile += f", BLOCK_N {config.BLOCK_N}, {config.num_warps} warps, {config.num_stages} stages"
    lines = [
        f"{spec.name}: {kernel}, {tile}; {len(instructions)} "
        f"instructions, {resources.registers} registers, stack {resources.scratch} bytes, "
        f"{local} local-memory accesses",
        "  loop (first, depth)     size  wgmma  waits  cp.async  local  barrier",
    ]
    for loop in find_loops(instructions, labels):
        counts = count(instructions, loop)
        if counts["wgmma"] or counts["cp.async"]:
            where = f"{'  ' * loop.depth}{loop.first} ({loop.depth})"
            lines.append(
                f"  {where:21s} {len(loop.body):6d} {counts['wgmma']:6d} {counts['waits']:6d}"
                f" {counts['cp.async']:9d} {counts['local']:6d} {counts['barrier']:8d}"
            )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = Parser(prog="sass_report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "shapes", nargs="+", type=bench_shapes.parse_shape, help="bench.py shape names"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--schedule",
        choices=HOPPER_KERNELS,
        help="compile the Hopper kernel's tile on this schedule, not the table's config",
    )
    which.add_argument(
        "--triton",
        action="store_true",
        help="compile the portable Triton kernel with its own config (what AMD GPUs run)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for spec in args.shapes:
        print(report(spec, args.schedule, args.triton))
    return 0


if __name__ == "__main__":
    sys.exit(main())
