"""A model of the seesaw probe's steady state, to predict its pair period
before a GPU times it (``scripts/probe_seesaw_pages.py``; RESULTS.md, "Two
probes for the compute-bound limit").

One SM, in cycles. Each warpgroup runs its part of a pair as the probe's
code orders it: waits for copies and hand-overs, wgmma (queued in order,
the tensor pipe shared fairly by the warpgroups with work queued), and
CUDA-core work (softmax, rescales) that holds only its own warpgroup. A
column group released at time t lands slice by slice: its first 64
columns at t + refill, each further slice ``slice_cycles`` later (one
releaser's copies queue behind each other). Products at the tensor cores'
rate (4096 bf16 FLOP a cycle an SM): Q K^T of a 64-column slice 128, P V
of a 256-column half 512; a pair's products 4352 in all.

    python scripts/model_seesaw.py [--softmax 600 800] [--refill 600 1000 1600]
        [--slice-cycles 130 260]

prints, for each setting, the period's share of the tensor rate for the
probe's orders: groups or 64-column slices (--slices), the default order
or --a-first, early release (--late-release is the last column).
"""

from __future__ import annotations

import argparse
import itertools

QK_SLICE = 128  # Q K^T over 64 latent or rope columns of a 64-token tile
PV_HALF = 512  # P V into 256 output columns
PAIR = 2 * 9 * QK_SLICE + 4 * PV_HALF
RESCALE = 150  # a warpgroup's 64 x 256 output times a row vector
RESCALE_P = 150  # the right warpgroup's P_A, loaded and taken to B's max
GROUP_SLICES = {0: range(0, 4), 1: range(4, 8), 2: range(8, 9)}  # latent L, R, rope


def pair_ops(side: str, *, softmax: int, a_first: bool, early: bool, slices: bool) -> list:
    """One pair of `side` ('left': tile A = 2p, 'right': B = 2p + 1) as ops:
    ("ready", tile, slice), ("wait", event), ("signal", event), ("mma",
    cycles, async), ("mma_wait",), ("alu", cycles), ("free", tile, group)."""
    tile = "A" if side == "left" else "B"
    if slices:  # the scores on each slice as it lands
        ops = [op for k in range(9) for op in (("ready", tile, k), ("mma", QK_SLICE, True))]
    else:  # on each group once it has all landed
        ops = [
            op
            for last in (3, 7, 8)
            for op in (("ready", tile, last), ("mma", QK_SLICE * (4 if last < 8 else 1), True))
        ]
    ops.append(("mma_wait",))
    if side == "left":
        ops += [("alu", softmax), ("signal", "SCALE_A"), ("alu", RESCALE), ("mma", PV_HALF, False)]
        ops += [("free", "A", 0)] if early else [("signal", "A_L_DONE")]
        ops += [("wait", "SCALE_B"), ("wait", "P_B"), ("alu", RESCALE), ("mma", PV_HALF, False)]
        if not early:
            ops += [("wait", "B_R_DONE"), ("free", "B", 1)]
        return ops + [("free", "B", 0), ("free", "B", 2)]
    ops += [("wait", "SCALE_A"), ("alu", softmax), ("signal", "SCALE_B"), ("signal", "P_B")]
    ops.append(("alu", RESCALE))
    add_b = [("mma", PV_HALF, False), ("free", "B", 1) if early else ("signal", "B_R_DONE")]
    add_a = [("alu", RESCALE_P), ("mma", PV_HALF, False)]
    if not early:
        add_a += [("wait", "A_L_DONE"), ("free", "A", 0)]
    add_a += [("free", "A", 1), ("free", "A", 2)]
    return ops + (add_a + add_b if a_first else add_b + add_a)


def pair_period(
    *,
    softmax: int,
    refill: int,
    slice_cycles: int,
    a_first: bool = False,
    early: bool = True,
    slices: bool = False,
    pairs: int = 40,
    step: int = 4,
) -> float:
    """The steady-state period of the left warpgroup's pairs, in cycles."""
    flags = dict(softmax=softmax, a_first=a_first, early=early, slices=slices)
    programs = {side: pair_ops(side, **flags) for side in ("left", "right")}
    ready = {(t, k): refill + k * slice_cycles for t in (0, 1) for k in range(9)}
    events: dict[tuple[str, int], int] = {}
    state = {side: dict(pair=0, pc=0, busy=0, queue=[], sync=False, copies=0) for side in programs}
    starts: list[int] = []
    now = 0
    while min(s["pair"] for s in state.values()) < pairs:
        busy = [s for s in state.values() if s["queue"]]
        for s in busy:  # the tensor pipe, shared
            s["queue"][0] -= step / len(busy)
            if s["queue"][0] <= 0:
                s["queue"].pop(0)
        for side, s in state.items():
            while s["pair"] < pairs and now >= s["busy"] and not (s["sync"] and s["queue"]):
                s["sync"] = False
                op = programs[side][s["pc"]]
                tile_of = {"A": 2 * s["pair"], "B": 2 * s["pair"] + 1}
                if op[0] == "ready" and ready.get((tile_of[op[1]], op[2]), now + 1) > now:
                    break
                if op[0] == "wait" and events.get((op[1], s["pair"]), now + 1) > now:
                    break
                if op[0] == "mma_wait" and s["queue"]:
                    break
                if op[0] == "mma":
                    s["queue"].append(op[1])
                    s["sync"] = not op[2]
                elif op[0] == "alu":
                    s["busy"] = now + op[1]
                elif op[0] == "signal":
                    events[(op[1], s["pair"])] = now
                elif op[0] == "free":  # the next pair's tile into this stage
                    first = max(now, s["copies"])
                    for i, k in enumerate(GROUP_SLICES[op[2]]):
                        ready[(tile_of[op[1]] + 2, k)] = first + refill + i * slice_cycles
                    s["copies"] = first + len(GROUP_SLICES[op[2]]) * slice_cycles
                if side == "left" and s["pc"] == 0:
                    starts.append(now)
                s["pc"] = (s["pc"] + 1) % len(programs[side])
                s["pair"] += s["pc"] == 0
        now += step
    half = len(starts) // 2
    return (starts[-1] - starts[half]) / (len(starts) - 1 - half)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--softmax", type=int, nargs="+", default=[600, 800])
    parser.add_argument("--refill", type=int, nargs="+", default=[600, 1000, 1600])
    parser.add_argument("--slice-cycles", type=int, nargs="+", default=[130, 260])
    args = parser.parse_args()
    columns = {
        "groups": dict(),
        "groups, --a-first": dict(a_first=True),
        "--slices": dict(slices=True),
        "--slices --a-first": dict(slices=True, a_first=True),
        "--late-release": dict(early=False),
    }
    print(f"share of the tensor rate (a pair's products: {PAIR} cycles)")
    print("softmax refill slice | " + " | ".join(columns))
    for softmax, refill, slice_cycles in itertools.product(
        args.softmax, args.refill, args.slice_cycles
    ):
        setting = dict(softmax=softmax, refill=refill, slice_cycles=slice_cycles)
        shares = [f"{PAIR / pair_period(**setting, **flags):.0%}" for flags in columns.values()]
        print(f"{softmax:7} {refill:6} {slice_cycles:5} | " + " | ".join(shares))


if __name__ == "__main__":
    main()
