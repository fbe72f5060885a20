"""Ahead-of-time compilation of the kernels for a GPU that is not present.

Triton compiles for any target on a CPU-only machine, so CI can check that
every config of a shipped table compiles for its arch and fits its shared
memory (LDS on AMD) without the hardware.
"""

from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import hopper, kernel
from .config import HOPPER_KERNELS, VerifyConfig, rows_per_program, runs_score_value
from .problem import MLA_HEAD_DIMS, check_head_dims

# arch -> (Triton target, shared memory per block in bytes)
TARGETS: dict[str, tuple[GPUTarget, int]] = {
    "sm90": (GPUTarget("cuda", 90, 32), 232448),
    "gfx942": (GPUTarget("hip", "gfx942", 64), 65536),
    "gfx950": (GPUTarget("hip", "gfx950", 64), 163840),
}
_TRITON_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp8_e4m3": "fp8e4nv", "fp8_e4m3fnuz": "fp8e4b8"}


def _signature(
    fn,
    pointers: dict[str, str],
    floats: set[str],
    constexprs: dict,
    aligned: set[str] = frozenset(),
) -> ASTSource:
    # Every other argument is a 32-bit int (strides, sizes), unspecialised
    # unless named in `aligned` (divisible by 16, as Triton specialises the
    # KV row stride of 576 at launch).
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


def compile_prefix_kernel(
    config: VerifyConfig,
    draft_len: int,
    kv_dtype: str,
    arch: str,
    head_dims: tuple[int, int] = MLA_HEAD_DIMS,
    *,
    prefix_mask: bool = False,
) -> int:
    """Compile stage 1 for ``arch``; returns its shared memory in bytes.
    Raises on a compile error. MLA takes V as a view of K; other head dims
    a V cache of its own, as engines pass them. ``prefix_mask``: the
    variant that reads a custom mask's prefix bits."""
    target, _ = TARGETS[arch]
    qk, v = check_head_dims(head_dims)
    mla = (qk, v) == MLA_HEAD_DIMS
    kv = "*" + _TRITON_DTYPES[kv_dtype]
    pointers = {"Q": "*bf16", "K_BUF": kv, "V_BUF": kv, "PART_O": "*fp32", "PART_LSE": "*fp32"}
    pointers |= {name: "*i32" for name in ("QO_INDPTR", "KV_INDPTR", "KV_INDICES")}
    # Without a mask the launch passes kv_indptr in the mask's place.
    pointers |= {"MASK": "*u8" if prefix_mask else "*i32", "MASK_INDPTR": "*i32"}
    constexprs = dict(
        DRAFT_LEN=draft_len,
        BLOCK_H=config.BLOCK_H,
        BLOCK_M=rows_per_program(config.BLOCK_H, draft_len),
        BLOCK_N=config.BLOCK_N,
        BLOCK_B=kernel.PLAN_BLOCK,
        D_V=v,
        D_ROPE=qk - v,
        V_FROM_K=mla,
        PREFIX_MASK=prefix_mask,
        DOT_FP32=False,
    )
    on_hopper = config.kernel in HOPPER_KERNELS and arch == "sm90"
    if on_hopper and mla and not prefix_mask and kv_dtype in hopper.KV_DTYPES:
        score_value = runs_score_value(config.kernel, kv_dtype)
        return _compile_hopper_kernel(config, draft_len, target, pointers, score_value)
    src = _signature(kernel._prefix_kernel, pointers, {"score_scale", "v_scale"}, constexprs)
    compiled = triton.compile(src, target=target, options=config.launch_options())
    return compiled.metadata.shared


def _compile_hopper_kernel(
    config: VerifyConfig, draft_len: int, target, pointers, score_value: bool
) -> int:
    fn = hopper.gluon_kernel()._prefix_kernel_sm90
    constexprs = dict(
        DRAFT_LEN=draft_len,
        BLOCK_H=config.BLOCK_H,
        BLOCK_B=kernel.PLAN_BLOCK,
        V_EXT_FROM_K=False,
        SCORE_VALUE=score_value,
        LAUNCH_DEPENDENTS=True,  # as on a CUDA device (kernel.dependent_launch)
    )
    pointers = pointers | {"K_EXT": "*bf16", "V_EXT": "*bf16", "O": "*bf16"}
    aligned = set(pointers) | {name for name in fn.arg_names if name.startswith("stride_")}
    src = _signature(
        fn,
        pointers,
        {"score_scale", "draft_scale", "v_scale"},
        constexprs,
        aligned & set(fn.arg_names),
    )
    options = hopper.launch_options(score_value)
    return triton.compile(src, target=target, options=options).metadata.shared
