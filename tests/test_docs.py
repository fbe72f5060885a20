"""The repository a newcomer clones: a license, and no pointer to a
document that is not there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_named_documents_exist():
    """Docstrings and comments point only to documents in the repository."""
    sources = sorted((REPO / "mla_verify").glob("*.py")) + [REPO / "tuning" / "README.md"]
    missing = {
        (path.name, name)
        for path in sources
        for name in re.findall(r"\b([A-Za-z_]+\.md)\b", path.read_text())
        if not (REPO / name).exists() and not (path.parent / name).exists()
    }
    assert not missing


def test_the_license_is_the_one_pyproject_declares():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()
