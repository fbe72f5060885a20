"""Ahead-of-time compilation of the kernels for a GPU that is not present.

Triton compiles for any target on a CPU-only machine, so CI and the tuner
can check, without the hardware, that a config compiles for its arch, fits
its shared memory (LDS on AMD) and spills no register. What a compiled
stage 1 holds (``Resources``) is read from the compiled kernel:

- AMD: the kernel metadata the backend writes into ``asm["amdgcn"]``
  (``.vgpr_count``, ``.vgpr_spill_count``, ``.sgpr_spill_count``,
  ``.private_segment_fixed_size``); LDS is ``metadata.shared``, as the
  kernel's LDS is sized at launch (``.group_segment_fixed_size`` reads 0).
- NVIDIA: registers and stack frame of the cubin (``cuobjdump
  --dump-resource-usage``, shipped with Triton). These kernels make no
  calls and hold no local arrays, so their stack frame is spilled
  registers. Triton fills ``n_regs`` / ``n_spills`` only when it loads a
  binary on a GPU.

Compiling needs real kernels: run without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import multiprocessing
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import triton
from tqdm import tqdm
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from . import assembler, hopper, kernel
from .config import (
    COMPILE_OPTIONS,
    HOPPER_KERNELS,
    VerifyConfig,
    rows_per_program,
    runs_score_value,
    splits_scores,
    value_chunk,
)
from .device import arch_shared_memory
from .problem import MLA_HEAD_DIMS, check_head_dims

# The AMD archs we ship tables for.
AMD_ARCHS = ("gfx942", "gfx950")
# arch -> (Triton target, shared memory per block in bytes): the NVIDIA
# archs the Triton kernel's default is checked on, and the AMD ones.
TARGETS: dict[str, tuple[GPUTarget, int]] = {
    **{
        f"sm{cc}": (GPUTarget("cuda", cc, 32), arch_shared_memory(f"sm{cc}"))
        for cc in (80, 86, 89, 90, 100, 120)
    },
    **{arch: (GPUTarget("hip", arch, 64), arch_shared_memory(arch)) for arch in AMD_ARCHS},
}
# Mask variants of stage 1 (compile_prefix_kernel).
MASKS = ("none", "draft", "prefix")
_TRITON_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp8_e4m3": "fp8e4nv", "fp8_e4m3fnuz": "fp8e4b8"}
# (config, draft_len, kv_dtype, arch, head_dims): what compile_prefix_kernel takes
Job = tuple[VerifyConfig, int, str, str, tuple[int, int]]


@dataclass(frozen=True)
class Resources:
    """What one compiled stage-1 program holds.

    shared     bytes of shared memory (LDS on AMD)
    registers  a thread's registers (AMD: VGPRs a lane); None if unknown
    spills     registers spilled (AMD: VGPRs + SGPRs); None where the
               compiler does not count them (NVIDIA)
    scratch    bytes of memory a thread spills to (AMD: private segment;
               NVIDIA: stack frame); None if unknown
    """

    shared: int
    registers: int | None
    spills: int | None
    scratch: int | None

    def problems(self, arch: str) -> list[str]:
        """Why this program does not fit ``arch``, in words; empty if it does."""
        limit = TARGETS[arch][1]
        found = []
        if self.shared > limit:
            found.append(f"{self.shared} B of shared memory, over the {limit} B of {arch}")
        if self.spills or self.scratch:
            spilled = [f"{self.spills} registers"] if self.spills else []
            spilled += [f"{self.scratch} B of scratch a thread"] if self.scratch else []
            found.append(f"spills ({', '.join(spilled)})")
        return found


_found: dict[Job, Resources | str] = {}  # this process's compiles, by compile key


def compile_prefix_kernel(
    config: VerifyConfig, draft_len: int, kv_dtype: str, arch: str, *args, **options
) -> Resources:
    """Compile stage 1 for ``arch`` and read what it holds; the arguments
    are ``compile_stage1``'s (head dims, mask, separate V). Raises on a
    compile error."""
    return resources(compile_stage1(config, draft_len, kv_dtype, arch, *args, **options), arch)


def resources(compiled, arch: str) -> Resources:
    """What a kernel compiled for ``arch`` holds (shared memory / LDS,
    registers, spills, stack)."""
    if TARGETS[arch][0].backend == "hip":
        return _amd_resources(compiled)
    return _nvidia_resources(compiled)


def sass(compiled) -> str:
    """A kernel compiled for an NVIDIA arch, disassembled by the nvdisasm
    Triton ships (``nvdisasm -c``)."""
    return _cubin_tool(triton.knobs.nvidia.nvdisasm.path, ["-c"], compiled.asm["cubin"])


def _cubin_tool(tool: str, args: list[str], cubin: bytes) -> str:
    """``tool *args <cubin file>``'s output."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(
            [tool, *args, f.name], capture_output=True, text=True, check=True, timeout=300
        ).stdout


def compile_stage1(
    config: VerifyConfig,
    draft_len: int,
    kv_dtype: str,
    arch: str,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
    *,
    mask: str = "none",
    separate_v: bool = False,
    ragged: bool = False,
    paged: bool = False,
):
    """Stage 1 compiled for ``arch`` as a launch there compiles it (Triton's
    CompiledKernel). MLA takes V as a view of K unless ``separate_v`` (the
    Triton kernel then runs, as plan.for_separate_v says); other head dims a
    V cache of its own, as engines pass them. ``mask``: "none", "draft" (a custom
    mask's draft block: the Hopper kernel reads it, the Triton kernel's
    stage 1 does not) or "prefix" (its prefix bits too). ``ragged``: the
    Hopper kernel's module for calls with fewer than L drafts in some
    request; ``paged``: its module for a paged cache it loads by TMA
    (``hopper.loads_pages``). The split count and share floor are runtime
    values: any will do."""
    if not isinstance(kernel._prefix_kernel, JITFunction):  # decorated under the interpreter
        raise RuntimeError("aot: TRITON_INTERPRET is set; compile in a process without it")
    target, _ = TARGETS[arch]
    qk, v = check_head_dims(head_dims)
    mla = (qk, v) == MLA_HEAD_DIMS
    v_from_k = mla and not separate_v
    kv = "*" + _TRITON_DTYPES[kv_dtype]
    pointers = {"Q": "*bf16", "K_BUF": kv, "V_BUF": kv, "PART_O": "*fp32", "PART_LSE": "*fp32"}
    pointers |= {name: "*i32" for name in ("QO_INDPTR", "KV_INDPTR", "KV_INDICES")}
    if mask not in MASKS:
        raise ValueError(f"mask: expected one of {MASKS}, got {mask!r}")
    prefix_mask = mask == "prefix"
    score_value = runs_score_value(config.kernel, kv_dtype, (qk, v))
    on_hopper = config.kernel in HOPPER_KERNELS and arch == "sm90"
    if on_hopper and hopper.supports(draft_len, kv_dtype, v_from_k, (qk, v), score_value):
        # Without a mask the launch passes kv_indptr in the mask's place.
        pointers |= {"MASK": "*i32" if mask == "none" else "*u8", "MASK_INDPTR": "*i32"}
        return _compile_hopper_kernel(
            config,
            draft_len,
            (qk, v),
            target,
            pointers,
            score_value,
            mask != "none",
            prefix_mask,
            ragged,
            paged,
        )
    pointers |= {"MASK": "*u8" if prefix_mask else "*i32", "MASK_INDPTR": "*i32"}
    constexprs = dict(
        DRAFT_LEN=draft_len,
        BLOCK_H=config.BLOCK_H,
        BLOCK_M=rows_per_program(config.BLOCK_H, draft_len),
        BLOCK_N=config.BLOCK_N,
        BLOCK_B=kernel.PLAN_BLOCK,
        D_V=v,
        D_ROPE=qk - v,
        V_CHUNK=value_chunk(config, v),
        V_FROM_K=v_from_k,
        PREFIX_MASK=prefix_mask,
        DOT_FP32=False,
        WIDEN_BY_PTX=target.backend == "cuda",
        SPLIT_SCORES=arch == "sm90" and splits_scores(config, draft_len),
    )
    fn = kernel._prefix_kernel
    src = _signature(
        fn, pointers, {"score_scale", "v_scale"}, constexprs, _launch_aligned(fn, pointers)
    )
    return triton.compile(src, target=target, options=config.launch_options())


def problems(
    config: VerifyConfig,
    draft_len: int,
    kv_dtype: str,
    arch: str,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> list[str]:
    """Why ``config`` does not fit ``arch`` (a compile error included), in
    words; empty if it fits."""
    (found,) = resources_many([(config, draft_len, kv_dtype, arch, head_dims)])
    return [found] if isinstance(found, str) else found.problems(arch)


def fits(
    config: VerifyConfig,
    draft_len: int,
    kv_dtype: str,
    arch: str,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
) -> bool:
    """Whether ``config`` compiles for ``arch``, fits its shared memory and
    spills no register."""
    return not problems(config, draft_len, kv_dtype, arch, head_dims)


def resources_many(
    jobs: Iterable[Job], workers: int = 1, progress: str | None = None
) -> list[Resources | str]:
    """``compile_prefix_kernel`` of each job, in order, on ``workers``
    processes; a compile error comes back as its message. Jobs that differ
    only in runtime values (split count, share floor) compile once, and
    each compile is remembered for the life of the process. ``progress``:
    a progress bar of that name on stderr (compiles take seconds each)."""
    keys = [(_compile_key(c), l, d, a, tuple(dims)) for c, l, d, a, dims in jobs]
    todo = sorted(set(keys) - set(_found), key=repr)
    with tqdm(
        total=len(todo), desc=progress, unit="kernel", file=sys.stderr, disable=progress is None
    ) as bar:
        if workers > 1 and len(todo) > 1:
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                for job, found in zip(todo, pool.map(_resources_or_error, todo, chunksize=1)):
                    _found[job] = found
                    bar.update()
        else:
            for job in todo:
                _found[job] = _resources_or_error(job)
                bar.update()
    return [_found[key] for key in keys]


def _compile_key(config: VerifyConfig) -> VerifyConfig:
    return config.with_splits(1).with_min_share(None)


def _resources_or_error(job: Job) -> Resources | str:
    try:
        return compile_prefix_kernel(*job)
    except Exception as exc:  # a config that does not compile is a finding, not a crash
        return f"does not compile: {type(exc).__name__}: {str(exc)[:500]}"


def _amd_resources(compiled) -> Resources:
    text = compiled.asm["amdgcn"]
    meta = text[text.index("amdhsa.kernels:") :]  # one kernel's metadata
    fields = {k: int(v) for k, v in re.findall(r"^\s*\.(\w+):\s+(\d+)\s*$", meta, re.M)}
    return Resources(
        shared=compiled.metadata.shared,
        registers=fields["vgpr_count"],
        spills=fields["vgpr_spill_count"] + fields["sgpr_spill_count"],
        scratch=fields["private_segment_fixed_size"],
    )


def _nvidia_resources(compiled) -> Resources:
    try:
        tool = triton.knobs.nvidia.cuobjdump.path
        usage = _cubin_tool(tool, ["--dump-resource-usage"], compiled.asm["cubin"])
        registers = int(re.search(r"\bREG:(\d+)", usage).group(1))
        stack = int(re.search(r"\bSTACK:(\d+)", usage).group(1))
    except (AttributeError, OSError, subprocess.SubprocessError):  # no cuobjdump here
        registers = stack = None
    return Resources(
        shared=compiled.metadata.shared, registers=registers, spills=None, scratch=stack
    )


def _launch_aligned(fn, pointers: dict[str, str]) -> set[str]:
    """The arguments a launch finds divisible by 16, as Triton specialises
    them: the tensors (16-byte aligned) and the strides (every row width
    the kernels take is a multiple of 16). Without these hints the compiled
    kernel is not the one that runs: narrower loads, no cp.async
    pipelining, other registers, spills and shared memory."""
    names = set(pointers) | {name for name in fn.arg_names if name.startswith("stride_")}
    return names & set(fn.arg_names)


def _signature(
    fn,
    pointers: dict[str, str],
    floats: set[str],
    constexprs: dict,
    aligned: set[str] = frozenset(),
) -> ASTSource:
    # Every other argument is a 32-bit int (strides, sizes), unspecialised
    # unless named in `aligned` (divisible by 16: _launch_aligned). A
    # constexpr left out would compile as such an int, its branches then
    # taken at run time: not the kernel a launch builds.
    missing = [fn.arg_names[i] for i in fn.constexprs if fn.arg_names[i] not in constexprs]
    if missing:
        raise ValueError(f"constexprs: expected a value for each of {missing}, got none")
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
        else:
            signature[name] = "fp32" if name in floats else "i32"
    consts = {(fn.arg_names.index(k),): v for k, v in constexprs.items()}
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in aligned}
    if fn.is_gluon():  # Gluon's source class sets the module's warps before codegen
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource(fn, signature, consts, attrs)
    return ASTSource(fn, signature, consts, attrs)


def _compile_hopper_kernel(
    config: VerifyConfig,
    draft_len: int,
    head_dims: tuple[int, int],
    target,
    pointers,
    score_value: bool,
    draft_mask: bool,
    prefix_mask: bool,
    ragged: bool,
    paged: bool = False,
):
    module = hopper.gluon_kernel(head_dims, ragged, paged)
    fn = module._prefix_kernel_sm90
    # The plan's width follows the head count, a runtime value: MLA's 128
    # heads (its widest in practice).
    head_blocks = hopper.head_blocks(128, config.BLOCK_H)
    constexprs = dict(
        DRAFT_LEN=draft_len,
        BLOCK_H=config.BLOCK_H,
        BLOCK_B=kernel.PLAN_BLOCK,
        HEAD_BLOCKS=hopper.plan_width(head_blocks),
        PLAN_REQUESTS=hopper.plan_requests(head_blocks, kernel.PLAN_BLOCK),
        V_EXT_FROM_K=False,
        SCORE_VALUE=score_value,
        LAUNCH_DEPENDENTS=True,  # as on a CUDA device (kernel.dependent_launch)
        PREFIX_MASK=prefix_mask,
        DRAFT_MASK=draft_mask,
    )
    pointers = pointers | {"K_EXT": "*bf16", "V_EXT": "*bf16", "O": "*bf16"}
    if paged:  # TMA descriptors of the pool's latent and rope columns
        kv = pointers["K_BUF"][1:]
        gl_kv = module.gl.float8e4nv if kv == "fp8e4nv" else module.gl.bfloat16
        pointers |= {
            name: f"tensordesc<{kv}[{hopper.TOKENS}, {width}],{layout!r}>"
            for name, (_, width, layout) in zip(
                ("PAGE_NOPE", "PAGE_ROPE"), module.page_layouts(gl_kv)
            )
        }
    else:
        constexprs |= {"PAGE_NOPE": None, "PAGE_ROPE": None}
    src = _signature(
        fn,
        pointers,
        {"score_scale", "draft_scale", "prefix_v_scale", "draft_v_scale"},
        constexprs,
        _launch_aligned(fn, pointers),
    )
    with assembler.scope():  # the ptxas a launch assembles it with
        options = hopper.launch_options(score_value) | COMPILE_OPTIONS
        return triton.compile(src, target=target, options=options)


def compile_seesaw(draft_len: int, arch: str = "sm90", planned: bool = False):
    """The paged seesaw kernel (kernel_seesaw.py) for ``draft_len`` drafts,
    compiled for ``arch`` as a launch on a bf16 cache would build it;
    ``planned``: as a call given a step's planned metadata builds it."""
    from . import kernel_seesaw

    fn = kernel_seesaw._seesaw_kernel
    pointers = {name: "*bf16" for name in ("Q", "O")}
    pointers |= {name: "*i32" for name in ("QO_INDPTR", "KV_INDPTR", "BLOCK_TABLE", "PLAN")}
    pointers |= {"PART_O": "*fp32", "PART_LSE": "*fp32"}
    for name, (_, _, box, layout) in zip(("nope_desc", "rope_desc"), kernel_seesaw.page_layouts()):
        pointers[name] = f"tensordesc<bf16[{hopper.TOKENS}, {box}],{layout!r}>"
    constexprs = dict(
        DRAFT_LEN=draft_len,
        BLOCK_H=hopper.block_heads(128, draft_len),
        BLOCK_B=kernel.PLAN_BLOCK,
        WAIT_PRIOR=not planned,  # as on a CUDA device after the translation
        LAUNCH_DEPENDENTS=True,
        PLANNED=planned,
    )
    # A block table's row stride is any int (a launch's own table).
    aligned = _launch_aligned(fn, pointers) - {"stride_table"}
    src = _signature(fn, pointers, {"scale", "v_scale"}, constexprs, aligned)
    return triton.compile(src, target=TARGETS[arch][0], options=kernel_seesaw.LAUNCH_OPTIONS)
