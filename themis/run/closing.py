"""The end of a run: :func:`finish` when it reached its last step (the answers that arrived
since the last round, final checkpoints, the learning curve, the trackers' last files) and
:func:`stop` after Ctrl-C or an error (servers, logs and envs closed; nothing saved)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from themis.core.console import close_progress_bars
from themis.run.logger import plot_learning_curve
from themis.run.plan import stop_line
from themis.tracking import run_files

if TYPE_CHECKING:
    from themis.run.workspace import Workspace


def stop(ws: Workspace, launcher: str) -> str:
    """After Ctrl-C: stop the labeling server and the background learner, close the logs,
    envs and progress bar, and return the one line to print — the step reached, the last
    checkpoint and the command that continues from it (``launcher resume=RUN_DIR``).

    Nothing is saved here (the interrupted step may be half done); a person's answers are
    saved as given, and web answers wait in the label store for ``resume=``."""
    if ws.learner is not None:  # async: the learner process saves its labels and stops
        ws.learner.close()
    if ws.label_server is not None:
        ws.label_server.stop()
        ws.label_server = None
    ws.logger.close()
    if ws.tracking is not None:
        ws.tracking.close("KILLED")
    close_progress_bars()
    for env in (ws.env, ws.eval_env):
        env.close()
    return stop_line(ws, launcher)


def finish(ws: Workspace) -> None:
    """Final checkpoints (a finished run can be extended with resume= and a larger
    num_train_steps), learning-curve PNG, closing of the logs.

    Web: the labeling server stops first, then the answers that arrived since the last
    round are gathered, saved and trained on — also those of queries answered by fewer
    people than ``labels_per_query`` (as they are; those queries are closed) — so every
    answer the server accepted is in ``preferences/``. (Answers given later to
    ``scripts/label_server.py`` wait in the store for ``resume=``.)"""
    if ws.label_server is not None:
        ws.label_server.stop()
        ws.label_server = None
        ws.logger.info("labeling server stopped; keep labeling this run with "
                       f"scripts/label_server.py {ws.run_dir}", "cyan")
    if ws.learner is not None:  # async: the process's last gather and save; its last
        ws.learner.close()  # version is taken (sync: nothing)
        if ws.learner.unsaved_answers():  # sync, web
            ws.feedback_round(ask=False, final=True)
    ws.maybe_checkpoint(force=True)
    ws.save_checkpoints(finished=True)  # last: a kill before it resumes and ends again
    ws.logger.close()
    for env in (ws.env, ws.eval_env):  # frees renderers (OSMesa/EGL contexts) in order
        env.close()
    eval_csv = ws.run_dir / "eval.csv"
    if eval_csv.exists():
        plot_learning_curve(eval_csv, ws.run_dir / "learning_curve.png",
                            title=f"{ws.facts.env_id}: {ws.title}")
    if ws.tracking is not None:  # curve, report, clips; then the tracked run ends
        files = run_files(ws.cfg.logger, ws.run_dir, ws.tracking.warn) \
            if ws.tracking.active else None  # no report for trackers that are gone
        ws.tracking.close("FINISHED", files)
    ws.logger.info(f"done: {ws.run_dir}", "cyan")
