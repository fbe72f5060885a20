"""The benchmark's shapes: the spec language (``H16L4B32C16K-tree``), the
shape sets, each shape's prefix lengths and draft counts, and the work
(bytes moved, FLOPs) its call does."""

from __future__ import annotations

import dataclasses
import math
import random
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mla_verify.paged import PAGE_SIZES
from mla_verify.problem import kv_columns
from mla_verify.testing import Q_DIM, V_DIM

ELEM = 2  # bytes of a bf16 element


@dataclass(frozen=True)
class KVCacheDtype:
    """A KV cache dtype a shape can name, by the suffix of its spec."""

    torch_dtype: torch.dtype
    bytes: int
    suffix: str


KV_CACHE_DTYPES = {
    "bf16": KVCacheDtype(torch.bfloat16, 2, ""),
    "fp8_e4m3": KVCacheDtype(torch.float8_e4m3fn, 1, "-fp8"),
}

QUICK_SHAPES = (
    "H8L2B64C65536",  # memory-bound, H*L = 16
    "H8L2B8C2048",  # small, short contexts
    "H16L4B64C16384",  # H*L = 64, at the ridge
    "H16L4B32Rlognormal16384",  # ragged: lognormal lengths
    "H16L4B64Rlong65536x512",  # ragged: one long request among short ones
    "H16L4B1C16384",  # one request
    "H64L4B32C16384",  # compute-bound, H*L = 256
    "H64L4B8Rlognormal16384",
    "H128L2B32C16384",  # compute-bound, H*L = 256
    "H128L4B32C16384",  # compute-bound, H*L = 512
    "H128L4B1C65536",  # one long request, many heads
    "H128L4B64C2048",
)
# Every kind of call besides the plain one, next to the plain rows it is
# compared with (the same shape and values): tree masks and ragged drafts
# (issue 25: within 10% of the plain row's efficiency), ordinary attention
# at 256/256 for 16/8/4 local heads (Qwen3.5 at TP 2/4/8), and the paged
# entry point at page 64 (against FlashMLA on the same pages) and page 1
# (against the token-indexed call on the same values; issue 26). The plain
# rows of H16L4B32C16K and H128L4B32C16K are their -page rows' `tuned`.
EXTRA_SHAPES = (
    "H64L4B32C16384",  # the plain row of the H64 tree/ragged rows
    "H16L4B32C16384-tree",
    "H16L4B32C16384-treefull",  # the prefix mask bits read: their cost against -tree
    "H16L4B32C16384-ragged",
    "H64L4B32C16384-tree",
    "H64L4B32C16384-ragged",
    "H128L4B32C16384-ragged-tree",
    "H4L4B32C16384-d256",
    "H8L4B32C16384-d256",
    "H16L4B32C16384-d256",
    "H16L4B32C16384-page64",
    "H16L4B32C16384-page1",
    "H128L4B32C16384-page64",
    "H128L4B32C16384-page1",
    "H8L2B64C65536-page64",
    "H8L2B64C65536-page1",
    "H8L2B64C65536-i64",  # int64 kv_indices against the -page rows' tuned (int32)
    "H128L4B32C16384-i64",
)
GRID_HEADS = (8, 16, 32, 64, 128)
GRID_DRAFTS = (1, 2, 4, 8)
GRID_BATCHES = (1, 8, 32, 64)
GRID_CONTEXTS = (2048, 16384, 65536)
LONG_CTX, SHORT_CTX = 65536, 512


# --- shapes -------------------------------------------------------------------------


MLA_DIMS = (Q_DIM, V_DIM)  # absorbed MLA: q/k 576 (512 latent + 64 rope), v 512
HEAD_DIM_SUFFIXES = {(256, 256): "-d256", (128, 128): "-d128"}  # ordinary attention, V = K
MASKS = {"causal": "", "tree": "-tree", "treefull": "-treefull"}


@dataclass(frozen=True)
class ShapeSpec:
    """One benchmark shape. ``ctx`` is the uniform length, the lognormal
    mean, or the long request's length; ``short`` only for kind 'long'.

    The call's kind, each from a suffix of the spec: ``head_dims`` (q/k, v);
    ``ragged``: request b has E_b drafts, 1..L (``draft_counts``);
    ``mask``: 'causal' (no custom mask), 'tree' (SGLang's tree mask, the
    prefix visible: skip_prefix_custom_mask=True) or 'treefull' (the same
    tree, every prefix bit set and read); ``int64_indices``: the
    token-indexed call's ``kv_indices`` in int64, as engines whose pools
    pass 2^31 elements may give them; ``page_size``: 0 for the
    token-indexed entry point, else the paged one's page."""

    num_heads: int
    draft_len: int
    batch_size: int
    kind: str  # 'uniform' | 'lognormal' | 'long'
    ctx: int
    short: int = SHORT_CTX
    kv_dtype: str = "bf16"  # a key of KV_CACHE_DTYPES
    head_dims: tuple[int, int] = MLA_DIMS
    ragged: bool = False
    mask: str = "causal"  # a key of MASKS
    int64_indices: bool = False
    page_size: int = 0

    @property
    def name(self) -> str:
        head = f"H{self.num_heads}L{self.draft_len}B{self.batch_size}"
        if self.kind == "uniform":
            lens = f"C{self.ctx}"
        elif self.kind == "lognormal":
            lens = f"Rlognormal{self.ctx}"
        else:
            lens = f"Rlong{self.ctx}x{self.short}"
        return (
            head
            + lens
            + HEAD_DIM_SUFFIXES.get(self.head_dims, "")
            + ("-ragged" if self.ragged else "")
            + MASKS[self.mask]
            + ("-i64" if self.int64_indices else "")
            + (f"-page{self.page_size}" if self.page_size else "")
            + KV_CACHE_DTYPES[self.kv_dtype].suffix
        )

    @property
    def kv_bytes(self) -> int:
        """Bytes of one KV cache element."""
        return KV_CACHE_DTYPES[self.kv_dtype].bytes

    @property
    def mla(self) -> bool:
        return self.head_dims == MLA_DIMS

    @property
    def plain(self) -> bool:
        """Absorbed MLA, every request L causal drafts, int32 indices: the
        call FlashInfer and FlashMLA compute too."""
        return self.mla and not self.ragged and self.mask == "causal" and not self.int64_indices


_SPEC_RE = re.compile(
    r"^H(\d+)L(\d+)B(\d+)"
    r"(?:C(\d+K?)|Rlognormal(\d+K?)|Rlong(\d+K?)(?:x(\d+K?))?)"
    r"((?:-[a-z0-9]+)*)$",
    re.IGNORECASE,
)
SUFFIXES = (
    "-d256, -d128, -ragged, -tree, -treefull, -i64, -page{"
    + ",".join(map(str, PAGE_SIZES))
    + "}, -fp8"
)


def _length(text: str) -> int:
    text = text.upper()
    return int(text[:-1]) * 1024 if text.endswith("K") else int(text)


def _suffixes(text: str, given: str) -> dict[str, Any]:
    """The ShapeSpec fields a spec's suffixes set, in any order, each once."""
    fields: dict[str, Any] = {}
    set_by: dict[str, str] = {}  # field -> the suffix that set it
    for token in given.lower().split("-")[1:]:
        suffix = f"-{token}"
        if suffix == "-fp8":
            field_name, value = "kv_dtype", "fp8_e4m3"
        elif suffix in HEAD_DIM_SUFFIXES.values():
            field_name = "head_dims"
            value = next(d for d, x in HEAD_DIM_SUFFIXES.items() if x == suffix)
        elif suffix == "-ragged":
            field_name, value = "ragged", True
        elif suffix in ("-tree", "-treefull"):
            field_name, value = "mask", token
        elif suffix == "-i64":
            field_name, value = "int64_indices", True
        elif re.fullmatch(r"page\d+", token) and int(token[4:]) in PAGE_SIZES:
            field_name, value = "page_size", int(token[4:])
        else:
            raise ValueError(f"shape {text!r}: unknown suffix {suffix!r}; expected {SUFFIXES}")
        if field_name in set_by:
            what = "given twice" if set_by[field_name] == suffix else f"with {set_by[field_name]}"
            raise ValueError(f"shape {text!r}: {suffix} {what} (one {field_name} a shape)")
        fields[field_name], set_by[field_name] = value, suffix
    return fields


def parse_shape(text: str) -> ShapeSpec:
    """``H16L4B32C16384`` / ``H16L4B32Rlognormal16384`` / ``H16L4B64Rlong65536x512``,
    then optional suffixes in any order (``-d256``, ``-ragged``, ``-tree``,
    ``-page64``, ``-fp8``, ...; see the module docstring)."""
    m = _SPEC_RE.match(text.strip())
    if m is None:
        raise ValueError(
            f"shape {text!r}: expected H<heads>L<drafts>B<batch> then C<ctx>, "
            f"Rlognormal<mean> or Rlong<long>[x<short>], then optional suffixes ({SUFFIXES}), "
            "e.g. H16L4B32C16384-tree"
        )
    heads, drafts, batch = (int(m.group(i)) for i in (1, 2, 3))
    short = SHORT_CTX
    if m.group(4):
        kind, ctx = "uniform", _length(m.group(4))
    elif m.group(5):
        kind, ctx = "lognormal", _length(m.group(5))
    else:
        kind, ctx = "long", _length(m.group(6))
        short = _length(m.group(7)) if m.group(7) else SHORT_CTX
    spec = ShapeSpec(heads, drafts, batch, kind, ctx, short, **_suffixes(text, m.group(8)))
    if min(spec.num_heads, spec.draft_len, spec.batch_size, spec.ctx, spec.short) < 1:
        raise ValueError(f"shape {text!r}: every number must be >= 1")
    if spec.ragged and spec.draft_len < 2:
        raise ValueError(f"shape {text!r}: -ragged needs L >= 2 (counts 1..L)")
    if spec.page_size and not spec.plain:
        raise ValueError(
            f"shape {text!r}: -page{spec.page_size} is the paged entry point "
            "(verify_mla_paged): absorbed MLA 576/512, L causal drafts a request, "
            "int32 block tables; it takes no -d256/-d128, -ragged, -tree, -treefull or -i64"
        )
    if spec.page_size and spec.kv_dtype != "bf16":
        raise ValueError(
            f"shape {text!r}: paged rows are bf16 (the drafts live in the cache, so an fp8 "
            "cache would hold other draft values than the token-indexed call's)"
        )
    return spec


def full_grid() -> list[ShapeSpec]:
    """Uniform contexts for every (H, L, bs); for bs > 1 also lognormal
    lengths of each mean and one long request among short ones."""
    shapes = []
    for h in GRID_HEADS:
        for l in GRID_DRAFTS:
            for b in GRID_BATCHES:
                for c in GRID_CONTEXTS:
                    shapes.append(ShapeSpec(h, l, b, "uniform", c))
                if b > 1:
                    for c in GRID_CONTEXTS:
                        shapes.append(ShapeSpec(h, l, b, "lognormal", c))
                    shapes.append(ShapeSpec(h, l, b, "long", LONG_CTX, SHORT_CTX))
    return shapes


def plain_name(spec: ShapeSpec) -> str:
    """The name without the call-kind suffixes (-fp8 kept): what seeds the
    random lengths, so a shape's tree, ragged, head-dim and paged rows get
    the prefix lengths of its plain row."""
    return dataclasses.replace(
        spec, head_dims=MLA_DIMS, ragged=False, mask="causal", int64_indices=False, page_size=0
    ).name


def prefix_lengths(spec: ShapeSpec) -> list[int]:
    """Per-request prefix lengths, deterministic per shape name."""
    bs = spec.batch_size
    if spec.kind == "uniform":
        return [spec.ctx] * bs
    if spec.kind == "long":
        return [spec.ctx] + [spec.short] * (bs - 1)
    rng = random.Random(zlib.crc32(plain_name(spec).encode()))
    sigma = 1.0
    draws = [rng.lognormvariate(math.log(spec.ctx) - sigma * sigma / 2, sigma) for _ in range(bs)]
    # Rescale to the exact mean, then give the rounding remainder to the longest.
    scale = spec.ctx * bs / sum(draws)
    lens = [max(1, round(x * scale)) for x in draws]
    longest = max(range(bs), key=lens.__getitem__)
    lens[longest] = max(1, lens[longest] + spec.ctx * bs - sum(lens))
    return lens


def draft_counts(spec: ShapeSpec) -> list[int]:
    """Per-request draft counts E_b: L each, or for -ragged uniform in
    1..L, deterministic per shape name (a fixed seed)."""
    if not spec.ragged:
        return [spec.draft_len] * spec.batch_size
    rng = random.Random(zlib.crc32(f"{plain_name(spec)} drafts".encode()))
    return [rng.randint(1, spec.draft_len) for _ in range(spec.batch_size)]


# --- work ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    bytes: int  # prefix KV read once + q + out + the drafts' K/V (+ mask bytes read)
    flops: int  # 2 * H * sum_b(E_b * P_b) * (Dqk + Dv)


def shape_work(
    num_heads: int,
    draft_len: int,
    prefix_lens: Sequence[int],
    kv_bytes: int = ELEM,
    *,
    head_dims: tuple[int, int] = MLA_DIMS,
    draft_counts: Sequence[int] | None = None,
    mask: str = "causal",
    paged: bool = False,
) -> Work:
    """The bytes a verify call must move and the FLOPs of its prefix products.

    Bytes: the prefix KV read once: Dqk elements a token for MLA (V is a
    view of K's first 512 columns), Dqk + Dv for 256/256 and 128/128 (V a
    cache of its own, ``problem.kv_columns``), q and
    out in bf16, and the drafts' K and V: k_extend + v_extend in bf16, or in
    a paged call the drafts' cache rows (Dqk cache elements each). A custom
    mask adds the bytes the kernel must read: the E_b x E_b draft block with
    the prefix visible ('tree'), every row's P_b + E_b bits ('treefull').
    FLOPs: 2 H sum_b(E_b P_b) (Dqk + Dv), the two products over the prefix;
    E_b = L unless ``draft_counts`` says otherwise (ragged)."""
    dqk, dv = head_dims
    counts = list(draft_counts) if draft_counts is not None else [draft_len] * len(prefix_lens)
    rows = sum(counts)
    prefix = sum(prefix_lens)
    drafts = kv_bytes * rows * dqk if paged else ELEM * rows * (dqk + dv)
    prefix_kv = kv_bytes * prefix * kv_columns(head_dims)
    nbytes = prefix_kv + drafts + ELEM * rows * num_heads * (dqk + dv)  # q + out
    if mask == "tree":
        nbytes += sum(e * e for e in counts)
    elif mask == "treefull":
        nbytes += sum(e * (p + e) for e, p in zip(counts, prefix_lens))
    flops = 2 * num_heads * sum(e * p for e, p in zip(counts, prefix_lens)) * (dqk + dv)
    return Work(nbytes, flops)


def spec_work(spec: ShapeSpec, prefix_lens: Sequence[int]) -> Work:
    """``shape_work`` of one shape's call (its kind from its suffixes)."""
    return shape_work(
        spec.num_heads,
        spec.draft_len,
        prefix_lens,
        spec.kv_bytes,
        head_dims=spec.head_dims,
        draft_counts=draft_counts(spec),
        mask=spec.mask,
        paged=spec.page_size > 0,
    )
