"""One benchmark shape's verify call, made a few times, for a profiler to time.

    ncu --kernel-name regex:"_prefix_kernel|_merge" --launch-skip 4 --launch-count 2 \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python scripts/profile_call.py H64L4B32C16384-ragged

builds the shape's batch as ``bench.py`` does (one set, in a pool sized to
it, so not the bench's values) and makes ``--calls`` eager calls of one of
the bench's contenders (``--contender``): ``tuned``, ``verify_mla_fwd``
with the config the shipped table gives (each call: stage 1, then stage
2); ``paged``, ``verify_mla_paged`` on a ``-page<N>`` shape's pages
(``paged_step``: given the step's metadata, made once); or
``flashmla``, FlashMLA on its own 64-token pages of the same values (the
``-page64`` shape's very pages), where ``import flash_mla`` works
(``scripts/build_flashmla.py``). It times nothing itself; a profiler
beside it can, kernel by kernel:

    ncu --kernel-name regex:"_prefix_kernel|_merge|splitkv_mla|combine" \\
        --launch-skip 8 --launch-count 4 --metrics gpu__time_duration.sum \\
        python scripts/profile_call.py H8L2B64C16K-page64 --contender flashmla --calls 8

``--draft-counts`` gives every request's draft count instead of the
shape's (``4*31,3``: 31 requests of 4, then one of 3), so a ragged batch's
cost can be taken apart by count (``tuned`` only). Without a GPU it runs
under Triton's interpreter (``TRITON_INTERPRET=1``), on small shapes only.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import bench_batch  # scripts/, first on the path when run as a script
import bench_contenders
import bench_shapes
import torch

import mla_verify
from mla_verify.cli import Parser

logger = logging.getLogger("profile_call")

CONTENDERS = ("tuned", "paged", "paged_step", "flashmla")  # bench.py's names


def parse_counts(text: str) -> list[int]:
    """``4*31,3`` -> [4] * 31 + [3]: comma-separated counts, ``V*N`` for N
    requests of V drafts."""
    counts: list[int] = []
    for item in text.split(","):
        value, _, times = item.partition("*")
        try:
            counts += [int(value)] * (int(times) if times else 1)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected counts like 4*31,3, got {item!r} in {text!r}"
            ) from None
    return counts


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = Parser(prog="profile_call.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", type=bench_shapes.parse_shape, help="a bench.py shape name")
    parser.add_argument("--calls", type=int, default=4, help="calls to make (default 4)")
    parser.add_argument(
        "--draft-counts", type=parse_counts, help="e.g. 4*31,3 (default: the shape's)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the batch's seed (default 0)")
    parser.add_argument(
        "--contender",
        choices=CONTENDERS,
        default="tuned",
        help="whose calls to make (default tuned; paged needs a -page<N> shape)",
    )
    args = parser.parse_args(argv)
    spec, counts, who = args.shape, args.draft_counts, args.contender
    if args.calls < 1:
        parser.error(f"--calls: expected 1 or more, got {args.calls}")
    if counts is not None:
        if who != "tuned":
            parser.error(f"--draft-counts: expected --contender tuned, got {who}")
        if len(counts) != spec.batch_size:
            parser.error(f"--draft-counts: expected {spec.batch_size} counts, got {len(counts)}")
        if not all(1 <= e <= spec.draft_len for e in counts):
            parser.error(f"--draft-counts: expected counts in 1..{spec.draft_len}, got {counts}")
    reason = bench_contenders.not_applicable(who, spec)
    if reason is not None:
        parser.error(f"--contender {who}: {spec.name}: {reason}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    elif os.environ.get("TRITON_INTERPRET") == "1":
        device = torch.device("cpu")
    else:
        logger.error("no CUDA GPU is visible and TRITON_INTERPRET is not 1: nothing was run")
        return 2
    spec = args.shape
    prefix_lens = bench_shapes.prefix_lengths(spec)
    _, slots = bench_batch.plan_pool(
        prefix_lens, spec.draft_len, l2_bytes=0, pool_min_bytes=0, max_rotations=1
    )
    batch = bench_batch.build_batch(
        spec,
        prefix_lens,
        rotations=1,
        slots=slots,
        device=device,
        seed=args.seed,
        counts=args.draft_counts,
    )
    call = batch.sets[0]
    if args.contender == "tuned":
        out = call.new_output()
        for _ in range(args.calls):
            if not call.run(out):
                logger.error("%s: verify_mla_fwd refused the call", spec.name)
                return 1
    else:
        launch = _launch(args.contender, batch, device, args.seed)
        if isinstance(launch, str):
            logger.error("%s: %s", spec.name, launch)
            return 1
        for _ in range(args.calls):
            launch()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    counts = call.qo_indptr.diff().tolist()  # what the calls read
    logger.info(
        "%s: %d calls of %s, draft counts %s", spec.name, args.calls, args.contender, counts
    )
    return 0


def _launch(name: str, batch: bench_batch.Batch, device: torch.device, seed: int):
    """One call of the paged entry point or of FlashMLA on the batch's
    first set, as the bench makes it; or why it cannot be made."""
    if name in ("paged", "paged_step"):
        # The arch only names the config the bench would report beside the
        # call (verify_mla_paged picks its own; on the CPU the built-in one).
        arch = mla_verify.current_arch(device) if device.type == "cuda" else "sm90"
        step = name == "paged_step"
        return bench_contenders.paged_contender(batch, arch, step=step).launches[0]
    flashmla = bench_contenders.FlashMLA(enabled=True)
    if not flashmla.available:
        return flashmla.reason
    return flashmla.contender(batch, seed).launches[0]


if __name__ == "__main__":
    sys.exit(main())
