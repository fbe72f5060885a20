"""``python -m mla_verify``: run the kernel end to end on a generated batch,
check it against the float32 reference, say which config it used, and end
with a PASS or FAIL line (exit status 0 or 1).

On a GPU the batch is real-size and the call is timed (CUDA-graph replays);
without one, a tiny batch runs through Triton's CPU interpreter.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from mla_verify.cli import Parser

# (GPU, CPU) defaults: the CPU interpreter runs one program at a time.
DEFAULTS = {"heads": (16, 8), "draft_len": (4, 4), "batch_size": (32, 2), "context": (16384, 100)}
# make_batch's kv_indices are int32.
MAX_TOKENS = 2**31 - 1


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m mla_verify", description=__doc__)

    def option(name: str, what: str) -> None:
        gpu, cpu = DEFAULTS[name.replace("-", "_")]
        p.add_argument(
            f"--{name}",
            type=int,
            default=None,
            help=f"{what} (default {gpu} on a GPU, {cpu} on CPU)",
        )

    option("heads", "per-rank query heads H")
    option("draft-len", "drafts per request L")
    option("batch-size", "requests in the batch")
    option("context", "prefix tokens per request, 0 included")
    p.add_argument(
        "--kv-dtype", choices=["bf16", "fp8_e4m3"], default="bf16", help="KV cache dtype"
    )
    p.add_argument(
        "--head-dims",
        default="576x512",
        help="q/k x v head dims: 576x512 (absorbed MLA, V a view of K; the default), "
        "256 or 128 (one shared KV head, V a cache of its own, as SGLang passes it)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random batch (default 0)")
    return p


def _sizes(p: argparse.ArgumentParser, args: argparse.Namespace, on_gpu: bool) -> list[int]:
    """[heads, draft_len, batch_size, context]: the given ones checked
    against the supported ranges, the others the defaults (and the seed
    checked)."""
    from mla_verify import problem

    sizes = {
        name: DEFAULTS[name][0 if on_gpu else 1] if value is None else value
        for name, value in ((name, getattr(args, name)) for name in DEFAULTS)
    }
    ranges = {
        "heads": (problem.MIN_HEADS, problem.MAX_HEADS),
        "draft_len": (problem.MIN_DRAFT_LEN, problem.MAX_DRAFT_LEN),
        "batch_size": (problem.MIN_BATCH_SIZE, problem.MAX_BATCH_SIZE),
    }
    try:
        for name, (low, high) in ranges.items():
            problem.check_range(f"--{name.replace('_', '-')}", sizes[name], low, high)
        high = MAX_TOKENS // sizes["batch_size"]
        problem.check_range("--context", sizes["context"], 0, high)
        problem.check_range("--seed", args.seed, 0, 2**63 - 1)  # torch's seed range
    except ValueError as exc:
        p.error(str(exc))
    return list(sizes.values())


def _head_dims(p: argparse.ArgumentParser, text: str) -> tuple[int, int]:
    from mla_verify import problem

    try:
        return problem.parse_head_dims(text)
    except ValueError as exc:
        p.error(f"--head-dims: {exc}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = _parser()
    args = p.parse_args(argv)
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton picks the interpreter when it decorates the kernels, at
        # import: start again with it switched on.
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "mla_verify", *argv])

    heads, draft_len, bs, context = _sizes(p, args, on_gpu)
    head_dims = _head_dims(p, args.head_dims)

    import mla_verify
    from mla_verify.testing import ATOL, MAX_RELATIVE_ERROR, RTOL, check_close, make_batch

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    kv_dtype = mla_verify.problem.kv_dtype_from_name(args.kv_dtype)
    device = "cuda" if on_gpu else "cpu"

    batch = make_batch(
        heads,
        draft_len,
        [context] * bs,
        kv_dtype=kv_dtype,
        device=device,
        seed=args.seed,
        head_dims=head_dims,
        separate_v=head_dims != mla_verify.problem.MLA_HEAD_DIMS,  # as SGLang passes V
    )
    if on_gpu:
        arch = mla_verify.current_arch()
        config, source = mla_verify.resolve_config(
            heads, draft_len, bs, kv_dtype, arch, head_dims=head_dims
        )
    else:  # what verify_mla_fwd uses in the interpreter: there is no GPU to tune for
        arch = "cpu"
        config = mla_verify.default_config(heads, draft_len, bs, arch, head_dims=head_dims)
        source = "built-in default (CPU interpreter)"
    where = torch.cuda.get_device_name() if on_gpu else "CPU (Triton interpreter)"
    dims = "{}/{}".format(*head_dims)
    print(f"device   {where}, arch {arch}")
    print(
        f"shape    H={heads} L={draft_len} batch={bs} context={context} kv={args.kv_dtype} "
        f"head dims {dims}"
    )
    print(f"config   {config.to_dict()}")
    print(f"source   {source}")
    out = batch.new_output()
    if not batch.run(out):  # every size was checked above: a bug if it happens
        print("FAIL     verify_mla_fwd refused the call (can_handle is False)")
        return 1
    tolerance = (
        f"at most {MAX_RELATIVE_ERROR:.0e}; each element within {ATOL:.0e} + {RTOL:.0e} |ref|"
    )
    try:
        err = check_close(out, batch.reference())
    except AssertionError as exc:
        print(f"FAIL     {exc} against the float32 reference ({tolerance}; seed {args.seed})")
        return 1
    if on_gpu:
        import triton.testing

        mla_verify.prepare_workspace(bs, heads, draft_len, kv_dtype, head_dims=head_dims)
        ms = triton.testing.do_bench_cudagraph(
            lambda: batch.run(out), rep=100, return_mode="median"
        )
        columns = mla_verify.problem.kv_columns(head_dims)
        kv_bytes = bs * context * columns * batch.k_buffer.element_size()
        print(
            f"time     {ms * 1e3:.1f} us (CUDA-graph replays, median), "
            f"prefix KV read at {kv_bytes / ms / 1e6:.0f} GB/s"
        )
    print(
        f"PASS     relative error {err:.2e} against the float32 reference "
        f"({tolerance}; seed {args.seed})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
