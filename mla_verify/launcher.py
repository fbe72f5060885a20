"""Kernel launches with Triton's per-call binding done once per signature.

``fn[grid](*args, **kwargs)`` binds and specialises every argument, builds
the compile key, looks the kernel up and checks the globals it read, on
every call: about 20-25 us of host time a launch, where the launch proper
takes 7-10 (RESULTS.md, "The host's cost of a call"). Engines that call
eagerly pay that once per layer and launch.

``launch`` keys a call by everything Triton's specialisation can read: each
argument's type; the values of ints, floats, bools and None; a tensor's
dtype and data pointer modulo 16 (Triton specialises on 16-byte
alignment); a TMA descriptor's fields; and the keyword arguments (the
constexprs and the launch options). The first call of a signature goes
through Triton and keeps the compiled kernel it returns; later calls of it
launch that kernel directly (``CompiledKernel[grid](*args)``, the launcher
Triton's own path ends in), with every argument in the kernel's parameter
order. The same signature always selects the same compiled kernel, so the
kernel launched is the one Triton would have chosen.

Under Triton's interpreter, with a pre-run hook on the kernel, or for an
argument the key cannot hold, the call goes through Triton as written.

A kept call (``prepared``) launches the same kernels with the same
signatures every time: its signature fixes every tensor's dtype and
alignment, every int the launches pass and their keywords (the workspace's
views start 16-byte aligned, ``workspace.py``). So ``Recording`` keeps the
kernels the call launched the first time, in order, and while it is
``replayed`` the call's launches take them without forming a signature:
a kept call's host time 1.32-1.43x less (RESULTS.md, "A kept call's
launches replayed"). A launch that is not the recorded one, an argument
the signature could not hold, an error, another current device or
``clear`` each drop the recording: the next call records again.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading

import torch
import triton

# Signatures kept at most; then the cache starts again (a long-running engine
# meets a bounded set of shapes, but nothing outside this module says so).
MAX_SIGNATURES = 4096
_ALIGN_MASK = 15  # Triton specialises pointers on 16-byte alignment


class _Unkeyable(Exception):
    """An argument the signature cannot hold: the call goes through Triton."""


@dataclasses.dataclass(frozen=True)
class _Compiled:
    kernel: object  # triton.compiler.CompiledKernel
    tail: tuple[str, ...]  # parameters after the positional ones, in order
    defaults: dict  # their defaults, for those the call does not pass


_compiled: dict[tuple, _Compiled] = {}
_descriptor_fields: dict[type, tuple[str, ...]] = {}


_PLAIN = frozenset((int, float, bool, str, type(None)))


def _arg_key(arg) -> object:
    kind = type(arg)
    if kind is torch.Tensor or isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() & _ALIGN_MASK)
    if kind in _PLAIN:
        return (kind, arg)
    if dataclasses.is_dataclass(arg) and hasattr(arg, "base"):  # a TMA descriptor
        return (kind, _arg_key(arg.base), *(_frozen(getattr(arg, f)) for f in _fields(kind)))
    raise _Unkeyable(kind.__name__)


def _fields(kind: type) -> tuple[str, ...]:
    names = _descriptor_fields.get(kind)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(kind) if f.name != "base")
        _descriptor_fields[kind] = names
    return names


def _frozen(value) -> object:
    if isinstance(value, (list, tuple)):  # torch.Size too
        return (type(value), *(_frozen(v) for v in value))
    hash(value)  # raises TypeError for what a key cannot hold
    return value


def _signature(args, kwargs) -> tuple:
    # What the call's arguments tell Triton; () where they cannot be keyed.
    # The keywords are constexprs and options, plain values: kept as given
    # with their types (True is 1 to a dict, not to Triton); one that cannot
    # be hashed fails the lookup.
    try:
        keys = tuple(map(_arg_key, args))
    except (_Unkeyable, TypeError):
        return ()
    return (keys, tuple(kwargs.items()), tuple(map(type, kwargs.values())))


def _keep(fn, args, kwargs, kernel) -> _Compiled | None:
    if hasattr(kernel, "result"):  # an asynchronous compile's future
        kernel = kernel.result()
    if kernel is None or not hasattr(kernel, "__getitem__"):
        return None
    params = inspect.signature(fn.fn).parameters
    tail = tuple(fn.arg_names[len(args) :])
    defaults = {
        name: params[name].default
        for name in tail
        if name not in kwargs and params[name].default is not inspect.Parameter.empty
    }
    if any(name not in kwargs and name not in defaults for name in tail):
        return None
    return _Compiled(kernel, tail, defaults)


class Recording:
    """The kernels one kept call launched, in order, and the device and
    ``clear`` generation they were kept under (module docstring)."""

    __slots__ = ("kernels", "device", "generation")

    def __init__(self) -> None:
        self.kernels: tuple[tuple[object, _Compiled], ...] | None = None
        self.device = -1
        self.generation = -1


class _Replay:
    """The launches of a call under way: the recording's kernels to take
    in order, or the ones it launches, to record."""

    __slots__ = ("recording", "kernels", "launched", "next")

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        kernels = recording.kernels
        if kernels is not None and (
            recording.generation != _generation or recording.device != torch.cuda.current_device()
        ):
            kernels = None
        self.kernels = kernels
        self.launched: list | None = [] if self.kernels is None else None
        self.next = 0

    def take(self, fn) -> _Compiled | None:
        # The recorded kernel of this launch, or None (then nothing more is
        # taken or recorded this call, and the recording is dropped).
        kernels, i = self.kernels, self.next
        self.next = i + 1
        if i < len(kernels) and kernels[i][0] is fn:
            return kernels[i][1]
        self.kernels = self.recording.kernels = None
        return None


_generation = 0  # clear() moves it: recordings made before are not replayed
_calls = threading.local()  # .replays: the calls under way, innermost last


class replayed:
    """``with replayed(recording):`` the launches inside take the kernels
    ``recording`` holds, or are recorded into it (module docstring)."""

    __slots__ = ("replay",)

    def __init__(self, recording: Recording) -> None:
        self.replay = _Replay(recording)

    def __enter__(self) -> None:
        stack = getattr(_calls, "replays", None)
        if stack is None:
            stack = _calls.replays = []
        stack.append(self.replay)

    def __exit__(self, kind, value, traceback) -> None:
        _calls.replays.pop()
        replay = self.replay
        recording = replay.recording
        if kind is not None:
            recording.kernels = None
        elif replay.launched is not None and None not in replay.launched:
            # Complete: every launch was keyed, so CUDA is there.
            recording.kernels = tuple(replay.launched)
            recording.device = torch.cuda.current_device()
            recording.generation = _generation


def _replay() -> _Replay | None:
    stack = getattr(_calls, "replays", None)
    return stack[-1] if stack else None


def launch(fn, grid: tuple[int, ...], *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)``, with Triton's binding skipped where a
    call of the same signature ran before, and the signature too where a
    recording is replayed (module docstring)."""
    replay = _replay()
    if replay is not None and replay.kernels is not None:
        compiled = replay.take(fn)
        if compiled is not None and not getattr(fn, "pre_run_hooks", None):
            _launch_kept(compiled, grid, args, kwargs)
            return
    compiled = _launch(fn, grid, args, kwargs)
    if replay is not None and replay.launched is not None:
        replay.launched.append(None if compiled is None else (fn, compiled))


def _launch(fn, grid, args, kwargs) -> _Compiled | None:
    # The keyed launch; returns the kernel kept for its signature, if any.
    if not isinstance(fn, triton.runtime.JITFunction) or fn.pre_run_hooks or callable(grid):
        fn[grid](*args, **kwargs)
        return None
    signature = _signature(args, kwargs)
    key = (fn, torch.cuda.current_device(), signature) if signature else None
    try:
        compiled = _compiled.get(key) if key else None
    except TypeError:  # an unhashable keyword value
        compiled = key = None
    if compiled is None:
        kernel = fn[grid](*args, **kwargs)
        if key and (kept := _keep(fn, args, kwargs, kernel)) is not None:
            if len(_compiled) >= MAX_SIGNATURES:
                _compiled.clear()
            _compiled[key] = kept
            return kept
        return None
    _launch_kept(compiled, grid, args, kwargs)
    return compiled


def _launch_kept(compiled: _Compiled, grid, args, kwargs) -> None:
    defaults = compiled.defaults
    rest = [kwargs[name] if name not in defaults else defaults[name] for name in compiled.tail]
    grid3 = tuple(grid) + (1,) * (3 - len(grid))
    compiled.kernel[grid3](*args, *rest)


def clear() -> None:
    """Forget every kept signature and recording (tests; after a kernel's
    globals change)."""
    global _generation
    _compiled.clear()
    _generation += 1
