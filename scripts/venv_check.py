"""Imported first by every script: a script started by another Python than the one Themis is
installed in (``python scripts/summarize.py`` with the system's Python) runs again with the
repository's ``.venv`` Python (made by ``bash scripts/setup.sh``); without one it ends with one
line that says how to set it up. Standard library only."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
AGAIN = "THEMIS_SCRIPT_REEXEC"
"""Set when the script was started again with ``.venv``'s Python (no second attempt)."""
NEEDED = ("numpy", "pandas", "torch", "themis")


def ready() -> bool:
    """Whether this Python has Themis and its packages."""
    return all(importlib.util.find_spec(name) is not None for name in NEEDED)


def use_themis_python() -> None:
    """Continue in this Python if it has Themis, else start the script again with ``.venv``'s
    Python, else exit 2 with one line."""
    if ready():
        return
    python = VENV / "bin" / "python"
    here = Path(sys.prefix).resolve() == VENV.resolve()
    if python.is_file() and not here and not os.environ.get(AGAIN):
        os.environ[AGAIN] = "1"
        os.execv(str(python), [str(python), *sys.argv])
    where = "its .venv lacks them" if here or os.environ.get(AGAIN) else \
        f"{sys.executable} has no Themis and there is no .venv"
    print(f"{Path(sys.argv[0]).name}: error: Themis's packages are missing ({where}); run "
          "bash scripts/setup.sh once, then source .venv/bin/activate", file=sys.stderr)
    sys.exit(2)


use_themis_python()
