"""Build FlashMLA's SM90 dense decode, bf16 only, for the benchmark's ``flashmla`` contender.

    python scripts/build_flashmla.py --src ~/FlashMLA [--cutlass DIR] [--jobs N]

``--src`` is a FlashMLA checkout fetched apart from this repository (an
ignored folder inside it will do), and the build writes only there, as
``setup.py build_ext --inplace`` would: the module
``flash_mla/cuda<ext suffix>.so``, which FlashMLA's ``flash_mla_interface.py``
imports as ``flash_mla.cuda``, and its objects under ``build/``. Nothing of
FlashMLA becomes part of this repository. The script then imports
``flash_mla`` from ``--src`` and prints the ``PYTHONPATH`` under which
``scripts/bench.py`` finds it.

It builds what the benchmark calls and nothing more: ``flash_mla_with_kvcache``
on a bf16 cache of 64-token pages on SM90. That is the scheduling-metadata and
combine kernels, the bf16 instantiation of the dense split-KV kernel, and a
binding this script writes that exposes ``dense_decode_fwd`` alone (FlashMLA's
own ``csrc/api/api.cpp`` also binds its sparse and SM100 kernels), compiled
with FlashMLA's own nvcc flags for ``-gencode arch=compute_90a,code=sm_90a``
and ``-DFLASH_MLA_DISABLE_FP16``. So CUTLASS's headers suffice (the CUTLASS 4.2
that the flashinfer wheel ships under ``flashinfer/data/cutlass`` does), and
the build takes under two minutes, most of it bf16.cu alone (so more than
four jobs gain nothing). ptxas's report of each kernel (registers, stack,
spills) is logged; the compilers' whole output is in
``build/mla_verify_sm90_bf16/build.log`` under ``--src``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

logger = logging.getLogger("build_flashmla")

# Relative to --src. The sources, then what else must be there: the header the
# binding includes and the Python package that imports the result.
SOURCES = (
    "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu",
    "csrc/smxx/decode/combine/combine.cu",
    "csrc/sm90/decode/dense/instantiations/bf16.cu",
)
REQUIRED = (
    *SOURCES,
    "csrc/api/dense_decode.h",
    "flash_mla/__init__.py",
    "flash_mla/flash_mla_interface.py",
)
INCLUDE_DIRS = ("csrc", "csrc/sm90", "csrc/kerutils/include")
CUTLASS_INCLUDE_DIRS = ("include", "tools/util/include")  # relative to --cutlass
BUILD_DIR = "build/mla_verify_sm90_bf16"
MODULE = "cuda"  # flash_mla_interface.py does `import flash_mla.cuda`

FEATURES = ["-DFLASH_MLA_DISABLE_FP16"]
CXX_FLAGS = ["-O3", "-std=c++20", "-DNDEBUG", "-Wno-deprecated-declarations", *FEATURES]
NVCC_FLAGS = [
    "-O3",
    "-std=c++20",
    "-DNDEBUG",
    "-D_USE_MATH_DEFINES",
    "-Wno-deprecated-declarations",
    # torch's extension build defines the __CUDA_NO_*__ macros; FlashMLA's kernels
    # use the operators and conversions they hide.
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills,"
    "--warn-on-local-memory-usage,--warn-on-double-precision-use",
    "-lineinfo",
    "--source-in-ptx",
    *FEATURES,
    "-gencode",
    "arch=compute_90a,code=sm_90a",
]

# Headers that torch's ATen/cuda/CUDAContext.h includes beyond the CUDA runtime.
LIBRARY_HEADERS = ("cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h")

BINDING = """\
// Written by mla_verify's scripts/build_flashmla.py: FlashMLA's SM90 dense decode alone.
#include <torch/extension.h>

#include "api/dense_decode.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("dense_decode_fwd", &dense_attn_decode_interface);
}
"""

_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\w+)")
_REGISTERS = re.compile(r"Used (\d+) registers")


class BuildError(Exception):
    """Why the build cannot go on, in words the user can act on."""


# --- what the build needs ------------------------------------------------------------------


def check_src(src: Path) -> None:
    for rel in REQUIRED:
        if not (src / rel).is_file():
            raise BuildError(f"--src {src} is not a FlashMLA checkout: it has no {rel}")


def is_cutlass_root(path: Path) -> bool:
    return (path / "include/cutlass/cutlass.h").is_file() and (path / "tools/util/include").is_dir()


def find_cutlass(src: Path, given: Path | None) -> Path:
    """--cutlass; else FlashMLA's own submodule, where it is checked out; else
    the CUTLASS that an installed flashinfer ships (found, not imported)."""
    if given is not None:
        if not is_cutlass_root(given):
            raise BuildError(
                f"--cutlass {given} is not a CUTLASS root: it needs include/cutlass/cutlass.h "
                "and tools/util/include/"
            )
        return given
    submodule = src / "csrc" / "cutlass"
    if is_cutlass_root(submodule):
        return submodule
    spec = importlib.util.find_spec("flashinfer")
    for root in (spec.submodule_search_locations or []) if spec else []:
        shipped = Path(root) / "data" / "cutlass"
        if is_cutlass_root(shipped):
            return shipped
    raise BuildError(
        f"no CUTLASS headers: {submodule} is not checked out and no installed flashinfer "
        "ships them; pass --cutlass DIR, a CUTLASS root holding include/ and tools/util/include/"
    )


def find_toolkit() -> Path:
    """The CUDA toolkit: $CUDA_HOME, else the one the nvcc on PATH reports as
    its root (right also where that nvcc is a wrapper script). Exported as
    CUDA_HOME for torch.utils.cpp_extension, which reads it on import."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        root = Path(home)
    else:
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            raise BuildError(
                "no nvcc on PATH and no CUDA_HOME: building FlashMLA needs CUDA's compiler"
            )
        dry = subprocess.run(
            [nvcc, "--dryrun", "-c", "-x", "cu", "-o", os.devnull, os.devnull],
            capture_output=True,
            text=True,
        )
        top = re.search(r"^#\$ TOP=(.*)$", dry.stdout + dry.stderr, re.MULTILINE)
        root = Path(top.group(1).strip()) if top else Path(nvcc).parent.parent
    root = root.resolve()
    if not (root / "bin" / "nvcc").exists():
        raise BuildError(f"no nvcc in the CUDA toolkit {root} (bin/nvcc): set CUDA_HOME")
    os.environ["CUDA_HOME"] = str(root)
    return root


def check_torch() -> str:
    try:
        import torch
    except ImportError:
        raise BuildError("torch is not installed: FlashMLA builds as a torch extension") from None
    if torch.version.cuda is None:
        raise BuildError(
            f"torch {torch.__version__} is built without CUDA: FlashMLA's module links "
            "against torch's CUDA libraries; install a CUDA build of torch"
        )
    return f"torch {torch.__version__} (CUDA {torch.version.cuda})"


def host_include_flags(toolkit: Path) -> list[str]:
    """-isystem folders for the binding, which the host compiler builds,
    searched after the toolkit's include/: CUDA 13's libcu++ (CUTLASS includes
    <cuda/std/...>), which nvcc finds by itself; and where the toolkit lacks the
    headers of the CUDA libraries torch's headers include (a toolkit assembled
    from pip packages), the nvidia wheels' that torch was installed with."""
    dirs = [toolkit / "include" / "cccl"]
    spec = importlib.util.find_spec("nvidia")
    wheels = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    for header in LIBRARY_HEADERS:
        if (toolkit / "include" / header).exists():
            continue
        found = [h.parent for w in wheels for h in sorted(w.glob(f"*/include/{header}"))]
        if found:
            dirs.append(found[0])
        else:
            logger.warning("%s is in neither %s/include nor the nvidia wheels", header, toolkit)
    flags: list[str] = []
    for d in dict.fromkeys(dirs):  # in order, once each
        if d.is_dir():
            flags += ["-isystem", str(d)]
    return flags


# --- the build -----------------------------------------------------------------------------


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """File descriptors 1 and 2 into `log`: ninja writes the compilers' output
    (ptxas's report among it) to descriptor 1 itself, past sys.stdout."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with log.open("wb") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        for fd in saved:
            os.close(fd)


def build(src: Path, cutlass: Path, toolkit: Path, jobs: int) -> tuple[Path, Path]:
    """Compile and link in <src>/build/..., then put the module beside
    FlashMLA's interface. Returns (module, build log)."""
    from torch.utils import cpp_extension  # after find_toolkit has set CUDA_HOME

    build_dir = src / BUILD_DIR
    build_dir.mkdir(parents=True, exist_ok=True)
    binding = build_dir / "dense_decode_binding.cpp"
    if not binding.is_file() or binding.read_text() != BINDING:  # else ninja recompiles it
        binding.write_text(BINDING)
    # torch's build lock; one left by a killed build would hold this one for ever.
    (build_dir / "lock").unlink(missing_ok=True)
    os.environ["MAX_JOBS"] = str(jobs)
    includes = [src / d for d in INCLUDE_DIRS] + [cutlass / d for d in CUTLASS_INCLUDE_DIRS]
    host_flags = host_include_flags(toolkit)
    log = build_dir / "build.log"
    try:
        with output_to(log):
            cpp_extension.load(
                name=MODULE,
                sources=[str(src / s) for s in SOURCES] + [str(binding)],
                extra_cflags=CXX_FLAGS + host_flags,
                extra_cuda_cflags=NVCC_FLAGS,
                extra_include_paths=[str(d) for d in includes],
                build_directory=str(build_dir),
                verbose=True,  # else torch drops ninja's output, ptxas's report with it
                # else load() imports it as the top-level `cuda`, cuda-bindings' name;
                # this way it only loads the library, as torch.ops does.
                is_python_module=False,
            )
    except (RuntimeError, OSError) as exc:
        tail = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
        raise BuildError(
            f"the build failed ({exc}); the end of {log}:\n" + "\n".join(tail)
        ) from None
    module = src / "flash_mla" / f"{MODULE}{sysconfig.get_config_var('EXT_SUFFIX')}"
    shutil.copyfile(build_dir / f"{MODULE}.so", module)
    return module, log


def ptxas_report(log: Path) -> list[str]:
    """One line a kernel from ptxas's -v report in the build log: its
    registers, then its stack frame and spills."""
    entry = properties = None
    frames: dict[str, str] = {}
    kernels: list[tuple[str, str]] = []
    for line in log.read_text(errors="replace").splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
        elif m := _PROPERTIES.search(line):
            properties = m.group(1)
        elif properties and "bytes stack frame" in line:
            frames[properties] = line.strip()
            properties = None
        elif entry and (m := _REGISTERS.search(line)):
            kernels.append((entry, f"{m.group(1)} registers, {frames.get(entry, '?')}"))
            entry = None
    names = demangle([name for name, _ in kernels])
    return list(dict.fromkeys(f"{names[name]}: {usage}" for name, usage in kernels))


def demangle(names: Sequence[str]) -> dict[str, str]:
    """Each mangled kernel name to its qualified name without template
    arguments (``sm90::flash_fwd_splitkv_mla_kernel``), where c++filt is there."""
    tool = shutil.which("c++filt")
    if not names or tool is None:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    plain = out.stdout.splitlines()
    if out.returncode != 0 or len(plain) != len(names):
        return {n: n for n in names}
    short = [re.sub(r"^void ", "", p).split("<")[0].split("(")[0] for p in plain]
    return dict(zip(names, short))


def check_import(src: Path) -> None:
    """``import flash_mla`` as the benchmark will: from --src, with the new module."""
    sys.path.insert(0, str(src))
    try:
        flash_mla = importlib.import_module("flash_mla")
    except Exception as exc:
        raise BuildError(f"import flash_mla failed: {type(exc).__name__}: {exc}") from None
    found = Path(flash_mla.__file__).resolve()
    if not found.is_relative_to(src):
        raise BuildError(f"import flash_mla found {found}, not the one in {src}")
    if not hasattr(flash_mla, "flash_mla_with_kvcache"):
        raise BuildError(f"{found} has no flash_mla_with_kvcache")


# --- command line --------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--src",
        type=Path,
        required=True,
        metavar="DIR",
        help="a FlashMLA checkout, fetched outside this repository; the build writes there",
    )
    parser.add_argument(
        "--cutlass",
        type=Path,
        metavar="DIR",
        help="a CUTLASS root holding include/ and tools/util/include/ (default: <src>/csrc/cutlass "
        "if checked out, else the data/cutlass of an installed flashinfer)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="parallel compiler jobs, as MAX_JOBS (default: %(default)s, the CPU count)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: expected an int >= 1, got {args.jobs}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    start = time.perf_counter()
    src = args.src.resolve()
    try:
        check_src(src)
        cutlass = find_cutlass(src, args.cutlass).resolve()
        toolkit = find_toolkit()
        versions = check_torch()
        logger.info(
            "building FlashMLA's SM90 dense decode (bf16) in %s with %d jobs: CUTLASS %s, "
            "CUDA toolkit %s, %s; compiler output in %s",
            src,
            args.jobs,
            cutlass,
            toolkit,
            versions,
            src / BUILD_DIR / "build.log",
        )
        module, log = build(src, cutlass, toolkit, args.jobs)
        report = ptxas_report(log)
        for line in report:
            logger.info("ptxas: %s", line)
        if not report:
            logger.info("no ptxas report in %s (nothing was recompiled?)", log)
        check_import(src)
    except BuildError as exc:
        logger.error("%s", exc)
        return 1
    elapsed = time.perf_counter() - start
    logger.info("built %s and imported flash_mla from %s in %.0f s", module, src, elapsed)
    path = os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH")) if p)
    logging.shutdown()
    print(f"PYTHONPATH={shlex.quote(path)} python3 scripts/bench.py --quick", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
