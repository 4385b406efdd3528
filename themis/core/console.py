"""The terminal shared by the run's progress bars and a person's prompts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tqdm import tqdm


@contextlib.contextmanager
def progress_bars_paused() -> Iterator[None]:
    """Clear the run's progress bars and keep them off the terminal inside the ``with`` block,
    then draw them again: while a person reads a question and types the answer, no bar redraws
    itself over the prompt (tqdm's monitor thread refreshes a bar that has been still for
    ``maxinterval`` seconds, and every :meth:`themis.run.logger.Logger.info` redraws it after its
    line).
    """
    with tqdm.get_lock():
        paused = [bar for bar in list(getattr(tqdm, "_instances", ())) if not bar.disable]
        for bar in paused:
            bar.clear(nolock=True)
            bar.disable = True  # refresh() and clear() do nothing while disabled
    try:
        yield
    finally:
        with tqdm.get_lock():
            for bar in paused:
                bar.disable = False
                bar.refresh(nolock=True)


def close_progress_bars() -> None:
    """Close (and so clear) every progress bar, e.g. before the last line of a run that was
    stopped, which would otherwise be printed after the bar on its line."""
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
