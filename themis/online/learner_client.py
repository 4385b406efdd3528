"""The agent side's connection to the background preference learner:
:class:`LearnerClient` starts the learner process (:mod:`themis.online.learner_process`) and waits
until it is ready, sends it the recorded steps without ever waiting for it, watches it for a
crash (raised in the agent's process as :class:`PreferenceLearnerError`), asks it to save its
labels, and closes it — also at interpreter exit.

Two classes build on it: :class:`themis.online.online_reward.OnlineReward` (the wrappers' r̂) and
:class:`themis.online.loop.LoopChannel` (Themis's own loops with ``reward_training=async``).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from themis.online.keys import OnlineKeys
from themis.online.learner_process import EnvSpec, main
from themis.online.segments import StepRecorder
from themis.online.weights import SharedWeights, flat_size
from themis.reward.ensemble import RewardEnsemble
from themis.utils import ConfigError

if TYPE_CHECKING:
    from themis.run.config import TrainConfig

START_TIMEOUT = 600.0
"""Seconds the constructor waits for the learner process to be ready (imports, a resumed
dataset, the fit of ``prefs_path``)."""

QUEUE_MESSAGES = 64
"""Step messages that may wait for the learner; when it falls further behind, the newest
steps are dropped (the agent never waits; a dropped message only thins the query pool)."""


class PreferenceLearnerError(RuntimeError):
    """The background preference learner stopped (a crash, or killed): raised in the agent's
    process at its next step, with the learner's last line."""


class LearnerClient:
    """The connection to one learner process. A subclass sets ``cfg`` (the run's
    :class:`themis.run.config.TrainConfig`), ``online`` (:class:`OnlineKeys`: ``close_timeout``),
    ``run_dir`` and ``frame_height`` (clips' frame size, ``None``: frames as given), calls
    :meth:`make_recorder`, then :meth:`start_learner`.

    Attributes:
        total_steps: env steps recorded so far (over all sub-envs).
        dropped: steps not sent because the learner's queue was full.
        error: the learner's crash line, ``None`` while it runs.
    """

    cfg: TrainConfig
    online: OnlineKeys
    run_dir: Path
    frame_height: int | None
    _closed = True  # until the process runs

    def make_recorder(self, n_envs: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype,
                      action_dim: int, total_steps: int = 0) -> None:
        """The step recorder of ``n_envs`` sub-envs, sent every ``max(256, 4 · segment ·
        n_envs)`` steps or each second (:meth:`stepped`)."""
        segment = self.cfg.segment
        self.total_steps = total_steps
        self.flush_steps = max(256, 4 * segment * n_envs)
        self.recorder = StepRecorder(n_envs, segment, obs_shape, obs_dtype, action_dim,
                                     self.flush_steps + segment)
        self.last_flush = time.monotonic()
        self.dropped = 0

    def start_learner(self, model: RewardEnsemble, spec: EnvSpec,
                      online_dict: dict[str, Any]) -> None:
        """Start the learner process (:func:`themis.online.learner_process.main`) for
        ``self.cfg`` and wait until it is ready; ``model`` gives the published weights' size.

        Raises:
            ConfigError: the learner refused the setup (one line).
            PreferenceLearnerError: it could not start.
        """
        ctx: Any = torch.multiprocessing.get_context(
            "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn")
        if ctx.get_start_method() == "forkserver":
            ctx.set_forkserver_preload(["themis.online.learner_process"])
        self.shared = SharedWeights(ctx, flat_size(model))
        self.queue = ctx.Queue(maxsize=QUEUE_MESSAGES)
        control_read, self.control = ctx.Pipe(duplex=False)
        self.status, status_write = ctx.Pipe(duplex=False)
        cfg = self.cfg
        threads = int(cfg.torch_threads) if str(cfg.torch_threads).isdigit() \
            and int(cfg.torch_threads) > 0 else 1
        terminal = cfg.human_teacher and cfg.teacher_ui == "terminal"
        self.process = ctx.Process(
            target=main, name="themis-learner", daemon=True,
            args=(cfg, online_dict, spec, str(self.run_dir), self.shared, self.queue,
                  control_read, status_write, os.getpid(), threads,
                  os.getpid() if terminal else None))
        self.process.start()
        control_read.close()
        status_write.close()
        self._closed = False
        self.error: str | None = None
        self.closed_info: dict[str, Any] | None = None
        self.saved_prefs = threading.Event()  # set when the learner wrote train/val_prefs
        self.saved_counts: dict[str, int] = {}
        self.wait_ready()
        self.monitor = threading.Thread(target=self._watch, name="themis-learner-watch",
                                        daemon=True)
        self.monitor.start()
        _LIVE.add(self)

    def wait_ready(self) -> None:
        """Wait for the learner's ``ready``; its refusal or crash is raised here.

        Raises:
            ConfigError: the learner refused the setup (one line).
            PreferenceLearnerError: it crashed or ended before it was ready.
        """
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.status.poll(0.2):
                try:
                    kind, payload = self.status.recv()
                except (EOFError, OSError):
                    break
                if kind == "ready":
                    self.ready = payload
                    return
                self._stop_process(0)
                if kind == "error":
                    raise ConfigError(payload)
                raise PreferenceLearnerError(f"the preference learner could not start: "
                                             f"{payload}")
            if not self.process.is_alive():
                break
        self._stop_process(0)
        hint = "" if self.process.exitcode == 0 else \
            (" (a script that makes the wrapper must keep its training code under "
             "`if __name__ == \"__main__\":`, as for any multiprocessing program)")
        raise PreferenceLearnerError(f"the preference learner process ended before it was "
                                     f"ready (exit code {self.process.exitcode}){hint}")

    def _watch(self) -> None:
        """The monitor thread: the learner's messages (``crash``, ``closed``) and its end."""
        while True:
            try:
                kind, payload = self.status.recv()
            except (EOFError, OSError):
                if not self._closed and self.error is None:
                    self.process.join(5)
                    self.error = (f"the preference learner process ended (exit code "
                                  f"{self.process.exitcode})")
                return
            if kind == "crash":
                self.error = f"the preference learner crashed: {payload}"
            elif kind == "closed":
                self.closed_info = payload
            elif kind == "saved":
                self.saved_counts = dict(payload)
                self.saved_prefs.set()

    def check(self) -> None:
        """Raise the learner's error in the agent's process.

        Raises:
            PreferenceLearnerError: the learner crashed or was killed.
        """
        if self.error is not None:
            raise PreferenceLearnerError(self.error)

    # ------------------------------------------------------------------ per step
    def record(self, i: int, obs: np.ndarray, action: np.ndarray, true_reward: float,
               terminated: bool, frame: np.ndarray | None = None) -> None:
        """Record sub-env ``i``'s step (see :meth:`StepRecorder.add`)."""
        if frame is not None and self.frame_height is not None:
            from themis.environments.frames import downscale

            frame = downscale(np.asarray(frame), self.frame_height)
        self.recorder.add(i, obs, action, true_reward, terminated, frame)

    def end_episode(self, i: int) -> None:
        """Sub-env ``i``'s episode ended after its last recorded step."""
        self.recorder.end_episode(i)

    def stepped(self, n: int) -> None:
        """``n`` env steps were recorded: send what is due to the learner."""
        self.total_steps += n
        if self.recorder.pending >= self.flush_steps or (
                self.recorder.pending and time.monotonic() - self.last_flush > 1.0):
            self.flush()

    def flush(self, block: bool = False) -> None:
        """Send the recorded runs to the learner (dropped when its queue is full)."""
        import queue

        pending = self.recorder.pending
        runs, ended = self.recorder.take()
        self.last_flush = time.monotonic()
        if not runs and not ended:
            return
        try:
            self.queue.put(("steps", runs, ended, self.total_steps), block=block,
                           timeout=5 if block else None)
        except queue.Full:
            if not self.dropped:
                print(f"themis: the preference learner is behind the agent: {pending} steps "
                      "were not sent to it (queries come from the steps it has; the agent does "
                      "not wait)", file=sys.stderr, flush=True)
            self.dropped += pending

    def save_prefs(self, timeout: float = 60.0) -> dict[str, int]:
        """Ask the learner to write its labels as ``train_prefs/`` and ``val_prefs/`` in the
        run dir (after the steps sent so far) and wait until it has.

        Returns:
            ``{"train": n, "val": m}``: the labels in each.

        Raises:
            PreferenceLearnerError: the learner crashed, or did not answer in ``timeout`` s.
        """
        self.check()
        self.saved_prefs.clear()
        self.flush(block=True)
        self.queue.put(("save_prefs",), timeout=timeout)
        if not self.saved_prefs.wait(timeout):
            self.check()
            raise PreferenceLearnerError(f"the preference learner did not save the "
                                         f"preferences within {timeout:.0f} s")
        return dict(self.saved_counts)

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """Send the last steps, let the learner gather the last answers and save, stop it.
        Waits at most ``close_timeout`` seconds, then stops it by force (what it saved stays:
        labels on disk, web answers in the label store for ``resume=True``)."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        if self.process.is_alive():
            import queue

            self.flush(block=True)
            try:
                self.queue.put(("close",), timeout=5)
            except queue.Full:
                try:
                    self.control.send("close")
                except OSError:
                    pass
        self._stop_process(self.online.close_timeout)

    def _stop_process(self, timeout: float) -> None:
        self._closed = True
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.queue.cancel_join_thread()  # nothing left to read it: never wait on it
        self.queue.close()
        self.control.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:
                pass


_LIVE: weakref.WeakSet[LearnerClient] = weakref.WeakSet()


@atexit.register
def _close_live() -> None:
    """At interpreter exit (also after Ctrl-C), close the learners still running: they save
    before multiprocessing's own exit handler would terminate them."""
    for core in list(_LIVE):
        try:
            core.close()
        except Exception:
            pass
