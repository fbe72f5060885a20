"""The problem's fixed facts: head dims, dtypes, and the ranges every public
entry point accepts. A leaf module: everything else imports it.
"""

from __future__ import annotations

import operator

import torch

# Absorbed MLA: q/k rows are 512 latent ("nope") + 64 rope columns; V is the
# first 512 latent columns.
D_NOPE = 512
D_ROPE = 64
QK_HEAD_DIM = D_NOPE + D_ROPE
V_HEAD_DIM = D_NOPE
MLA_HEAD_DIMS = (QK_HEAD_DIM, V_HEAD_DIM)

# (q/k, v) head dims the kernels compute, one KV head shared by every query
# head: absorbed MLA (V the first 512 of the 576 latent columns, the other 64
# the rope part), and ordinary attention at 256 (Qwen3.5) and 128, no rope
# part. The q/k columns past the first v ones are the rope part.
HEAD_DIMS = (MLA_HEAD_DIMS, (256, 256), (128, 128))

# Supported ranges, inclusive. The batch bound is CUDA's grid-y limit (stage
# 2 runs a program per request); 16 drafts is the longest verify any engine
# sends; more than 1024 heads on one rank exists in no model.
MIN_DRAFT_LEN, MAX_DRAFT_LEN = 1, 16
MIN_BATCH_SIZE, MAX_BATCH_SIZE = 1, 65535
MIN_HEADS, MAX_HEADS = 1, 1024
# Slots of a KV pool: the kernels hold slot numbers in int32 (an int64 index
# tensor is narrowed as it loads); 2^31 rows of 576 bf16 would be 2.5 TB.
MAX_POOL_SLOTS = 2**31 - 1

Q_DTYPES = (torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
MASK_DTYPES = (torch.bool, torch.uint8)  # SGLang's custom_mask: one byte a bit

# Key names of the KV dtypes the tables distinguish.
KV_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float8_e4m3fn: "fp8_e4m3",
}
if hasattr(torch, "float8_e4m3fnuz"):  # MI300's fp8 flavour
    KV_DTYPE_NAMES[torch.float8_e4m3fnuz] = "fp8_e4m3fnuz"
KV_DTYPES = tuple(KV_DTYPE_NAMES)


def kv_dtype_name(dtype: torch.dtype | str) -> str:
    """Table key of a KV dtype ('bf16', 'fp16', 'fp8_e4m3', ...)."""
    if isinstance(dtype, str):
        if dtype not in KV_DTYPE_NAMES.values():
            raise ValueError(
                f"kv_dtype: expected one of {sorted(KV_DTYPE_NAMES.values())}, got {dtype!r}"
            )
        return dtype
    try:
        return KV_DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"kv_dtype: expected one of {list(KV_DTYPE_NAMES)}, got {dtype}") from None


def kv_dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype of a table key ('bf16', 'fp8_e4m3', ...)."""
    kv_dtype_name(name)  # validates, naming the choices
    return next(dtype for dtype, key in KV_DTYPE_NAMES.items() if key == name)


def check_range(name: str, value: object, low: int, high: int) -> int:
    """``value`` as an int in low..high, else a ValueError naming the
    argument, the range and the value (bools are refused: True is no size)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: expected an int in {low}..{high}, got {value!r}") from None
    if not low <= number <= high:
        raise ValueError(f"{name}: expected an int in {low}..{high}, got {number}")
    return number


def check_shape(
    num_heads: object, draft_len: object, batch_size: object, *, batch_name: str = "batch_size"
) -> tuple[int, int, int]:
    """The three sizes every public entry point takes, checked against the
    supported ranges (``batch_name``: how the caller spells its batch
    argument, e.g. ``max_batch_size``)."""
    return (
        check_range("num_heads", num_heads, MIN_HEADS, MAX_HEADS),
        check_range("draft_len", draft_len, MIN_DRAFT_LEN, MAX_DRAFT_LEN),
        check_range(batch_name, batch_size, MIN_BATCH_SIZE, MAX_BATCH_SIZE),
    )


def check_head_dims(head_dims: object) -> tuple[int, int]:
    """``head_dims`` as a supported (q/k, v) pair, else a ValueError naming
    the choices."""
    try:
        qk, v = (operator.index(d) for d in head_dims)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"head_dims: expected one of {HEAD_DIMS}, got {head_dims!r}") from None
    if (qk, v) not in HEAD_DIMS:
        raise ValueError(f"head_dims: expected one of {HEAD_DIMS}, got {(qk, v)}")
    return qk, v


def parse_head_dims(text: str) -> tuple[int, int]:
    """``"576x512"`` or ``"256"`` (one dim for both) as a supported (q/k, v)
    pair, else a ValueError naming the choices: how the command lines spell
    head dims."""
    try:
        qk, _, v = text.partition("x")
        return check_head_dims((int(qk), int(v or qk)))
    except ValueError:
        raise ValueError(
            f"expected head dims among {HEAD_DIMS} as QKxV or D, got {text!r}"
        ) from None


def kv_columns(head_dims: tuple[int, int]) -> int:
    """Columns of a prefix token the Triton kernel loads: K's alone for
    absorbed MLA (V is a view of its first columns), K's and V's where V is
    a cache of its own (ordinary attention)."""
    qk, v = head_dims
    return qk if tuple(head_dims) == MLA_HEAD_DIMS else qk + v


def head_dims_suffix(head_dims: tuple[int, int]) -> str:
    """What a table key adds for ``head_dims``: nothing for MLA (keys written
    before other dims existed stay valid), ``_D256`` for 256/256 (a pair
    whose dims differ would read ``_D{qk}x{v}``)."""
    qk, v = check_head_dims(head_dims)
    if (qk, v) == MLA_HEAD_DIMS:
        return ""
    return f"_D{qk}" if qk == v else f"_D{qk}x{v}"
