"""What the package's command lines share (``python -m mla_verify``, the
tuner, the scripts)."""

from __future__ import annotations

import argparse
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, exit status 2, not the
    usage (the options are many): ``prog: error: message (see --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
