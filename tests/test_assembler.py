"""mla_verify/assembler.py: which ptxas assembles stage 1 for sm90. The
choice on made-up tools; on this Triton, real compiles' PTX (the Hopper
kernel's, and the Triton kernel's for sm90 and for another arch) and that
the switch stays inside its scope."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mla_verify import assembler

REPO = Path(__file__).resolve().parents[1]


def _tool(path: str, version: str) -> SimpleNamespace:
    return SimpleNamespace(path=path, version=version)


CUDA12 = _tool("/t/ptxas", "12.9")
CUDA13 = _tool("/t/ptxas-blackwell", "13.4")


def test_a_cuda13_sm90_ptxas_gives_way_to_the_cuda12_one_beside_it():
    tools = {"ptxas": CUDA12, "ptxas_blackwell": CUDA13}
    assert assembler.choose(CUDA13, tools, set()) == ("ptxas_blackwell", "/t/ptxas")


def test_a_cuda12_sm90_ptxas_stands():
    tools = {"ptxas": _tool("/t/ptxas", "12.8"), "ptxas_blackwell": CUDA12}
    assert assembler.choose(tools["ptxas"], tools, set()) is None


def test_no_cuda12_ptxas_or_a_users_own_leaves_tritons_choice():
    only13 = {"ptxas": _tool("/t/ptxas", "13.4"), "ptxas_blackwell": CUDA13}
    assert assembler.choose(CUDA13, only13, set()) is None
    tools = {"ptxas": CUDA12, "ptxas_blackwell": CUDA13}
    assert assembler.choose(CUDA13, tools, {"ptxas_blackwell"}) is None
    # The user named the ptxas Triton runs for sm90 (3.6 reads "ptxas").
    user13 = _tool("/u/ptxas", "13.0")
    tools = {"ptxas": user13, "ptxas_blackwell": CUDA12}
    assert assembler.choose(user13, tools, {"ptxas"}) is None
    assert assembler.choose(user13, tools, set()) == ("ptxas", "/t/ptxas")


def test_install_compiles_inside_the_scope_and_only_once_wrapped(monkeypatch):
    seen = []
    monkeypatch.setattr(assembler, "switch", lambda: ("ptxas_blackwell", "/t/ptxas"))
    monkeypatch.setattr(assembler, "scope", _recording_scope(seen))

    class Kernel:
        def _do_compile(self, *args):
            seen.append(("compile", args))
            return "compiled"

    fn = Kernel()
    assembler.install(fn)
    assembler.install(fn)
    assert fn._do_compile("key", 1) == "compiled"
    assert seen == ["enter", ("compile", ("key", 1)), "exit"]


def test_install_leaves_a_kernel_alone_where_tritons_choice_stands(monkeypatch):
    monkeypatch.setattr(assembler, "switch", lambda: None)

    class Kernel:
        def _do_compile(self):
            return "compiled"

    fn = Kernel()
    assembler.install(fn)
    assert "_do_compile" not in vars(fn)
    assert assembler.compile_options() == {}


def test_install_for_sm90_only_leaves_other_targets_to_triton(monkeypatch):
    """The Triton kernel runs on every GPU: installed for sm90 only, its
    compiles for another target run outside the scope."""
    seen = []
    monkeypatch.setattr(assembler, "switch", lambda: ("ptxas_blackwell", "/t/ptxas"))
    monkeypatch.setattr(assembler, "scope", _recording_scope(seen))

    class Kernel:
        def _do_compile(self, *args):
            seen.append("compile")

    for on_sm90 in (True, False):
        monkeypatch.setattr(assembler, "_compiling_for_sm90", lambda on_sm90=on_sm90: on_sm90)
        fn = Kernel()
        assembler.install(fn, only_for_sm90=True)
        seen.clear()
        fn._do_compile("key")
        assert seen == (["enter", "compile", "exit"] if on_sm90 else ["compile"])


def _recording_scope(seen):
    @contextlib.contextmanager
    def scope():
        seen.append("enter")
        yield
        seen.append("exit")

    return scope


# Compiles in a process of its own, without the interpreter: the PTX's ISA
# version is the assembler's (Triton writes the one its ptxas takes), and
# Triton's own knob is as it was after the compiles. Stage 1 for sm90 on
# either kernel, and the Triton kernel for sm100, whose ptxas stays Triton's.
_COMPILE = """
import re
from triton.backends.nvidia import compiler
from mla_verify import aot, assembler, lookup
from mla_verify.config import VerifyConfig
own = compiler.get_ptxas(90)
hopper = lookup.block_config(16, 2, 8, "bf16", arch="sm90")
portable = VerifyConfig(BLOCK_H=8, BLOCK_N=64, NUM_KV_SPLITS=1, num_warps=4, num_stages=2)
isa = []
for config, arch in ((hopper, "sm90"), (portable, "sm90"), (portable, "sm100")):
    ptx = aot.compile_stage1(config, 2, "bf16", arch).asm["ptx"]
    isa.append(re.search(r"^\\.version (\\d+)\\.", ptx, re.M).group(1))
own_100 = compiler.get_ptxas(100).version.split(".")[0]
print(assembler.switch() is not None, own.version.split(".")[0], own_100, *isa,
      compiler.get_ptxas(90) == own)
"""


def _nvidia_backend() -> bool:
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _nvidia_backend(), reason="Triton's NVIDIA backend is not installed")
def test_stage_1_for_sm90_is_assembled_by_the_chosen_ptxas():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    switched, own_cuda, own_100, hopper, portable, portable_100, restored = proc.stdout.split()
    assert restored == "True"
    # Triton writes the PTX ISA its assembler takes: 8.x for CUDA 12, 9.x
    # for CUDA 13. Switched, the CUDA 12 ptxas assembled stage 1 for sm90.
    isa = {"12": "8", "13": "9"}
    cuda = "12" if switched == "True" else own_cuda
    assert hopper == portable == isa[cuda]
    assert portable_100 == isa[own_100]
    assert switched == str(own_cuda != "12")
