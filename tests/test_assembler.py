"""mla_verify/assembler.py: which ptxas assembles the Hopper kernel. The
choice on made-up tools; on this Triton, a real compile's PTX and that the
switch stays inside its scope."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from mla_verify import assembler


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


def _recording_scope(seen):
    @contextlib.contextmanager
    def scope():
        seen.append("enter")
        yield
        seen.append("exit")

    return scope


# A compile for sm90 in a process of its own, without the interpreter: the
# PTX's ISA version is the assembler's (Triton writes the one its ptxas
# takes), and Triton's own knob is as it was after the compile.
_COMPILE = """
import re
from triton.backends.nvidia import compiler
from mla_verify import aot, assembler, lookup
from mla_verify.config import VerifyConfig
own = compiler.get_ptxas(90)
config = lookup.block_config(16, 2, 8, "bf16", arch="sm90")
tile = VerifyConfig(BLOCK_H=16, BLOCK_N=64, NUM_KV_SPLITS=1, num_warps=8, num_stages=2)
isa = []
for c in (config, tile):
    compiled = aot.compile_stage1(c, 4, "bf16", "sm90")
    isa.append(re.search(r"^\\.version (\\d+)\\.", compiled.asm["ptx"], re.M).group(1))
major = own.version.split(".")[0]
print(assembler.switch() is not None, major, *isa, compiler.get_ptxas(90) == own)
"""


def _nvidia_backend() -> bool:
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _nvidia_backend(), reason="Triton's NVIDIA backend is not installed")
def test_the_hopper_kernel_is_assembled_by_the_chosen_ptxas(run_compiling):
    switched, own_cuda, hopper_isa, triton_isa, knob_restored = run_compiling(_COMPILE).split()
    assert knob_restored == "True"
    # Triton writes the PTX ISA its assembler takes: 8.x for CUDA 12, 9.x
    # for CUDA 13. Switched, the CUDA 12 ptxas assembled the Hopper kernel;
    # the Triton kernel (register-input wgmma: the module's docstring)
    # always Triton's own.
    isa = {"12": "8", "13": "9"}
    assert hopper_isa == isa["12" if switched == "True" else own_cuda]
    assert triton_isa == isa[own_cuda]
    assert switched == str(own_cuda != "12")


# The Hopper kernel's wgmma, as every variant compiles for sm90: how many
# read A from registers (SASS: a register where a shared-memory descriptor
# would be).
_WGMMA_A = """
import re
from mla_verify import aot
from mla_verify.config import hopper_config
register_a = re.compile(r"\\bHGMMA\\.\\S+\\s+R\\d+,\\s*R\\d+")
calls = [
    (kernel, kv, dims, options)
    for kernel in ("gluon_sm90", "gluon_sm90_sv")
    for kv in ("bf16", "fp8_e4m3")
    for dims, options in (
        ((576, 512), {}),
        ((576, 512), {"ragged": True, "mask": "prefix"}),
        ((576, 512), {"paged": True}),
        ((256, 256), {}),
    )
]
for kernel, kv, dims, options in calls:
    compiled = aot.compile_stage1(hopper_config(16, 4, 8, kernel), 4, kv, "sm90", dims, **options)
    if compiled.name != "_prefix_kernel_sm90":
        continue  # not the Hopper kernel on this Triton (hopper.FP8_LOWERS)
    sass = aot.sass(compiled)
    print(kernel, kv, dims[0], sass.count("HGMMA"), len(register_a.findall(sass)))
"""


@pytest.mark.slow
@pytest.mark.skipif(not _nvidia_backend(), reason="Triton's NVIDIA backend is not installed")
def test_the_hopper_kernel_reads_every_wgmma_operand_a_from_shared_memory(run_compiling):
    """What makes the CUDA 12 ptxas safe for it: that ptxas may reuse a
    register-input wgmma's registers before the wgmma reads them
    (triton-lang/triton#11781). Every variant's wgmma read A from shared
    memory."""
    rows = [line.split() for line in run_compiling(_WGMMA_A, timeout=1800).splitlines()]
    assert len(rows) >= 8, rows  # the bf16 variants at least
    for kernel, kv, qk, wgmma, register_a in rows:
        assert int(wgmma) > 0 and int(register_a) == 0, (kernel, kv, qk, wgmma, register_a)
