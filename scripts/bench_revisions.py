"""``rev:<git rev>`` contenders' package: this package as it was at another
commit (or in a directory exported from one), exported and imported beside
the working tree's under a name of its own, once per commit."""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

from mla_verify.tables import ENV_VAR as CONFIG_DIR_VAR

REPO_ROOT = Path(__file__).resolve().parents[1]

REV_PREFIX = "rev:"
# rev:<git rev>:triton: that revision's portable Triton kernel with its own
# block_config(..., kernel="triton"), as the ``triton`` contender is.
REV_TRITON_SUFFIX = ":triton"
# rev:<git rev>:step: that revision's paged call given the step's metadata,
# as the ``paged_step`` contender is (-page rows only).
REV_STEP_SUFFIX = ":step"


def _rev_name(commit: str, kernel: str | None = None, step: bool = False) -> str:
    """A revision contender's name: its commit (or directory name), so that
    rows keep their meaning after branches move; ``:triton`` for its
    portable kernel, ``:step`` for its paged call given the step's metadata."""
    suffix = (REV_TRITON_SUFFIX if kernel == "triton" else "") + (REV_STEP_SUFFIX if step else "")
    return f"{REV_PREFIX}{commit[:12]}{suffix}"


@dataclass(frozen=True)
class Revision:
    """The package as it was at ``commit`` (its sha, or the name of the
    directory it was exported to), imported beside the working tree's as
    ``module``; ``given``: the rev as the command line named it."""

    given: str
    commit: str
    module: types.ModuleType
    kernel: str | None = None  # "triton": its portable kernel, not ``tuned``
    step: bool = False  # its paged call given the step's metadata (``paged_step``)

    @property
    def name(self) -> str:
        return _rev_name(self.commit, self.kernel, self.step)


loaded_revisions: dict[str, Revision] = {}  # contender name -> its revision, imported once

# What the package names absolutely (its imports are relative), rewritten
# to a revision's own package name: its torch.library namespace
# (registered process-wide in ops.py, called by name in paged.py: a second
# registration of a name fails) and the package of its shipped tables
# (tables.py: else the working tree's tables would fill its gaps).
_ABSOLUTE_NAMES = re.compile(r"\bmla_verify(?=::|\.configs\b)|(?<=torch\.ops\.)mla_verify\b")


def run_git(*args: str) -> subprocess.CompletedProcess:
    """git in this script's repository, output as bytes."""
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, timeout=60)


def resolve_commit(rev: str) -> str:
    """The full sha of the commit ``rev`` names in the repository of this
    script; ValueError if none (or no git history here)."""
    try:
        result = run_git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"not a commit of {REPO_ROOT} ({exc})") from None
    if result.returncode != 0:
        why = " ".join(result.stderr.decode(errors="replace").split())
        raise ValueError(f"not a commit of {REPO_ROOT}" + (f" ({why})" if why else ""))
    return result.stdout.decode().strip()


@functools.cache
def _export_root() -> Path:
    """The temporary directory of this process's exports, removed at exit."""
    root = Path(tempfile.mkdtemp(prefix="mla_verify_revs_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def _export(commit: str) -> Path:
    """``mla_verify/`` and (where it has one) ``configs/`` of ``commit`` in a
    fresh directory, the package renamed to ``mla_verify_rev_<sha>`` and
    its absolute names rewritten to that; returns the package directory."""
    dest = Path(tempfile.mkdtemp(prefix=f"{commit[:12]}_", dir=_export_root()))
    has_configs = run_git("cat-file", "-e", f"{commit}:configs").returncode == 0
    archive = run_git("archive", commit, "mla_verify", *(["configs"] if has_configs else []))
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {commit}: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return _as_package(dest, commit[:12])


def _copy(source: Path, label: str) -> Path:
    """``_export`` of a directory holding ``mla_verify/`` (and ``configs/``):
    a revision exported beforehand, where the checkout has no git history
    (the lent GPU machines get a copy of the working tree without it)."""
    dest = Path(tempfile.mkdtemp(prefix=f"{label}_", dir=_export_root()))
    for part in ("mla_verify", "configs"):
        if (source / part).is_dir():
            shutil.copytree(
                source / part, dest / part, ignore=shutil.ignore_patterns("__pycache__")
            )
    return _as_package(dest, label)


def _as_package(dest: Path, label: str) -> Path:
    """``dest/mla_verify`` renamed to ``mla_verify_rev_<label>``, its absolute
    names rewritten to that; returns the package directory."""
    package = dest / f"mla_verify_rev_{label}"
    (dest / "mla_verify").rename(package)
    for path in package.rglob("*.py"):
        path.write_text(_ABSOLUTE_NAMES.sub(package.name, path.read_text()))
    return package


def load_revision(rev: str) -> Revision:
    """The package at ``rev`` (a git rev, or a directory holding the
    ``mla_verify/`` and ``configs/`` of one, e.g. from ``git archive``),
    exported and imported under its own name, once per commit (directory).
    Tables load at import: the revision's are its own shipped ones,
    $MLA_VERIFY_CONFIG_DIR pointing at its ``configs/`` while it imports
    (the user dir still below them, as for ``tuned``)."""
    source = Path(rev)
    if (source / "mla_verify").is_dir():
        commit = re.sub(r"\W", "_", source.resolve().name)
        export = functools.partial(_copy, source, commit)
    else:
        commit = resolve_commit(rev)
        export = functools.partial(_export, commit)
    name = _rev_name(commit)
    if name not in loaded_revisions:
        package = export()
        configs = package.parent / "configs"
        previous = os.environ.get(CONFIG_DIR_VAR)
        os.environ[CONFIG_DIR_VAR] = str(configs) if configs.is_dir() else ""
        sys.path.insert(0, str(package.parent))
        try:
            module = importlib.import_module(package.name)
        finally:
            sys.path.remove(str(package.parent))
            if previous is None:
                del os.environ[CONFIG_DIR_VAR]
            else:
                os.environ[CONFIG_DIR_VAR] = previous
        loaded_revisions[name] = Revision(rev, commit, module)
    return loaded_revisions[name]
