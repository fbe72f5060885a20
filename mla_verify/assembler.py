"""The ptxas that assembles the Hopper kernel.

Triton 3.6 assembles sm90 code with the CUDA 12.8 ptxas it ships. Triton
3.9 assembles it with its CUDA 13.4 one, with ``--regAllocOptLevel=2``,
and this kernel's tile loops then spill (20-37 local-memory accesses a
tile against 0-1): the same source assembled that way ran 1.21-1.28x
slower on the H200 (RESULTS.md, "Newer Triton's ptxas"). Where Triton's
sm90 ptxas is CUDA 13 or newer and it still ships a CUDA 12 one beside it,
the Hopper kernel is assembled with the CUDA 12 one, inside a scope around
its compile alone: every other kernel of the process keeps Triton's
choice. A ptxas the user named (``TRITON_PTXAS_PATH``,
``TRITON_PTXAS_BLACKWELL_PATH``) is left alone.

Only the Hopper kernel, because its wgmma all read A from shared memory.
CUDA 12.9's ptxas can reuse the registers of a register-input wgmma
before the wgmma has read them (triton-lang/triton#11781, fixed in CUDA
13.3), which is why Triton 3.9 assembles sm90 with its CUDA 13 ptxas.
The Triton kernel issues such wgmma on sm90 (P V with P in registers), so
it keeps Triton's choice; ``tests/test_assembler.py`` fails if the Hopper
kernel ever issues one.

Limits: a compile Triton defers (its async compile mode) runs outside the
scope, with Triton's own ptxas; another thread compiling during the scope
sees its ptxas too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator

logger = logging.getLogger(__name__)

SM90 = 90
# The knobs (triton.knobs.nvidia) naming the ptxas binaries Triton ships:
# 3.6 assembles sm90 with the first, 3.9 with the second.
_KNOBS = ("ptxas", "ptxas_blackwell")
# Passed to ptxas as well where the CUDA 12 one assembles the kernel: its
# default optimisation level, so the same code, but a distinct entry in
# Triton's cache from a build by Triton's own choice (whose key does not
# name the binary).
MARK = "-O3"


@functools.cache
def switch() -> tuple[str, str] | None:
    """(knob, path): the knob Triton reads for sm90's ptxas and the CUDA 12
    ptxas to set it to while the Hopper kernel compiles; None where Triton's
    own choice stands (``choose``), or where this Triton differs from the
    ones known."""
    try:
        from triton import knobs
        from triton.backends.nvidia import compiler

        current = compiler.get_ptxas(SM90)
        tools = {name: getattr(knobs.nvidia, name) for name in _KNOBS}
        named = {name for name in _KNOBS if os.environ.get(type(knobs.nvidia).__dict__[name].key)}
    except (ImportError, AttributeError, KeyError, RuntimeError, OSError) as exc:
        logger.debug("Triton's own ptxas for sm90 (%s)", exc)
        return None
    chosen = choose(current, tools, named)
    if chosen is None:
        return None
    # Triton's cache key names the ptxas version it first sees for an arch
    # (cached): let that be its own choice, not the one scope() sets.
    prime = getattr(compiler, "get_ptxas_version", None)
    if callable(prime):
        prime(SM90)
    logger.debug(
        "the Hopper kernel is assembled by %s, not Triton's ptxas %s", chosen[1], current.version
    )
    return chosen


def choose(current, tools: dict, named: set[str]) -> tuple[str, str] | None:
    """(knob, path) to assemble sm90 with, given Triton's ptxas for it
    (``current``, with ``path`` and ``version``), the ptxas each knob names
    (``tools``) and the knobs the user set (``named``): the knob that names
    ``current`` set to a CUDA 12 ptxas, where ``current`` is CUDA 13 or
    newer and the user did not name it; else None."""
    if _major(current.version) < 13:
        return None
    knob = next((name for name, tool in tools.items() if tool.path == current.path), None)
    legacy = next((tool for tool in tools.values() if _major(tool.version) == 12), None)
    if knob is None or legacy is None or knob in named:
        return None
    return knob, legacy.path


def _major(version: str) -> int:
    return int(version.split(".")[0])


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Triton's sm90 ptxas set to ``switch()``'s within, restored after."""
    chosen = switch()
    if chosen is None:
        yield
        return
    from triton import knobs

    knob, path = chosen
    with knobs.nvidia.scope():
        setattr(knobs.nvidia, knob, path)
        yield


def compile_options() -> dict[str, str]:
    """Options for the Hopper kernel's compile: ``MARK`` where ``switch()``
    applies, after the user's own ptxas options (theirs come last, so they
    win)."""
    if switch() is None:
        return {}
    from triton import knobs

    return {"ptx_options": " ".join(filter(None, (MARK, knobs.nvidia.ptxas_options)))}


def install(fn) -> None:
    """From now on, compile the JIT function ``fn`` (a Hopper kernel) inside
    ``scope()``: Triton's run method calls its ``_do_compile`` on a cache
    miss only, so a launch pays nothing."""
    if switch() is None or getattr(fn, "_mla_verify_assembler", False):
        return
    compile_ = getattr(fn, "_do_compile", None)
    if not callable(compile_):
        logger.debug("this Triton's JIT functions have no _do_compile: not installed")
        return

    def do_compile(*args, **kwargs):
        with scope():
            return compile_(*args, **kwargs)

    fn._do_compile = do_compile
    fn._mla_verify_assembler = True
