"""The scripts' command-line parsing, standard library only, so that a script refuses a bad
argument (one line, exit code 2) before it imports PyTorch or the environments."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn


class ScriptParser(argparse.ArgumentParser):
    """The scripts' ``argparse.ArgumentParser``: a bad argument ends with one line,
    ``PROG: error: MESSAGE``, and exit code 2 (argparse prints its usage first)."""

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE`` on stderr and exit with code 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= minimum`` (argparse names the argument when it
    is not)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value
    return parse


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number ``> 0`` (argparse names the argument when it is
    not)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number > 0")
    return value
