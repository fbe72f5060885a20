"""Every config of every shipped table compiles for its arch and fits its
shared memory / LDS, and on AMD spills no register (nor does the Triton
kernel's built-in AMD default), checked ahead of time on a machine without
that GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mla_verify import hopper
from mla_verify.aot import TARGETS
from mla_verify.device import arch_shared_memory

REPO = Path(__file__).resolve().parent.parent
SHIPPED = [p.stem for p in sorted((REPO / "configs").glob("*.json"))]

# Runs without TRITON_INTERPRET: compiling needs real (not interpreted) kernels.
# Prints one JSON line per distinct compiled kernel: [draft_len, kv_dtype,
# config, resources or the compile error]. Jobs that compile alike (split
# count, share floor, head count) compile once, on every core.
SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, os, sys
    from mla_verify import aot
    from mla_verify.config import VerifyConfig, triton_default_config
    from mla_verify.device import is_amd_arch
    arch, path = sys.argv[1], sys.argv[2]
    table = json.load(open(path))
    jobs = set()
    for entry in table["entries"].values():
        dims = tuple(entry.get("head_dims", (576, 512)))
        shape = (entry["draft_len"], entry["kv_dtype"], arch, dims)
        for bucket in entry["buckets"].values():
            for record in (bucket, bucket.get("triton")):
                if record is not None:
                    config = VerifyConfig.from_dict(record["config"])
                    jobs.add((config.with_splits(1).with_min_share(None), *shape))
            if is_amd_arch(arch):  # where no entry applies, the default runs
                config = triton_default_config(entry["num_heads"], entry["draft_len"], 1, arch)
                jobs.add((config.with_splits(1), *shape))
    jobs = sorted(jobs, key=repr)
    for (config, draft_len, kv_dtype, _, _), found in zip(
        jobs, aot.resources_many(jobs, workers=os.cpu_count() or 1)
    ):
        found = found if isinstance(found, str) else dataclasses.asdict(found)
        print(json.dumps([draft_len, kv_dtype, config.to_dict(), found]))
    """
)


def _compile(arch: str, path: Path) -> list[list]:
    out = _run_script(SCRIPT, arch, str(path), timeout=1800)
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("arch", SHIPPED)
def test_shipped_configs_compile_fit_and_do_not_spill(arch):
    assert arch in TARGETS, f"no compile target known for shipped table {arch}.json"
    rows = _compile(arch, REPO / "configs" / f"{arch}.json")
    assert rows, "no kernels compiled"
    errors = [r for r in rows if isinstance(r[3], str)]
    assert not errors, f"do not compile: {errors}"
    limit = TARGETS[arch][1]
    too_big = [r for r in rows if r[3]["shared"] > limit]
    assert not too_big, f"over {limit} B of shared memory: {too_big}"
    spilling = [r for r in rows if r[3]["spills"] or r[3]["scratch"]]
    if arch.startswith("gfx"):  # tables we derive, unmeasured: a spill is never a choice
        assert not spilling, f"spill registers: {spilling}"
    else:  # measured tables: a spilling kernel may still be the fastest, so say so
        print(f"{arch}: {len(spilling)} of {len(rows)} kernels spill (measured, kept)")


def _run_script(script: str, *args: str, timeout: int = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_spills_and_lds_are_read_from_the_compiled_kernel():
    """The configuration reported for MI355X (4 heads, BLOCK_N 64, 8 warps,
    1 stage) spills hundreds of VGPRs on gfx942 and fits gfx950; a 64-row,
    64-token tile on 8 waves spills on gfx950 too; the built-in default
    fits both. The check reads spills and LDS from the compiled kernel's
    metadata."""
    _run_script(
        textwrap.dedent(
            """
            from mla_verify import aot
            from mla_verify.config import VerifyConfig, reported_amd_config, triton_default_config
            reported = reported_amd_config(16, 32)
            on_942 = aot.compile_prefix_kernel(reported, 2, "bf16", "gfx942")
            assert on_942.spills > 100 and on_942.scratch > 0, on_942
            assert aot.problems(reported, 2, "bf16", "gfx942")
            assert not aot.problems(reported, 2, "bf16", "gfx950")
            wide = VerifyConfig(BLOCK_H=16, BLOCK_N=64, NUM_KV_SPLITS=1, num_warps=8, num_stages=1)
            assert aot.compile_prefix_kernel(wide, 4, "bf16", "gfx950").spills > 100
            for arch, lds in (("gfx950", 163840), ("gfx942", 65536)):
                default = triton_default_config(16, 2, 32, arch)
                assert aot.fits(default, 2, "bf16", arch), aot.problems(default, 2, "bf16", arch)
                assert 0 < aot.compile_prefix_kernel(default, 2, "bf16", arch).shared <= lds
            """
        )
    )


def test_compiling_many_kernels_shows_its_progress_where_asked():
    """A table's compiles take minutes on a CPU machine: resources_many
    draws a progress bar, counting compiles, when given a name for it, and
    stays quiet without one."""
    out = _run_script(
        textwrap.dedent(
            """
            import io, sys
            from mla_verify import aot
            from mla_verify.config import VerifyConfig
            job = (VerifyConfig(4, 16, 1, 4, 1), 2, "bf16", "gfx950", (576, 512))
            other = (VerifyConfig(4, 16, 1, 4, 2), 2, "bf16", "gfx950", (576, 512))
            sys.stderr = shown = io.StringIO()
            (found,) = aot.resources_many([job], progress="compiling for gfx950")
            sys.stderr = quiet = io.StringIO()
            aot.resources_many([other])
            sys.stderr = sys.__stderr__
            print(found.registers > 0, "compiling for gfx950" in shown.getvalue(),
                  "1/1" in shown.getvalue(), "compiling" in quiet.getvalue())
            """
        )
    )
    assert out.split() == ["True", "True", "True", "False"], out


def test_compiled_kernel_is_the_launched_one():
    """Compiled ahead of time, stage 1 gets the divisibility a launch finds
    in its tensors and strides: its KV stream is then pipelined with
    cp.async where the config asks for stages, as on the GPU (without it, no
    stage count changed the kernel, and registers, spills and shared memory
    were those of a kernel that never runs)."""
    out = _run_script(
        textwrap.dedent(
            """
            from mla_verify import aot
            from mla_verify.config import VerifyConfig
            for stages in (1, 2):
                config = VerifyConfig(
                    BLOCK_H=8, BLOCK_N=32, NUM_KV_SPLITS=1, num_warps=4, num_stages=stages
                )
                ptx = aot.compile_stage1(config, 2, "bf16", "sm90").asm["ptx"]
                print(stages, "cp.async" in ptx)
            """
        )
    )
    assert out.split() == ["1", "False", "2", "True"], out


NVIDIA_DEFAULTS_SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, os
    from mla_verify import aot
    from mla_verify.config import triton_default_config
    from mla_verify.device import is_amd_arch
    from mla_verify.problem import HEAD_DIMS
    jobs = []
    for arch in sorted(aot.TARGETS):
        if is_amd_arch(arch):
            continue
        for dims in HEAD_DIMS:
            for heads, draft_len in ((8, 2), (8, 4), (16, 4)):  # 16, 32 and 64 rows
                config = triton_default_config(heads, draft_len, 8, arch, "bf16", dims)
                jobs.append((config.with_splits(1), draft_len, "bf16", arch, dims))
    for job, found in zip(jobs, aot.resources_many(jobs, workers=os.cpu_count() or 1)):
        found = found if isinstance(found, str) else dataclasses.asdict(found)
        print(json.dumps([job[3], job[4], job[0].to_dict(), found]))
    """
)


@pytest.mark.slow
def test_nvidia_default_fits_every_nvidia_arch():
    """The Triton kernel's built-in NVIDIA tile launches on every NVIDIA arch
    we name, for 16, 32 and 64 rows and every head dims: it fits the arch's
    shared memory (64-token tiles need 152 KB at 64 rows of MLA, over the
    99 KB of sm86, sm89 and sm120)."""
    rows = [json.loads(line) for line in _run_script(NVIDIA_DEFAULTS_SCRIPT).splitlines()]
    archs = {arch for arch, *_ in rows}
    assert {"sm80", "sm86", "sm89", "sm90", "sm100", "sm120"} <= archs, archs
    errors = [r for r in rows if isinstance(r[3], str)]
    assert not errors, f"do not compile: {errors}"
    too_big = [r for r in rows if r[3]["shared"] > TARGETS[r[0]][1]]
    assert not too_big, f"over the arch's shared memory: {too_big}"


SEPARATE_V_SCRIPT = textwrap.dedent(
    """
    from mla_verify import aot
    from mla_verify.config import default_config
    from mla_verify.plan import for_separate_v
    for arch in ("sm86", "sm89", "sm120"):
        config = for_separate_v(default_config(16, 4, 8, arch, "bf16"))
        found = aot.compile_prefix_kernel(config, 4, "bf16", arch, separate_v=True)
        print(arch, config.BLOCK_N, found.shared, aot.TARGETS[arch][1])
    """
)


@pytest.mark.slow
def test_mla_with_a_separate_v_cache_fits_the_smallest_shared_memory():
    """An MLA call whose V is a cache of its own runs the Triton kernel with
    K's and V's columns in one stage (plan.for_separate_v). At 64 rows that
    fits the 99 KB of sm86, sm89 and sm120 with the default's 16-token tile
    (92 160 bytes compiled for sm86)."""
    rows = [line.split() for line in _run_script(SEPARATE_V_SCRIPT).splitlines()]
    assert [arch for arch, *_ in rows] == ["sm86", "sm89", "sm120"], rows
    too_big = [r for r in rows if int(r[2]) > int(r[3])]
    assert not too_big, f"over the arch's shared memory: {too_big}"


VARIANTS_SCRIPT = textwrap.dedent(
    """
    import sys
    from mla_verify.aot import MASKS, compile_prefix_kernel
    from mla_verify.config import default_config
    from mla_verify.problem import HEAD_DIMS
    arch = sys.argv[1]
    for dims in HEAD_DIMS:
        config = default_config(16, 4, 8, arch, "bf16", dims)
        for mask in MASKS:
            compile_prefix_kernel(config, 4, "bf16", arch, dims, mask=mask)
            print(dims, mask, "ok")
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(TARGETS))
def test_every_head_dims_and_mask_variant_compiles(arch):
    """Stage 1 for each supported head-dims pair, with no mask, a draft-block
    mask or prefix mask bits too, compiles for each arch (the Triton kernel, or the Hopper one
    where the default picks it)."""
    assert _run_script(VARIANTS_SCRIPT, arch, timeout=900).count("ok") == 9


RAGGED_SCRIPT = textwrap.dedent(
    """
    from mla_verify import aot, hopper
    from mla_verify.config import hopper_config
    calls = (("gluon_sm90", "bf16"), ("gluon_sm90_sv", "bf16"), ("gluon_sm90", "fp8_e4m3"))
    for kernel, kv_dtype in calls[: 3 if hopper.FP8_LOWERS else 2]:
        for dims in ((576, 512), (256, 256)):
            config = hopper_config(64, 4, 8, kernel)
            for ragged in (False, True):
                found = aot.compile_prefix_kernel(
                    config, 4, kv_dtype, "sm90", dims, mask="prefix", ragged=ragged
                )
                print(kernel, kv_dtype, dims[0], ragged, found.shared)
    """
)


@pytest.mark.slow
def test_hopper_kernel_ragged_module_compiles():
    """The Hopper kernel's module for ragged drafts (rows packed by draft
    count, head blocks' shares aligned) compiles for sm90 on either
    schedule, fp8 included (where this Triton builds it: hopper.FP8_LOWERS),
    in the shared memory of the uniform one (its plan holds its sums in
    registers)."""
    rows = [line.split() for line in _run_script(RAGGED_SCRIPT, timeout=900).splitlines()]
    assert len(rows) == (12 if hopper.FP8_LOWERS else 8), rows
    for uniform, ragged in zip(rows[::2], rows[1::2]):
        assert uniform[:3] == ragged[:3] and (uniform[3], ragged[3]) == ("False", "True")
        assert int(ragged[4]) == int(uniform[4]), (uniform, ragged)


PAGED_SCRIPT = textwrap.dedent(
    """
    import re
    from mla_verify import aot, hopper
    from mla_verify.config import hopper_config
    calls = (("gluon_sm90", "bf16"), ("gluon_sm90_sv", "bf16"), ("gluon_sm90", "fp8_e4m3"))
    for kernel, kv_dtype in calls[: 3 if hopper.FP8_LOWERS else 2]:
        for paged in (False, True):
            config = hopper_config(16, 4, 8, kernel)
            compiled = aot.compile_stage1(config, 4, kv_dtype, "sm90", paged=paged)
            found = aot.resources(compiled, "sm90")
            tma = len(re.findall(r"\\bUTMALDG\\b", aot.sass(compiled)))
            print(kernel, kv_dtype, paged, found.shared, found.spills or 0, tma)
    """
)


@pytest.mark.slow
def test_hopper_kernel_paged_module_compiles():
    """The Hopper kernel's module for paged caches (full tiles loaded by
    TMA) compiles for sm90 on either schedule, fp8 included (where this
    Triton builds it), in the shared memory of the token-indexed one, issues TMA loads where that
    one issues none, and spills nothing."""
    rows = [line.split() for line in _run_script(PAGED_SCRIPT, timeout=900).splitlines()]
    assert len(rows) == (6 if hopper.FP8_LOWERS else 4), rows
    for gathers, pages in zip(rows[::2], rows[1::2]):
        assert gathers[:2] == pages[:2] and (gathers[2], pages[2]) == ("False", "True")
        assert int(pages[3]) == int(gathers[3]), (gathers, pages)
        assert int(pages[4]) == 0, pages
        assert int(gathers[5]) == 0 and int(pages[5]) > 0, (gathers, pages)


SEESAW_SCRIPT = textwrap.dedent(
    """
    import re
    import sys
    from pathlib import Path
    from mla_verify import aot
    sys.path.insert(0, str(Path(aot.__file__).parents[1] / "scripts"))
    import sass_report
    # Unplanned at every draft count; planned (a step's metadata) at two.
    for draft_len, planned in [(n, False) for n in (1, 2, 3, 4, 8, 16)] + [(1, True), (4, True)]:
        compiled = aot.compile_seesaw(draft_len, planned=planned)
        found = aot.resources(compiled, "sm90")
        sass = aot.sass(compiled)
        tma = len(re.findall(r"\\bUTMALDG\\b", sass))
        ins, labels = sass_report.parse_sass(sass)
        loops = sass_report.find_loops(ins, labels)
        loops = [lp for lp in loops if sass_report.count(ins, lp)["wgmma"]]
        pair_loops = [lp for lp in loops if not any(other.body < lp.body for other in loops)]
        local = sum(sass_report.count(ins, lp)["local"] for lp in pair_loops)
        print(draft_len, int(planned), found.shared, found.scratch, tma, len(pair_loops), local)
    """
)


@pytest.mark.slow
def test_seesaw_kernel_compiles_fits_and_keeps_its_registers():
    """The paged seesaw kernel (kernel_seesaw.py) compiles for sm90 at every
    draft count's tile (and planned by a step's metadata, at two), fits the
    H200's shared memory and loads by TMA. Its
    two pair loops (the warpgroups' innermost wgmma loops, what runs) never
    touch local memory. Outside them a few of a segment's scalars may sit
    on the stack, read once a segment (triton 3.6: 0-8 bytes; 3.9: 56-96),
    so the stack is bounded at 128 bytes."""
    rows = [line.split() for line in _run_script(SEESAW_SCRIPT, timeout=900).splitlines()]
    cases = [(int(row[0]), int(row[1])) for row in rows]
    assert cases == [(n, 0) for n in (1, 2, 3, 4, 8, 16)] + [(1, 1), (4, 1)], rows
    for draft_len, _, shared, scratch, tma, pair_loops, local in (map(int, row) for row in rows):
        assert shared <= arch_shared_memory("sm90"), (draft_len, shared)
        assert tma > 0, draft_len
        assert pair_loops == 2, (draft_len, pair_loops)
        assert local == 0, (draft_len, local)
        assert scratch <= 128, (draft_len, scratch)


def test_seesaw_plan_kernel_compiles():
    """The kernel that plans the seesaw kernel's shares for a step's
    metadata (kernel_seesaw._plan_kernel) compiles for sm90 without
    spilling."""
    out = _run_script(
        textwrap.dedent(
            """
            import triton
            from mla_verify import aot, kernel, kernel_seesaw
            pointers = {name: "*i32" for name in ("PLAN", "QO_INDPTR", "KV_INDPTR")}
            constexprs = dict(BLOCK_B=kernel.PLAN_BLOCK)
            src = aot._signature(kernel_seesaw._plan_kernel, pointers, set(), constexprs)
            compiled = triton.compile(src, target=aot.TARGETS["sm90"][0], options={"num_warps": 4})
            print(aot.resources(compiled, "sm90").scratch)
            """
        )
    )
    assert out.split() == ["0"], out


def test_seesaw_merge_kernels_compile():
    """The kernels of stage 2 from a step's plan (seesaw_merge: the plan
    for the metadata, the merge as H16 L1 at batch 8 launches it after the
    seesaw kernel, in 2 warps, and the merge over a request's rows at
    H16 L1 B8, H8 L4 B8 and H16 L1 B2) compile for sm90 without spilling."""
    out = _run_script(
        textwrap.dedent(
            """
            import triton
            from mla_verify import aot, kernel, hopper, seesaw_merge
            i32 = {name: "*i32" for name in ("MERGE_PLAN", "QO_INDPTR", "KV_INDPTR")}
            plan_src = aot._signature(
                seesaw_merge._merge_plan_kernel, i32, set(),
                dict(BLOCK_B=kernel.PLAN_BLOCK, TOKENS=hopper.TOKENS,
                     DRAFT_POSITIONS=hopper.DRAFT_POSITIONS,
                     FIELDS=seesaw_merge.MERGE_PLAN_FIELDS),
            )
            pointers = dict(i32, O="*bf16", PART_O="*fp32", PART_LSE="*fp32")
            merge_src = aot._signature(
                seesaw_merge._planned_merge_kernel, pointers, set(),
                dict(DRAFT_LEN=1, L_PAD=1, ROWS=16, D_BLOCK=128, D_V=512,
                     FIELDS=seesaw_merge.MERGE_PLAN_FIELDS,
                     WIDE_PIECES=kernel.MERGE_WIDE_PIECES, WIDE_BLOCKS=0, WIDE_ROWS=4,
                     WAIT_PRIOR=True),
            )
            rows_srcs = [
                aot._signature(
                    seesaw_merge._rows_merge_kernel, pointers, set(),
                    dict(DRAFT_LEN=draft_len, FIELDS=seesaw_merge.MERGE_PLAN_FIELDS,
                         WAIT_PRIOR=True,
                         **seesaw_merge.rows_merge_tiles(batch, heads * draft_len, 132, 512)),
                )
                for batch, heads, draft_len in ((8, 16, 1), (8, 8, 4), (2, 16, 1))
            ]
            rows = [(src, seesaw_merge.ROWS_MERGE_WARPS) for src in rows_srcs]
            for src, warps in ((plan_src, 4), (merge_src, 2), *rows):
                target = aot.TARGETS["sm90"][0]
                compiled = triton.compile(src, target=target, options={"num_warps": warps})
                print(aot.resources(compiled, "sm90").scratch)
            """
        )
    )
    assert out.split() == ["0"] * 5, out


def test_kernels_keep_fma_contraction_where_triton_defaults_it_off():
    """The shipped tables were measured with FMA contraction, Triton's
    default through 3.9; from 3.10 the default is off
    (TRITON_DEFAULT_FP_FUSION). The package asks for it, so with that
    default off both kernels still build the arithmetic the tables timed."""
    out = _run_script(
        textwrap.dedent(
            """
            import os
            os.environ["TRITON_DEFAULT_FP_FUSION"] = "0"
            from mla_verify import aot
            from mla_verify.config import VerifyConfig, hopper_config
            tile = VerifyConfig(BLOCK_H=8, BLOCK_N=32, NUM_KV_SPLITS=1, num_warps=4, num_stages=2)
            for config in (tile, hopper_config(16, 4, 8, "gluon_sm90_sv")):
                print(aot.compile_stage1(config, 4, "bf16", "sm90").metadata.enable_fp_fusion)
            """
        )
    )
    assert out.split() == ["True", "True"], out
