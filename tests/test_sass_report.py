"""scripts/sass_report.py: its reading of an nvdisasm listing (blocks, natural
loops and their counts) on a hand-written one, and a real stage 1 compiled
for sm90 where Triton's nvdisasm is at hand."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import sass_report  # noqa: E402  (scripts/ is not a package)

from mla_verify import lookup  # noqa: E402

# Two nested loops (headers .L_x_0 and .L_x_1), a cold block that branches
# back into the main path (no loop: its target does not dominate it), and
# code after the exit that nothing reaches, branching into the outer loop
# (not part of it).
LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/              @P2  BRA `(.L_x_3) ;
.L_x_0:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0030*/                   STL [R1+0x4], R2 ;
.L_x_1:
        /*0040*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64] ;
        /*0048*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   LDL R5, [R1+0x4] ;
        /*0060*/                   BAR.SYNC.DEFER_BLOCKING 0x1, 0x100 ;
        /*0070*/              @P0  BRA `(.L_x_1) ;
.L_x_5:
        /*0080*/              @P1  BRA `(.L_x_0) ;
.L_x_2:
        /*0090*/                   EXIT ;
.L_x_3:
        /*00a0*/                   STL [R1], R6 ;
        /*00b0*/                   BRA `(.L_x_2) ;
.L_x_4:
        /*00c0*/                   LDL R7, [R1] ;
        /*00d0*/                   BRA `(.L_x_5) ;
"""


def test_the_listing_reads_as_instructions_and_labels():
    instructions, labels = sass_report.parse_sass(LISTING)
    assert len(instructions) == 15
    assert instructions[2] == "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ"
    assert labels == {
        ".L_x_0": 2,
        ".L_x_1": 4,
        ".L_x_5": 9,
        ".L_x_2": 10,
        ".L_x_3": 11,
        ".L_x_4": 13,
    }


def test_natural_loops_nest_and_count_their_instructions():
    instructions, labels = sass_report.parse_sass(LISTING)
    outer, inner = sass_report.find_loops(instructions, labels)
    assert (outer.first, sorted(outer.body), outer.depth) == (2, [2, 3, 4, 5, 6, 7, 8, 9], 0)
    assert (inner.first, sorted(inner.body), inner.depth) == (4, [4, 5, 6, 7, 8], 1)
    assert sass_report.count(instructions, outer) == {
        "wgmma": 1,
        "waits": 1,
        "cp.async": 1,
        "local": 2,
        "barrier": 1,
    }
    assert sass_report.count(instructions, inner) == {
        "wgmma": 0,
        "waits": 1,
        "cp.async": 1,
        "local": 1,
        "barrier": 1,
    }


def _fake_compiles(monkeypatch, kernel_name="_prefix_kernel_sm90"):
    # compile_stage1's calls (config and options), with a listing standing
    # in for the compiled kernel (of that name).
    calls = []

    def compile_stage1(config, *args, **kwargs):
        calls.append((config, kwargs))
        return SimpleNamespace(name=kernel_name)

    monkeypatch.setattr(sass_report.aot, "compile_stage1", compile_stage1)
    monkeypatch.setattr(
        sass_report.aot, "resources", lambda *a: SimpleNamespace(registers=1, scratch=0)
    )
    monkeypatch.setattr(sass_report.aot, "sass", lambda *a: LISTING)
    return calls


def test_pages_of_64_tokens_compile_the_paged_module(monkeypatch):
    # Whole pages are loaded by TMA (the PAGED module); smaller pages run
    # the token-indexed stage 1, as the plain shape does.
    calls = _fake_compiles(monkeypatch)
    args = sass_report.parse_args(["H64L4B32C16384-page64", "H64L4B32C16384-page16"])
    for spec in args.shapes:
        sass_report.report(spec)
    assert [kw["paged"] for _, kw in calls] == [True, False]


def test_a_schedule_replaces_the_tables_config(monkeypatch):
    # --schedule compiles the Hopper kernel's tile on that schedule (fp8
    # MLA rows take either); without it, the shipped table's config.
    calls = _fake_compiles(monkeypatch)
    args = sass_report.parse_args(["H64L4B32C16384-fp8", "--schedule", "gluon_sm90"])
    assert sass_report.report(args.shapes[0], args.schedule).startswith(
        "H64L4B32C16384-fp8: gluon_sm90, BLOCK_H 16"
    )
    sass_report.report(args.shapes[0], "gluon_sm90_sv")
    assert [config.kernel for config, _ in calls] == ["gluon_sm90", "gluon_sm90_sv"]
    assert sass_report.parse_args(["H16L4B8C2048"]).schedule is None
    with pytest.raises(SystemExit):
        sass_report.parse_args(["H16L4B8C2048", "--schedule", "triton"])


def test_triton_compiles_the_portable_kernels_own_config(monkeypatch):
    # --triton: the config block_config(..., kernel="triton") gives the
    # shape (its head dims included), and the header names its whole tile.
    calls = _fake_compiles(monkeypatch, kernel_name="_prefix_kernel")
    args = sass_report.parse_args(["--triton", "H8L4B32C16384", "H8L4B32C16384-d256"])
    headers = [sass_report.report(spec, args.schedule, args.triton) for spec in args.shapes]
    expected = [
        lookup.block_config(8, 4, 32, "bf16", arch="sm90", kernel="triton", head_dims=dims)
        for dims in ((576, 512), (256, 256))
    ]
    assert [config for config, _ in calls] == expected
    tile = expected[0]
    assert headers[0].startswith(
        f"H8L4B32C16384: triton, BLOCK_H {tile.BLOCK_H}, BLOCK_N {tile.BLOCK_N}, "
        f"{tile.num_warps} warps, {tile.num_stages} stages;"
    )
    with pytest.raises(SystemExit):
        sass_report.parse_args(["H8L4B32C16384", "--triton", "--schedule", "gluon_sm90"])


def test_the_header_names_the_kernel_that_compiled(monkeypatch):
    # A Hopper config the Hopper kernel does not take (fp8 KV with triton
    # 3.7: hopper.FP8_LOWERS) compiles the Triton kernel, and says so.
    _fake_compiles(monkeypatch, kernel_name="_prefix_kernel")
    args = sass_report.parse_args(["H64L4B32C16384-fp8", "--schedule", "gluon_sm90"])
    assert sass_report.report(args.shapes[0], args.schedule).startswith(
        "H64L4B32C16384-fp8: triton, BLOCK_H 16"
    )


def _nvdisasm() -> str | None:
    try:
        path = triton.knobs.nvidia.nvdisasm.path
    except (AttributeError, RuntimeError):
        return None
    return path if path and os.path.exists(path) else None


@pytest.mark.skipif(_nvdisasm() is None, reason="Triton's nvdisasm is not at hand")
def test_a_compiled_stage1_has_its_tile_loops_and_they_do_not_spill(run_compiling):
    # The score warpgroup's tile loop issues the wgmma of a tile (the most
    # of the loops that copy nothing), the producer's its cp.async
    # gathers: both are found.
    # As the package assembles it (mla_verify/assembler.py), the score
    # loop holds no local-memory access and the producer's one at most:
    # 0 and 1 with CUDA 12's ptxas (triton 3.6's, or 3.9's beside its
    # CUDA 13 one); CUDA 13.4's left 20 and 37, 1.21-1.28x slower on the
    # H200. In a process of its own, without the interpreter.
    out = run_compiling(str(REPO / "scripts" / "sass_report.py"), "H16L2B8C2048", script=True)
    header, columns, *loops = out.splitlines()
    assert header.startswith("H16L2B8C2048: gluon_sm90") and "registers" in header
    assert columns.split() == [
        "loop",
        "(first,",
        "depth)",
        "size",
        "wgmma",
        "waits",
        "cp.async",
        "local",
        "barrier",
    ]
    names = ("wgmma", "waits", "cp.async", "local")
    counts = [dict(zip(names, map(int, line.split()[-5:-1]), strict=True)) for line in loops]
    tile_loops = [c for c in counts if c["wgmma"] > 0 and not c["cp.async"]]
    assert tile_loops
    scores = max(tile_loops, key=lambda c: c["wgmma"])
    assert scores["local"] == 0, f"the score warpgroup's tile loop spills: {out}"
    # Its products issued as chains, each waited for once: not serialised.
    assert scores["waits"] < scores["wgmma"], f"the score chain is serialised: {out}"
    # The producer's tile loop: the innermost of the loops that only copy.
    copies = [
        (line, c) for line, c in zip(loops, counts, strict=True) if c["cp.async"] and not c["wgmma"]
    ]
    assert copies
    _, producer = max(copies, key=lambda item: int(re.search(r"\((\d+)\)", item[0]).group(1)))
    assert producer["local"] <= 1, f"the producer's tile loop spills: {out}"


# Two wgmma reading A from registers (R184-R187, R188-R191): the first's
# are written only after the wait, the second's before it (R190, by the
# packing of P), beside writes of other registers.
REGISTER_A = """
        /*0000*/                   WARPGROUP.ARRIVE ;
        /*0010*/                   HGMMA.64x256x16.F32.BF16 R24, R184, gdesc[UR12].tnspB, R24 ;
        /*0020*/                   LDSM.16.M88.4 R180, [R2] ;
        /*0030*/                   IMAD.WIDE.U32 R182, R4, R5, RZ ;
        /*0040*/                   STL.128 [R1], R184 ;
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0060*/                   MOV R184, RZ ;
        /*0070*/                   HGMMA.64x256x16.F32.BF16 R24, R188, gdesc[UR12].tnspB, R24 ;
        /*0080*/              @P0  LDG.E R192, desc[UR4][R6.64] ;
        /*0090*/                   F2FP.BF16.F32.PACK_AB R190, R7, R8 ;
        /*00a0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
"""


def test_a_register_a_wgmma_written_before_its_wait_is_found():
    instructions, _ = sass_report.parse_sass(REGISTER_A)
    assert sass_report.overwritten_register_a(instructions) == [(7, 9)]
    assert sass_report._written("IMAD.WIDE.U32 R182, R4, R5, RZ") == {182, 183}
    assert sass_report._written("LDSM.16.M88.4 R180, [R2]") == set(range(180, 184))
    assert sass_report._written("STL.128 [R1], R184") == set()


_TRITON_REGISTER_A = """
import sys
sys.path.insert(0, "scripts")
import sass_report
from mla_verify import aot
from mla_verify.config import VerifyConfig
tiles = (((16, 8, 2), 4, (576, 512)), ((32, 8, 3), 2, (576, 512)), ((16, 4, 3), 4, (256, 256)))
for (block_h, warps, stages), draft_len, dims in tiles:
    for kv in ("bf16", "fp8_e4m3"):
        tile = VerifyConfig(
            BLOCK_H=block_h, BLOCK_N=64, NUM_KV_SPLITS=1, num_warps=warps, num_stages=stages
        )
        compiled = aot.compile_stage1(tile, draft_len, kv, "sm90", dims)
        instructions, _ = sass_report.parse_sass(aot.sass(compiled))
        register_a = sum(bool(sass_report._REGISTER_A.search(i)) for i in instructions)
        print(block_h, draft_len, dims[0], kv, register_a,
              len(sass_report.overwritten_register_a(instructions)))
"""


@pytest.mark.slow
@pytest.mark.skipif(_nvdisasm() is None, reason="Triton's nvdisasm is not at hand")
def test_the_triton_kernels_register_a_wgmma_keep_their_registers_until_the_wait(run_compiling):
    # The Triton kernel's 64-row tiles on sm90 issue wgmma with P in
    # registers (P V), assembled by Triton's own ptxas (mla_verify/
    # assembler.py says why): none of their registers is written before
    # the wgmma's wait, the miscompile triton-lang/triton#11781 reports.
    rows = [line.split() for line in run_compiling(_TRITON_REGISTER_A, timeout=1800).splitlines()]
    assert len(rows) == 6, rows
    for block_h, draft_len, qk, kv, register_a, overwritten in rows:
        assert int(register_a) > 0 and int(overwritten) == 0, (block_h, draft_len, qk, kv)
