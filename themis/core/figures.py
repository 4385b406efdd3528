"""Figures written to files: matplotlib's non-interactive backend, and one way to finish them.

Every plot of Themis (learning curves, reward curves and maps, feature visualisation,
attribution summaries) is drawn on ``pyplot()`` and written by :func:`save_figure`, so no
figure opens a window on a headless machine and none is left open in a long run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the ``Agg`` backend (files only, no display needed); imported
    when the first figure is drawn, not when Themis is. A backend someone chose is kept: one
    named by ``MPLBACKEND`` (Jupyter's kernel names its inline one there) or that of a pyplot
    already imported (switching would close the user's figures and, in a notebook, stop every
    later figure from showing)."""
    import os
    import sys

    import matplotlib

    if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, title: str = "", dpi: int = 90) -> Path:
    """Give ``fig`` its ``title`` (if any), lay it out, write it to ``path`` at ``dpi`` and
    close it. Returns ``path``."""
    path = Path(path)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
