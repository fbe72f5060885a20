"""``python -m mla_verify``: run the kernel end to end on a generated batch,
check it against the float32 reference, and say which config it used.

On a GPU the batch is real-size and the call is timed (CUDA-graph replays);
without one, a tiny batch runs through Triton's CPU interpreter.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mla_verify", description=__doc__)
    p.add_argument("--heads", type=int, default=None, help="per-rank query heads")
    p.add_argument("--draft-len", type=int, default=None, help="drafts per request (L)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--context", type=int, default=None, help="prefix tokens per request")
    p.add_argument("--kv-dtype", choices=["bf16", "fp8_e4m3"], default="bf16")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton picks the interpreter when it decorates the kernels, at
        # import: start again with it switched on.
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "mla_verify", *sys.argv[1:]])

    import mla_verify
    from mla_verify.testing import check_close, make_batch

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    heads = args.heads or (16 if on_gpu else 8)
    draft_len = args.draft_len or 4
    bs = args.batch_size or (32 if on_gpu else 2)
    context = args.context or (16384 if on_gpu else 100)
    kv_dtype = mla_verify.problem.kv_dtype_from_name(args.kv_dtype)
    device = "cuda" if on_gpu else "cpu"

    batch = make_batch(heads, draft_len, [context] * bs, kv_dtype=kv_dtype, device=device)
    if on_gpu:
        arch = mla_verify.current_arch()
        config, source = mla_verify.resolve_config(heads, draft_len, bs, kv_dtype, arch)
    else:  # what verify_mla_fwd uses in the interpreter: there is no GPU to tune for
        arch = "cpu"
        config = mla_verify.default_config(heads, draft_len, bs, arch)
        source = "built-in default (CPU interpreter)"
    out = batch.new_output()
    if not batch.run(out):
        print("verify_mla_fwd refused this shape (can_handle is False)")
        return 1
    err = check_close(out, batch.reference())

    where = torch.cuda.get_device_name() if on_gpu else "CPU (Triton interpreter)"
    print(f"device   {where}, arch {arch}")
    print(f"shape    H={heads} L={draft_len} batch={bs} context={context} kv={args.kv_dtype}")
    print(f"config   {config.to_dict()}")
    print(f"source   {source}")
    print(f"error    {err:.2e} relative to the float32 reference (bf16 tolerance)")
    if on_gpu:
        import triton.testing

        mla_verify.prepare_workspace(bs, heads, draft_len, kv_dtype)
        ms = triton.testing.do_bench_cudagraph(
            lambda: batch.run(out), rep=100, return_mode="median"
        )
        kv_bytes = bs * context * 576 * batch.k_buffer.element_size()
        print(
            f"time     {ms * 1e3:.1f} us (CUDA-graph replays, median), "
            f"prefix KV read at {kv_bytes / ms / 1e6:.0f} GB/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
