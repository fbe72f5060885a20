"""scripts/build_flashmla.py without building: what it asks of --src,
--cutlass and the CUDA toolkit, and its reading of ptxas's report (the build
itself needs a CUDA build of torch and takes minutes)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import build_flashmla  # noqa: E402  (scripts/ is not a package)
from build_flashmla import BuildError  # noqa: E402

# Kernel names as nvcc mangles them (the main kernel's template arguments cut short).
MAIN = (
    "_ZN4sm9028flash_fwd_splitkv_mla_kernel"
    "I6TraitsIN7cutlass10bfloat16_tEEEEv21DenseAttnDecodeParams"
)
COMBINE = (
    "_ZN4smxx6decode28flash_fwd_mla_combine_kernel"
    "IN7cutlass10bfloat16_tELi512ELi8ELi{}ELi256EEEv13CombineParams"
)


def combine_block(rows: int) -> str:
    name = COMBINE.format(rows)
    return f"""\
ptxas info    : Compiling entry function '{name}' for 'sm_90a'
ptxas info    : Function properties for {name}
    24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 48 registers, used 0 barriers, 24 bytes cumulative stack size, 1024 bytes smem
"""


# As ninja leaves it: each command's line, then that command's output.
LOG = f"""\
[1/3] nvcc ... combine.cu -o combine.cuda.o
ptxas warning : Local memory used for function '{COMBINE.format(32)}', size of stack frame: 24 bytes
{combine_block(32)}{combine_block(64)}\
[2/3] nvcc ... bf16.cu -o bf16.cuda.o
ptxas info    : 11 bytes gmem
ptxas info    : Compiling entry function '{MAIN}' for 'sm_90a'
ptxas info    : Function properties for {MAIN}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 240 registers, used 13 barriers
ptxas info    : Compile time = 1955.213 ms
[3/3] c++ ... -shared -o cuda.so
"""


def make_checkout(root: Path) -> Path:
    for rel in build_flashmla.REQUIRED:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    return root


def make_cutlass(root: Path) -> Path:
    (root / "include" / "cutlass").mkdir(parents=True)
    (root / "include" / "cutlass" / "cutlass.h").touch()
    (root / "tools" / "util" / "include").mkdir(parents=True)
    return root


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="no c++filt")
def test_ptxas_report_gives_each_kernel_once_by_name(tmp_path):
    log = tmp_path / "build.log"
    log.write_text(LOG)
    assert build_flashmla.ptxas_report(log) == [
        "smxx::decode::flash_fwd_mla_combine_kernel: 48 registers, "
        "24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        "sm90::flash_fwd_splitkv_mla_kernel: 240 registers, "
        "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
    ]


def test_ptxas_report_keeps_mangled_names_without_cxxfilt(tmp_path, monkeypatch):
    log = tmp_path / "build.log"
    log.write_text(LOG)
    monkeypatch.setattr(build_flashmla.shutil, "which", lambda name: None)
    report = build_flashmla.ptxas_report(log)
    assert len(report) == 3  # the two combine instances differ by name
    assert report[-1].startswith(f"{MAIN}: 240 registers, 0 bytes stack frame")


def test_ptxas_report_of_a_build_that_compiled_nothing(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("ninja: no work to do.\n")
    assert build_flashmla.ptxas_report(log) == []


def test_src_must_be_a_flashmla_checkout(tmp_path):
    src = make_checkout(tmp_path)
    build_flashmla.check_src(src)
    (src / "csrc/sm90/decode/dense/instantiations/bf16.cu").unlink()
    with pytest.raises(BuildError, match="has no csrc/sm90/decode/dense/instantiations/bf16.cu"):
        build_flashmla.check_src(src)


def test_cutlass_given_must_hold_the_headers(tmp_path):
    src = make_checkout(tmp_path / "src")
    with pytest.raises(BuildError, match="--cutlass .* is not a CUTLASS root"):
        build_flashmla.find_cutlass(src, tmp_path)
    cutlass = make_cutlass(tmp_path / "cutlass")
    assert build_flashmla.find_cutlass(src, cutlass) == cutlass


def test_cutlass_defaults_to_the_submodule_then_flashinfers(tmp_path, monkeypatch):
    src = make_checkout(tmp_path / "src")
    # A flashinfer that must not be imported, only found.
    package = tmp_path / "site" / "flashinfer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(BuildError, match="pass --cutlass DIR"):
        build_flashmla.find_cutlass(src, None)
    shipped = make_cutlass(package / "data" / "cutlass")
    assert build_flashmla.find_cutlass(src, None) == shipped
    assert "flashinfer" not in sys.modules
    submodule = make_cutlass(src / "csrc" / "cutlass")
    assert build_flashmla.find_cutlass(src, None) == submodule


def test_toolkit_is_where_nvcc_says_not_where_its_wrapper_is(tmp_path, monkeypatch):
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    nvcc = toolkit / "bin" / "nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "#$ TOP={toolkit}/bin/.." >&2\n')
    nvcc.chmod(0o755)
    wrappers = tmp_path / "wrappers"
    wrappers.mkdir()
    (wrappers / "nvcc").write_text(f'#!/bin/sh\nexec {nvcc} "$@"\n')
    (wrappers / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", str(wrappers))
    monkeypatch.setenv("CUDA_HOME", "")  # unset, and restored after
    monkeypatch.setenv("CUDA_PATH", "")
    assert build_flashmla.find_toolkit() == toolkit.resolve()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.setenv("CUDA_HOME", "")
    with pytest.raises(BuildError, match="no nvcc on PATH"):
        build_flashmla.find_toolkit()


def test_command_line(tmp_path):
    with pytest.raises(SystemExit):
        build_flashmla.parse_args([])  # --src is required
    with pytest.raises(SystemExit):
        build_flashmla.parse_args(["--src", str(tmp_path), "--jobs", "0"])
    args = build_flashmla.parse_args(["--src", str(tmp_path), "--jobs", "3"])
    assert (args.src, args.cutlass, args.jobs) == (tmp_path, None, 3)


def test_a_missing_checkout_fails_in_one_line(tmp_path, caplog):
    assert build_flashmla.main(["--src", str(tmp_path)]) == 1
    assert "is not a FlashMLA checkout" in caplog.text
