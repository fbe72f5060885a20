"""The repository a newcomer clones: the README's two commands (the second
is what CI runs), its title first, a license, and no pointer to a document
that is not there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def readme_commands() -> list[str]:
    """The commands of the README's first code block."""
    block = re.search(r"```bash\n(.*?)```", README, re.DOTALL).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_opens_with_its_title_then_the_two_commands():
    lines = README.splitlines()
    assert lines[0] == "# mla_verify"
    first_block = README.index("```bash")
    assert "\n## " not in README[:first_block]  # the commands come before any section
    install_and_run, install_and_test = readme_commands()[:2]
    # A plain install runs the main job: no extra it would need.
    assert install_and_run == 'pip install "torch==2.13.0" -e . && python -m mla_verify'
    assert install_and_test.endswith("&& python -m pytest")
    assert '-m "not slow"' in README


def test_ci_runs_the_readmes_test_command():
    install_and_test = readme_commands()[1]
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert install_and_test in ci


def test_named_documents_exist():
    """Docstrings and comments point only to documents in the repository."""
    sources = sorted((REPO / "mla_verify").glob("*.py")) + [REPO / "tuning" / "README.md"]
    missing = {
        (path.name, name)
        for path in sources
        for name in re.findall(r"\b([A-Za-z_][A-Za-z_/]*\.md)\b", path.read_text())
        if not (REPO / name).exists() and not (path.parent / name).exists()
    }
    assert not missing


def test_the_license_is_the_one_pyproject_declares():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()
