"""The contenders: how each one launches a shape's call on its batch (the
package's kernels and paged call, another revision's, the float32
reference, FlashInfer, FlashMLA, SGLang's kernel), on which kinds of call
each runs, and the check of its output against the reference."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bench_batch import ACT_DTYPE, FLASHMLA_PAGE, Batch, paged_kv_with_drafts
from bench_revisions import REV_PREFIX, REV_STEP_SUFFIX, Revision
from bench_shapes import ShapeSpec

import mla_verify
from mla_verify.config import (
    HOPPER_KERNELS,
    VerifyConfig,
    default_num_kv_splits,
    rows_per_program,
)
from mla_verify.plan import plan_call
from mla_verify.problem import kv_dtype_name
from mla_verify.testing import Q_DIM, V_DIM, VerifyBatch, check_close, relative_error

ROPE_DIM = Q_DIM - V_DIM

CONTENDERS = (
    "tuned",
    "paged",
    "paged_step",
    "paged_seesaw",
    "paged_translated",
    "default",
    "triton",
    "mha",
    "torch_ref",
    "flashinfer",
    "flashmla",
    "sglang",
)


# --- correctness ----------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    ok: bool
    rel_err: float
    max_abs_err: float
    reason: str


def check_output(out: torch.Tensor, ref: torch.Tensor) -> Check:
    """The package's test tolerance (``mla_verify.testing.check_close``):
    every element close and the whole within its relative error; NaN
    anywhere fails."""
    diff = out.float() - ref
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    try:
        return Check(True, check_close(out, ref), max_abs, "")
    except AssertionError as exc:
        return Check(False, relative_error(out, ref), max_abs, str(exc))


# --- contenders -------------------------------------------------------------------------


@dataclass
class Contender:
    """``launches[r]`` computes rotation set r; ``launches[0]`` is checked
    against the reference. ``out`` is the buffer every launch writes
    (poisoned before the check); a contender that allocates its output per
    call has none and gives ``result``, its latest output."""

    name: str
    launches: list[Callable[[], None]]
    out: torch.Tensor | None
    graphable: bool = True
    config: Any = None  # VerifyConfig for the package's kernels
    config_source: str = ""
    result: Callable[[], torch.Tensor] | None = None

    def output(self) -> torch.Tensor:
        """[bs*L, H, 512]: what the latest launch wrote."""
        return self.out if self.out is not None else self.result()


def _kernel_launches(
    batch: Batch,
    out: torch.Tensor,
    config: Any,
    fwd: Callable[..., bool] = mla_verify.verify_mla_fwd,
) -> list[Callable[[], None]]:
    def make(vb: VerifyBatch) -> Callable[[], None]:
        def launch() -> None:
            if not vb.run(out, config, fwd=fwd):
                raise RuntimeError(f"{fwd.__name__} refused the call (its gate said no)")

        return launch

    return [make(vb) for vb in batch.sets]


def triton_config(config: VerifyConfig) -> VerifyConfig:
    """``config``'s tile on the portable Triton kernel (a Hopper config's
    fields are its Triton fallback's tile too)."""
    return dataclasses.replace(config, kernel="triton", MIN_SHARE=None)


def _planned_kernel(vb: VerifyBatch, config: VerifyConfig) -> str:
    """The stage-1 kernel the package runs for this call with ``config``:
    a Hopper config runs the Triton kernel on calls the Hopper kernel does
    not take (ragged drafts, custom masks, other head dims, off sm90)."""
    plan = plan_call(
        vb.q,
        vb.k_extend,
        vb.v_extend,
        vb.k_buffer,
        vb.v_buffer,
        batch_size=vb.batch_size,
        draft_len=vb.draft_len,
        config=config,
        masked=vb.custom_mask is not None,
        skip_prefix_mask=vb.skip_prefix_custom_mask,
    )
    return config.kernel if plan.hopper or config.kernel not in HOPPER_KERNELS else "triton"


def _source(source: str, vb: VerifyBatch, config: VerifyConfig) -> str:
    kernel = _planned_kernel(vb, config)
    return source if kernel == config.kernel else f"{source}; runs on the {kernel} kernel"


def kernel_contender(name: str, batch: Batch, arch: str) -> Contender:
    """tuned (the table's config), default (the built-in one), triton (the
    portable kernel's config, ``block_config(..., kernel="triton")``) or mha
    (BLOCK_H=1)."""
    s = batch.spec
    vb = batch.sets[0]
    out = vb.new_output()
    kv_dtype = kv_dtype_name(batch.k_buffer.dtype)
    default = mla_verify.default_config(
        s.num_heads, s.draft_len, s.batch_size, arch, kv_dtype, head_dims=s.head_dims
    )
    if name in ("tuned", "triton"):
        # triton: the portable kernel's best config for the arch (its tuned
        # winner, else the built-in default), what an AMD GPU runs.
        config, source = mla_verify.resolve_config(
            s.num_heads,
            s.draft_len,
            s.batch_size,
            batch.k_buffer.dtype,
            arch,
            kernel="triton" if name == "triton" else None,
            head_dims=s.head_dims,
        )
        if name == "tuned":
            # Launched through the table (config=None), exactly as an engine does.
            launches = _kernel_launches(batch, out, None)
            return Contender(name, launches, out, True, config, _source(source, vb, config))
        launches = _kernel_launches(batch, out, config)
        return Contender(name, launches, out, True, config, source)
    if name == "default":
        launches = _kernel_launches(batch, out, default)
        return Contender(name, launches, out, True, default, _source("default_config", vb, default))
    if name == "mha":
        splits = default_num_kv_splits(
            s.num_heads, s.batch_size, 1, rows_per_program(1, s.draft_len), arch
        )
        # Always the Triton kernel: the Hopper one holds 64 rows by design.
        config = dataclasses.replace(
            triton_config(default), BLOCK_H=1, num_warps=4, NUM_KV_SPLITS=splits
        )
        launches = _kernel_launches(batch, out, config)
        return Contender(name, launches, out, True, config, "default_config, BLOCK_H=1")
    raise ValueError(f"unknown kernel contender {name!r}")


def rev_contender(rev: Revision, batch: Batch, arch: str) -> Contender:
    """``tuned`` of another revision: its own ``verify_mla_fwd`` through its
    own tables (config=None, as an engine calls it) on the same rotation
    sets; the config its own ``resolve_config`` names. With ``kernel``
    "triton": its portable kernel with its own ``resolve_config(...,
    kernel="triton")``, as the ``triton`` contender. With ``step``: its
    paged call given the step's metadata, as ``paged_step``."""
    s = batch.spec
    package = rev.module
    if s.page_size:
        return paged_contender(batch, arch, package, rev.name, f"rev:{rev.given}", step=rev.step)
    kv_dtype = batch.k_buffer.dtype
    config, source = package.resolve_config(
        s.num_heads,
        s.draft_len,
        s.batch_size,
        kv_dtype,
        arch,
        head_dims=s.head_dims,
        **({"kernel": "triton"} if rev.kernel else {}),
    )
    if batch.q.device.type == "cuda":  # its own workspace, before capture
        package.prepare_workspace(
            s.batch_size,
            s.num_heads,
            s.draft_len,
            kv_dtype,
            device=batch.q.device,
            head_dims=s.head_dims,
        )
    out = batch.sets[0].new_output()
    launches = _kernel_launches(batch, out, config if rev.kernel else None, package.verify_mla_fwd)
    return Contender(rev.name, launches, out, True, config, f"{source}; rev:{rev.given}")


def paged_contender(
    batch: Batch,
    arch: str,
    package=mla_verify,
    name: str = "paged",
    given: str = "",
    seesaw: bool | None = None,
    step: bool = False,
) -> Contender:
    """``verify_mla_paged`` (this package's, or a revision's for ``rev:``
    contenders) on each rotation set's paged cache (``batch.paged``: the
    token-indexed contenders' values, drafts as each sequence's last L
    positions); the tables' config, as ``tuned``. ``seesaw``: None, the
    package's rule (``paged.seesaw_shape``); True, the seesaw kernel at
    every batch size where it can serve the call; False, never (the
    translated call). The rule is set while each launch is captured.
    ``step``: each set's ``paged_metadata`` (for the shape's heads) made
    once, outside the timed call, and passed to it, as FlashMLA's
    scheduling metadata is (an engine makes it once a step for all its
    layers)."""
    s = batch.spec
    bs, L, H = s.batch_size, s.draft_len, s.num_heads
    q = batch.q.view(bs, L, H, Q_DIM)
    out = batch.sets[0].new_output()  # [bs*L, H, 512]
    out4 = out.view(bs, L, H, V_DIM)
    config, source = package.resolve_config(H, L, bs, batch.k_buffer.dtype, arch)

    def forced_rule(batch_size: int) -> bool:
        # One function for every launch: the package keeps a call's host
        # work per rule in force (mla_verify.prepared).
        return seesaw

    def make(kv_cache: torch.Tensor, block_table: torch.Tensor, seqlens: torch.Tensor):
        step_args = {}
        if step:
            step_args["metadata"] = package.paged_metadata(
                kv_cache, block_table, seqlens, L, num_heads=H
            )

        def launch() -> None:
            package.verify_mla_paged(
                q, kv_cache, block_table, seqlens, sm_scale=batch.sm_scale, out=out4, **step_args
            )

        def launch_ruled() -> None:
            paged = mla_verify.paged
            rule = paged.seesaw_shape
            paged.seesaw_shape = forced_rule
            try:
                launch()
            finally:
                paged.seesaw_shape = rule

        return launch if seesaw is None else launch_ruled

    return Contender(
        name,
        [make(*cache) for cache in batch.paged],
        out,
        True,
        config,
        "; ".join(
            filter(
                None,
                (
                    source,
                    f"verify_mla_paged, {s.page_size}-token pages",
                    "the step's metadata made once" if step else "",
                    given,
                ),
            )
        ),
    )


def torch_ref_contender(batch: Batch) -> Contender:
    vb = batch.sets[0]
    out = torch.empty(
        vb.q.shape[0], vb.num_heads, vb.v_buffer.shape[-1], dtype=torch.float32, device=vb.q.device
    )

    def launch() -> None:
        out.copy_(vb.reference())

    return Contender("torch_ref", [launch], out, graphable=False, config_source="reference")


class FlashInfer:
    """FlashInfer's MLA wrapper (fa3), if importable; ``reason`` says why not."""

    def __init__(self, enabled: bool, device: torch.device | None) -> None:
        self.module: Any = None
        self.version = "n/a"
        self.reason = ""
        self._workspace: torch.Tensor | None = None
        if not enabled:
            self.reason = "disabled by --no-flashinfer"
            return
        try:
            import flashinfer
            import flashinfer.mla
        except Exception as exc:  # any import failure means: skip it
            self.reason = f"import flashinfer failed: {type(exc).__name__}: {exc}"
            return
        self.version = getattr(flashinfer, "__version__", "unknown")
        if device is not None and device.type == "cuda" and not torch.version.hip:
            major, minor = torch.cuda.get_device_capability(device)
            if (major, minor) != (9, 0):
                self.reason = f"the fa3 backend needs sm90; this GPU is sm{major}{minor}"
                return
        self.module = flashinfer

    @property
    def available(self) -> bool:
        return self.module is not None and not self.reason

    def disable(self, reason: str) -> None:
        self.reason = reason

    def contender(self, batch: Batch) -> Contender:
        """One planned wrapper per rotation set (planning is outside timing);
        the drafts are the last L pages of each request, so FlashInfer's
        causal mask (aligned to the end of the KV) is the verify mask."""
        s = batch.spec
        device = batch.q.device
        if self._workspace is None or self._workspace.device != device:
            self._workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)
        q_nope = batch.q[..., :V_DIM]
        q_pe = batch.q[..., V_DIM:]
        ckv = batch.k_buffer[..., :V_DIM]  # [slots, 1, 512], page size 1
        kpe = batch.k_buffer[..., V_DIM:]  # [slots, 1, 64]
        out = torch.empty(
            s.batch_size * s.draft_len, s.num_heads, V_DIM, dtype=ACT_DTYPE, device=device
        )
        wrappers = []
        for fi_indices in batch.fi_kv_indices:
            wrapper = self.module.mla.BatchMLAPagedAttentionWrapper(self._workspace, backend="fa3")
            wrapper.plan(
                batch.qo_indptr,
                batch.fi_kv_indptr,
                fi_indices,
                batch.fi_kv_lens,
                num_heads=s.num_heads,
                head_dim_ckv=V_DIM,
                head_dim_kpe=ROPE_DIM,
                page_size=1,
                causal=True,
                sm_scale=batch.sm_scale,
                q_data_type=batch.q.dtype,
                kv_data_type=batch.k_buffer.dtype,
            )
            wrappers.append(wrapper)

        def make(wrapper: Any) -> Callable[[], None]:
            return lambda: wrapper.run(q_nope, q_pe, ckv, kpe, out=out)

        return Contender(
            "flashinfer",
            [make(w) for w in wrappers],
            out,
            config_source=f"flashinfer {self.version} fa3",
        )


class FlashMLA:
    """FlashMLA's dense decode (``flash_mla_with_kvcache``, SM90), used only
    where ``import flash_mla`` succeeds; ``reason`` says why not. This
    project ships no FlashMLA code: ``scripts/build_flashmla.py`` builds
    the bf16 dense decode in a FlashMLA checkout fetched outside it and
    prints the PYTHONPATH that puts that checkout's ``flash_mla`` here."""

    def __init__(self, enabled: bool) -> None:
        self.module: Any = None
        self.version = "n/a"
        self.reason = ""
        if not enabled:
            self.reason = "not among --contenders"
            return
        try:
            import flash_mla
        except Exception as exc:  # not installed, or built for another GPU
            self.reason = (
                f"import flash_mla failed: {type(exc).__name__}: {exc} "
                "(scripts/build_flashmla.py builds it)"
            )
            return
        self.module = flash_mla
        self.version = getattr(flash_mla, "__version__", "unknown")

    @property
    def available(self) -> bool:
        return self.module is not None

    def contender(self, batch: Batch, seed: int) -> Contender:
        """Each rotation set's KV copied into a 64-token-page cache of its
        own (pages scattered), the drafts' K appended to each sequence: on
        -page64 rows the very caches ``paged`` reads (``batch.paged``);
        scheduling metadata made once per batch, outside the timed call
        (every set has the same lengths). FlashMLA allocates its output
        per call, so it cannot be poisoned before the check."""
        s = batch.spec
        bs, L, H = s.batch_size, s.draft_len, s.num_heads
        q = batch.q.view(bs, L, H, Q_DIM)
        if s.page_size == FLASHMLA_PAGE:
            caches = batch.paged
        else:
            gen = torch.Generator(device=batch.q.device)
            gen.manual_seed(seed)
            caches = [
                paged_kv_with_drafts(
                    vb.k_buffer, vb.kv_indptr, vb.kv_indices, vb.k_extend, L, scatter=gen
                )
                for vb in batch.sets
            ]
        cache_seqlens = caches[0][2]
        # (metadata, splits) in FlashMLA's first interface; (metadata, None)
        # in the later one, which plans on its first call.
        metadata, num_splits = self.module.get_mla_metadata(cache_seqlens, L * H, 1)
        latest: dict[str, torch.Tensor] = {}

        def make(kv_cache: torch.Tensor, block_table: torch.Tensor) -> Callable[[], None]:
            def launch() -> None:
                latest["out"] = self.module.flash_mla_with_kvcache(
                    q,
                    kv_cache,
                    block_table,
                    cache_seqlens,
                    V_DIM,
                    metadata,
                    num_splits,
                    softmax_scale=batch.sm_scale,
                    causal=True,
                )[0]

            return launch

        return Contender(
            "flashmla",
            [make(kv_cache, block_table) for kv_cache, block_table, _ in caches],
            None,
            config_source=f"flash_mla {self.version}, {FLASHMLA_PAGE}-token pages",
            result=lambda: latest["out"].view(bs * L, H, V_DIM),
        )


SGLANG_VERIFY = Path("sglang/kernels/ops/attention/verify_mla.py")
# Pool elements SGLang's kernel can address: it computes slot x row stride
# in int32 (kv_indices' type).
SGLANG_MAX_POOL = 2**31


class SGLangVerify:
    """SGLang's grouped-head verify kernel, the one this package grew from
    (``verify_shared_kv_fwd`` of ``verify_mla.py``: 4 heads a program,
    BLOCK_N 64, 8 warps, 1 stage, ``512 // (batch x head blocks)`` splits
    up to 32), used only where ``--sglang-src`` names an SGLang checkout's
    ``python`` folder. This project ships no SGLang code: the file is read
    from that checkout alone (``load_sglang_verify``), so its version is
    the file's hash."""

    def __init__(self, enabled: bool, src: Path | None = None) -> None:
        self.fwd: Callable[..., bool] | None = None
        self.version = "n/a"
        self.reason = ""
        if not enabled:
            self.reason = "not among --contenders"
            return
        if src is None:
            self.reason = f"--sglang-src not given (a folder holding {SGLANG_VERIFY})"
            return
        path = src / SGLANG_VERIFY
        try:
            self.fwd = load_sglang_verify(path)
        except Exception as exc:  # missing, or not the file this loader knows
            self.reason = f"loading {path} failed: {type(exc).__name__}: {exc}"
            return
        self.version = f"verify_mla.py sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"

    @property
    def available(self) -> bool:
        return self.fwd is not None

    def contender(self, batch: Batch) -> Contender:
        """Called as SGLang's verify launcher calls it, with the arguments
        ``verify_mla_fwd`` gets (it has the same convention)."""
        fwd = self.fwd

        @functools.wraps(fwd)  # its name in a refusal's message
        def sglang_fwd(*args: Any, config: Any = None, **kwargs: Any) -> bool:
            return fwd(*args, **kwargs)

        out = batch.sets[0].new_output()
        launches = _kernel_launches(batch, out, None, fwd=sglang_fwd)
        return Contender("sglang", launches, out, True, None, f"SGLang {self.version}")


def load_sglang_verify(path: Path) -> Callable[..., bool]:
    """``verify_shared_kv_fwd`` of SGLang's ``verify_mla.py`` at ``path``,
    loaded alone. It imports two SGLang names, which are given the values
    SGLang itself gives them on an NVIDIA GPU: ``dot_in_kv_dtype`` True (it
    is False only for fp8 pools on gfx950) and ``_AMD_LAUNCH_KWARGS`` empty
    (set only on ROCm); the rest of SGLang then need not be importable.
    ``sys.modules`` is left as it was."""
    package = "sglang.kernels.ops.attention"
    given = {
        f"{package}.fp8_dot_support": {"dot_in_kv_dtype": lambda kv_dtype, width: True},
        f"{package}.verify_splitkv": {"_AMD_LAUNCH_KWARGS": {}},
    }
    names = ["sglang", "sglang.kernels", "sglang.kernels.ops", package, *given]
    saved = {name: sys.modules.get(name) for name in names}
    try:
        for name in names:
            module = types.ModuleType(name)
            module.__path__ = []  # a package, so that the names below it resolve
            module.__dict__.update(given.get(name, {}))
            sys.modules[name] = module
        spec = importlib.util.spec_from_file_location("mla_verify_bench_sglang_verify", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module.verify_shared_kv_fwd


# --- where each runs --------------------------------------------------------------------


# verify_mla_paged as shipped, given its step's metadata, with the seesaw
# kernel forced on, and off: paged_contender's (seesaw, step).
PAGED_CALLS = {
    "paged": (None, False),
    "paged_step": (None, True),
    "paged_seesaw": (True, False),
    "paged_translated": (False, False),
}
PAGED_CONTENDERS = (*PAGED_CALLS, "tuned", "flashmla")


# The contenders timed on bf16 KV alone (their builds or their gates).
BF16_ONLY = {"flashinfer": "FlashInfer", "flashmla": "FlashMLA", "sglang": "SGLang's kernel"}


def not_applicable(name: str, spec: ShapeSpec) -> str | None:
    """Why contender ``name`` does not run on ``spec``'s kind of call, or
    None. FlashInfer and FlashMLA compute plain shapes only (MLA 576/512,
    every request L causal drafts); -page rows compare the paged entry
    point with the token-indexed one on the same values, and FlashMLA at
    page 64; tree, ragged and head-dim rows the package's kernels and the
    reference, head-dim rows SGLang's kernel too (every request L causal
    drafts). A ``rev:`` contender runs where ``tuned`` does, and a
    ``rev:...:step`` one where ``paged_step`` does."""
    if name.startswith(REV_PREFIX):
        name = "paged_step" if name.endswith(REV_STEP_SUFFIX) else "tuned"
    kind = ", ".join(
        what
        for what, on in (
            (f"head dims {spec.head_dims[0]}/{spec.head_dims[1]}", not spec.mla),
            ("ragged drafts", spec.ragged),
            (f"{spec.mask} mask", spec.mask != "causal"),
            ("int64 kv_indices", spec.int64_indices),
        )
        if on
    )
    if spec.kv_dtype != "bf16" and name in BF16_ONLY:
        return f"this benchmark times {BF16_ONLY[name]} on bf16 KV only"
    if spec.page_size:
        if name not in PAGED_CONTENDERS:
            return f"-page rows time {', '.join(PAGED_CONTENDERS)}"
        if name == "flashmla" and spec.page_size != FLASHMLA_PAGE:
            return f"FlashMLA's dense decode reads {FLASHMLA_PAGE}-token pages"
        if name == "paged_seesaw" and spec.page_size % 64:
            return "the seesaw kernel reads pages of a multiple of 64 tokens"
        return None
    if name in PAGED_CALLS:
        return "only on -page<N> rows"
    if kind and name in ("flashinfer", "flashmla", "mha"):
        return f"not this call ({kind})"
    if name == "sglang" and (spec.ragged or spec.mask != "causal"):
        # Its gate refuses ragged drafts; it reads no mask (causal only).
        return f"not this call ({kind})"
    return None
