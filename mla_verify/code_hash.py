"""The hash of the kernel code a tuned record was measured with.

Tables mark a record stale when its hash is no longer the code's
(tables.py), so a kernel change flags the times it may have moved. Hashed:
the code of the jitted and constexpr functions of kernel.py and
kernel_sm90.py (their syntax trees: comments and formatting do not count),
the module constants and classes that code reads, and the host constants
that shape the launches. Per kernel family (``KERNEL_HASHES``, keyed by
``config.kernel_family``), so a change to one family's kernels does not
stale the other's records; ``KERNEL_HASH``, every kernel at once, dates the
records written before records carried their own.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import re
import textwrap
import types

import triton.language as tl
from triton.runtime.jit import ConstexprFunction

from . import hopper, kernel
from .config import VerifyConfig, kernel_family

kernel_sm90 = hopper.gluon_kernel()  # None without Gluon


# --- reading code ---------------------------------------------------------------


def _kernel_source(jitted) -> str:
    # The function's syntax tree from its `def` on (decorators, comments and
    # formatting left out), whether Triton compiles it or interprets it, so
    # the hash is the same on a GPU and in CI.
    src = textwrap.dedent(inspect.getsource(jitted.fn))
    return _syntax(ast.parse(src[re.search(r"^def\s+\w+\s*\(", src, re.MULTILINE).start() :]))


def _syntax(node) -> str:
    # ast.dump, less the fields a Python version adds empty (3.12's
    # type_params) or leaves out (3.13 omits empty ones): the same text for
    # the same code on every Python.
    if isinstance(node, ast.AST):
        fields = ((name, getattr(node, name, None)) for name in node._fields)
        inner = ",".join(f"{n}={_syntax(v)}" for n, v in fields if v is not None and v != [])
        return f"{type(node).__name__}({inner})"
    if isinstance(node, list):
        return "[" + ",".join(_syntax(item) for item in node) + "]"
    return repr(node)


def _is_jitted(value) -> bool:
    # A jitted function or a constexpr function (a layout, say), compiled,
    # Gluon or interpreted alike.
    return hasattr(value, "fn") and (
        hasattr(value, "arg_names") or isinstance(value, ConstexprFunction)
    )


def _jitted(namespace: dict) -> list:
    # A module's jitted and constexpr functions, in definition order: a new
    # helper is hashed without being listed.
    return [v for v in namespace.values() if _is_jitted(v)]


# The combined hash of every kernel: the jitted functions' code (kernel.py's
# in definition order, then kernel_sm90.py's) and the module constants that
# shape them (comments and formatting do not count), so any kernel change
# changes it. A table's metadata.kernel_hash holds it and dates the records
# that carry no hash of their own (written before KERNEL_HASHES, the hash
# per family).
KERNEL_HASH = hashlib.sha256(
    "\n".join(
        [_kernel_source(fn) for fn in _jitted(vars(kernel)) + _jitted(vars(kernel_sm90 or {}))]
        + [
            repr(
                (
                    kernel.PLAN_BLOCK,
                    kernel.MERGE_WARPS,
                    kernel.MERGE_SHARES_TILE,
                    kernel.MERGE_PROGRAM_ELEMENTS,
                    kernel.MERGE_REQUEST_PROGRAMS,
                    kernel.MERGE_MAX_PROGRAMS,
                    kernel.MERGE_MAX_BLOCKS,
                )
            )
        ]
        + [repr(hopper.SHAPE)]
    ).encode()
).hexdigest()[:16]


# --- per-family hashes ----------------------------------------------------------


def _ours(module_name: str) -> bool:
    return module_name == __package__ or module_name.startswith(f"{__package__}.")


def _local_name(module_name: str, name: str) -> str:
    # Without the package's own name: a copy installed under another name
    # hashes alike.
    return f"{module_name.removeprefix(f'{__package__}.')}.{name}"


def _free_references(jitted) -> set[tuple[str, ...]]:
    # The names the function's code reads from its module, each with the
    # attributes read off it (("hopper", "TOKENS")): arguments and names it
    # assigns are its own.
    tree = ast.parse(textwrap.dedent(inspect.getsource(jitted.fn))).body[0]
    tree.decorator_list = []
    nodes = list(ast.walk(tree))
    own = {n.arg for n in nodes if isinstance(n, ast.arg)}
    own |= {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    attributes = [n for n in nodes if isinstance(n, ast.Attribute)]
    inner = {id(n.value) for n in attributes}
    refs, read_off = set(), set()
    for node in attributes:
        if id(node) in inner:
            continue  # part of a longer chain
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id not in own:
            refs.add((node.id, *reversed(chain)))
            read_off.add(id(node))
    refs |= {
        (n.id,)
        for n in nodes
        if isinstance(n, ast.Name) and n.id not in own and id(n) not in read_off
    }
    return refs


_UNDEFINED = object()  # a name the module does not define (a builtin: range, float)


def _resolve(namespace: dict, chain: tuple[str, ...]) -> tuple[str, object]:
    # A reference's value and its name (module.attribute), following
    # attributes through this package's modules only.
    owner, name = namespace["__name__"], chain[0]
    value = namespace.get(name, _UNDEFINED)
    for attr in chain[1:]:
        if not (isinstance(value, types.ModuleType) and _ours(value.__name__)):
            break
        owner, name, value = value.__name__, attr, getattr(value, attr, _UNDEFINED)
    return _local_name(owner, name), value


def _constant_text(value) -> str | None:
    # A module constant's repr (a constexpr by its value, whose repr varies
    # with Triton's version); None for anything that is not a constant.
    if value is _UNDEFINED:
        return None
    if isinstance(value, tl.constexpr):
        value = value.value
    if isinstance(value, tuple) and all(_constant_text(v) is not None for v in value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return None


def _code_closure(kernels: list) -> dict[str, str]:
    """Name -> hashed text of every jitted or constexpr function of this
    package that ``kernels`` reach through their code (code only, as
    ``_kernel_source`` reads it), and of the module constants (their repr)
    and classes (their code) they read on the way. Triton's own functions
    and modules are not followed: its version is in a table's metadata."""
    texts: dict[str, str] = {}
    pending = list(kernels)
    while pending:
        jitted = pending.pop()
        name = _local_name(jitted.fn.__module__, jitted.fn.__qualname__)
        if name in texts:
            continue
        texts[name] = _kernel_source(jitted)
        for chain in sorted(_free_references(jitted)):
            ref, value = _resolve(jitted.fn.__globals__, chain)
            if _is_jitted(value):
                if _ours(value.fn.__module__):
                    pending.append(value)
            elif _constant_text(value) is not None:
                texts[ref] = _constant_text(value)
            elif isinstance(value, type) and _ours(value.__module__):
                texts[ref] = _syntax(ast.parse(textwrap.dedent(inspect.getsource(value))))
    return texts


def _families() -> dict[str, tuple[list, dict[str, object]]]:
    """Family -> (the jitted kernels its launches run, the host constants
    that shape those launches), as ``kernel.launch``, ``kernel.launch_merge``,
    ``kernel.launch_merge_shares`` and ``plan.merge_column_blocks`` read
    them.
    Without Gluon the Hopper kernel's code cannot be read, and Hopper
    configs run the Triton kernel (``plan.uses_gluon_sm90``): the family
    then hashes stage 2 and the host constants alone, a hash no record
    measured with Gluon carries, so such records read as stale there."""
    merge_shares = {
        "MERGE_SHARES_TILE": kernel.MERGE_SHARES_TILE,
        "MERGE_PROGRAM_ELEMENTS": kernel.MERGE_PROGRAM_ELEMENTS,
        "MERGE_REQUEST_PROGRAMS": kernel.MERGE_REQUEST_PROGRAMS,
        "MERGE_MAX_PROGRAMS": kernel.MERGE_MAX_PROGRAMS,
        "MERGE_MAX_BLOCKS": kernel.MERGE_MAX_BLOCKS,
        "MERGE_WIDE_PIECES": kernel.MERGE_WIDE_PIECES,
        "MERGE_SHARES_WIDE_TILE": kernel.MERGE_SHARES_WIDE_TILE,
        "hopper.SHAPE": hopper.SHAPE,
    }
    both = {"PLAN_BLOCK": kernel.PLAN_BLOCK, "MERGE_WARPS": kernel.MERGE_WARPS}
    gluon = [kernel_sm90._prefix_kernel_sm90] if kernel_sm90 is not None else []
    return {
        "triton": ([kernel._prefix_kernel, kernel._merge_extend_kernel], both),
        "gluon_sm90": ([*gluon, kernel._merge_shares_kernel], both | merge_shares),
    }


def kernel_hashes() -> dict[str, str]:
    """Each kernel family's hash (``config.kernel_family``), from the code
    as it is now: the dependency closure of the family's kernels
    (``_code_closure``) and its host constants. A helper both families
    call changes both; a change to one family's code leaves the other's
    hash as it was."""
    hashes = {}
    for family, (kernels, constants) in _families().items():
        closure = _code_closure(kernels)
        lines = [f"{name}: {text}" for name, text in sorted(closure.items())]
        lines += [f"{name} = {value!r}" for name, value in sorted(constants.items())]
        hashes[family] = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    return hashes


# The code a tuned record was measured with, per kernel family (tables.py).
KERNEL_HASHES = kernel_hashes()


def kernel_hash(config: VerifyConfig | str) -> str:
    """The hash of the code a config (or a ``kernel`` field's value) runs:
    its family's, ``KERNEL_HASHES[kernel_family(config)]``."""
    return KERNEL_HASHES[kernel_family(config)]
