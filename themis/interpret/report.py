"""Pictures of preprocessed rewards, and their section of the run report.

Each command writes its pictures and a Markdown fragment (``*.md``) into an output folder; for a
run, that folder is ``RUN_DIR/interpret/`` and
:func:`themis.interpret.inspection.interpret_section` puts the fragments into
``report/report.md`` (also when the report is written later by
``scripts/inspect_reward.py``). :func:`update_report` refreshes that section in an existing
report.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from themis.core.figures import pyplot, save_figure
from themis.interpret.gridworld import GridMDP, cell_map
from themis.interpret.inspection import (
    INTERPRET_BEGIN,
    INTERPRET_END,
    affine_alignment,
    interpret_section,
)


def plot_grid_preprocessing(frame: np.ndarray | None, mdp: GridMDP, raw: np.ndarray,
                            preprocessed: np.ndarray, true: np.ndarray, potential: np.ndarray,
                            path: str | Path, title: str = "") -> Path:
    """Four heatmaps over the grid: the raw learned reward, the preprocessed one, the true
    reward (each the mean over the transitions that step into a cell) and the potential Φ (mean
    over the states with the agent on a cell).

    Args:
        frame: the rendered grid (drawn under the maps), or ``None``.
        mdp: the transition table.
        raw, preprocessed, true: ``(T,)`` rewards per transition.
        potential: ``(S,)``.
    """
    plt = pyplot()
    phi_total = np.zeros((mdp.width, mdp.height))
    phi_count = np.zeros((mdp.width, mdp.height))
    np.add.at(phi_total, (mdp.positions[:, 0], mdp.positions[:, 1]), potential)
    np.add.at(phi_count, (mdp.positions[:, 0], mdp.positions[:, 1]), 1)
    phi = np.where(phi_count > 0, phi_total / np.maximum(phi_count, 1), np.nan)
    panels = [(cell_map(mdp, raw), "raw r̂ (stepping into a cell)"),
              (cell_map(mdp, preprocessed), "preprocessed r' (same steps)"),
              (cell_map(mdp, true), "true reward (same steps)"),
              (phi, "potential Φ (mean per cell)")]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.6))
    extent = (0, mdp.width, mdp.height, 0)
    for ax, (values, name) in zip(axes, panels, strict=True):
        if frame is not None:
            ax.imshow(frame, extent=extent)
        finite = values[np.isfinite(values)]
        bound = float(np.abs(finite).max()) if finite.size else 1.0
        im = ax.imshow(np.ma.masked_invalid(values.T), extent=extent, cmap="coolwarm",
                       vmin=-bound or -1, vmax=bound or 1, alpha=0.75)
        fig.colorbar(im, ax=ax, fraction=0.046)
        ax.set_title(name, fontsize=9)
        ax.set_axis_off()
    return save_figure(fig, path, title)


def plot_preprocessed_curves(episodes: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                             path: str | Path, title: str = "") -> Path:
    """One panel per episode: the true reward, and the raw and preprocessed learned rewards,
    each aligned to the true one by least squares (``a · r + b``; the learned reward is defined
    only up to a positive affine map).

    Args:
        episodes: ``(true (T,), raw (T,), preprocessed (T,))`` per episode.
    """
    plt = pyplot()
    fig, axes = plt.subplots(len(episodes), 1, figsize=(9, 2.4 * max(1, len(episodes))),
                             squeeze=False)
    for ax, (true, raw, pre) in zip(axes[:, 0], episodes, strict=True):
        t = np.arange(len(true))
        ax.plot(t, true, color="black", lw=1.2, label="true reward")
        for values, colour, name in ((raw, "tab:red", "raw r̂ (aligned)"),
                                     (pre, "tab:blue", "preprocessed r' (aligned)")):
            a, b = affine_alignment(values, true)
            ax.plot(t, a * values + b, color=colour, lw=1.0, label=name)
        ax.set_ylabel("reward")
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("episode step")
    return save_figure(fig, path, title, dpi=100)


def update_report(run_dir: str | Path) -> Path | None:
    """Refresh the interpretability section of ``RUN_DIR/report/report.md`` (if the report
    exists) from the fragments in ``RUN_DIR/interpret/``.

    Returns:
        the report's path, or ``None`` when there is no report yet.
    """
    report = Path(run_dir) / "report" / "report.md"
    if not report.is_file():
        return None
    text = report.read_text()
    section = "\n".join(interpret_section(Path(run_dir)))
    pattern = re.compile(re.escape(INTERPRET_BEGIN) + ".*?" + re.escape(INTERPRET_END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        marker = "\n## Teacher"
        at = text.find(marker)
        text = text[:at] + "\n" + section + "\n" + text[at:] if at >= 0 else \
            text + "\n" + section + "\n"
    report.write_text(text)
    return report
