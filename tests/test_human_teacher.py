"""Human teacher in the terminal: clips, keys, labels saved as given, resume after a kill."""

from __future__ import annotations

import io
import os
import signal

import imageio_ffmpeg
import numpy as np
import pandas as pd
import pexpect
import pytest

from lib.human_interface import BANNER, GAP, KeyReader, TerminalTeacher, side_by_side, write_clip
from tests.conftest import ROOT, TINY_PENDULUM
from themis.environments.frames import FrameStore, downscale
from themis.run.closing import finish

SEGMENT = 20
FRAME = 64  # human_frame_size in the runs below
HUMAN_RUN = [o for o in TINY_PENDULUM if not o.startswith(("reward_batch", "segment"))] + [
    "reward_batch=4", f"segment={SEGMENT}", "human_teacher=true", "human_viewer=none",
    f"human_frame_size={FRAME}", "human_labeler=ann",
]
PROMPT = "which is better?"


# ------------------------------------------------------------------------------ units
def test_side_by_side_puts_segment_1_left_and_2_right_with_even_size():
    left = np.zeros((5, 31, 40, 3), dtype=np.uint8)
    right = np.full((5, 31, 40, 3), 200, dtype=np.uint8)
    clip = side_by_side(left, right)
    assert clip.shape == (5, 31 + BANNER + 1, 2 * 40 + GAP, 3)
    assert clip.shape[1] % 2 == 0 and clip.shape[2] % 2 == 0
    assert (clip[:, BANNER + 5:BANNER + 25, 5:35] == 0).all()
    assert (clip[:, BANNER + 5:BANNER + 25, 40 + GAP + 5:40 + GAP + 35] == 200).all()
    assert not np.array_equal(clip[0, :BANNER], clip[1, :BANNER])  # frame counter changes
    with pytest.raises(ValueError, match="equal"):
        side_by_side(left, right[:4])


@pytest.mark.parametrize("length,fps", [(8, 20), (12, 15), (50, 20)])
def test_write_clip_writes_every_frame_once_in_order(tmp_path, length, fps):
    frames = np.repeat((np.arange(length) * 5).astype(np.uint8), 32 * 48 * 3)
    frames = frames.reshape(length, 32, 48, 3)
    path = write_clip(frames, tmp_path / "clip.mp4", fps=fps)
    assert path.suffix == ".mp4"
    assert imageio_ffmpeg.count_frames_and_secs(str(path))[0] == length
    reader = imageio_ffmpeg.read_frames(str(path))
    next(reader)  # metadata
    means = [np.frombuffer(raw, np.uint8).mean() for raw in reader]
    np.testing.assert_allclose(means, np.arange(length) * 5, atol=2)


def test_frame_store_keeps_only_the_most_recent_frames():
    store = FrameStore(capacity=3, buffer_capacity=10, height=8)
    for slot in range(5):
        store.add(slot, np.full((16, 24, 3), slot, dtype=np.uint8))
    assert store.has(np.arange(5)).tolist() == [False, False, True, True, True]
    got = store.get(np.array([[2, 3], [4, 4]]))
    assert got.shape == (2, 2, 8, 12, 3) and got[0, 1].max() == 3 and got[1, 0].min() == 4
    with pytest.raises(KeyError):
        store.get(np.array([0]))
    assert downscale(np.zeros((100, 50, 3), np.uint8), 40).shape == (40, 20, 3)


def test_terminal_teacher_maps_keys_to_labels_reprompts_and_stops(tmp_path):
    # keys: left, right(R), junk, help, equal(E), skip(Enter), replay then left(l), quit
    answers = io.StringIO("1\nR\nx\n?\nE\n\nr\nl\nq\n")
    out = io.StringIO()
    teacher = TerminalTeacher(tmp_path, KeyReader(answers, piped=True), viewer="none", fps=5,
                              out=out)
    frames = np.zeros((7, 2, 3, 16, 16, 3), dtype=np.uint8)
    given: list[tuple[int, float | None]] = []
    result = teacher.ask(frames, lambda i, label: given.append((i, label)))
    assert given == [(0, 0.0), (1, 1.0), (2, 0.5), (3, None), (4, 0.0)]
    assert result.asked == 5 and result.stopped
    assert result.keep == [True, True, True, False, True]
    text = out.getvalue()
    assert text.count("1/L left better") == 2  # junk key and ? both show the help line
    assert text.count("query_000004.mp4") == 2  # replayed
    assert "2 queries not asked" in text


def test_the_runs_instructions_come_before_the_first_query_and_with_help(tmp_path, compose):
    from omegaconf import OmegaConf

    from lib.label_server import read_instructions
    from themis.feedback.factory import label_instructions
    from themis.utils import ConfigError

    out = io.StringIO()
    teacher = TerminalTeacher(tmp_path, KeyReader(io.StringIO("1\n?\n2\n"), piped=True),
                              viewer="none", fps=5, out=out)
    teacher.instructions = "Better = the pendulum stays upright."
    teacher.ask(np.zeros((2, 2, 3, 16, 16, 3), dtype=np.uint8), lambda i, label: None)
    text = out.getvalue()
    assert text.count("instructions: Better = the pendulum stays upright.") == 2  # first, ?
    assert text.index("instructions:") < text.index("[query 0")

    md = tmp_path / "better.md"
    md.write_text("# What is better\n\nStaying upright.\n")

    def cfg(*overrides: str):
        return OmegaConf.to_object(compose(list(overrides)))

    assert label_instructions(cfg("human_teacher=true", f"label_instructions={md}")) == \
        "# What is better\n\nStaying upright."
    with pytest.raises(ConfigError, match="cannot read it"):
        label_instructions(cfg("human_teacher=true", f"label_instructions={tmp_path}/no.md"))
    with pytest.raises(ConfigError, match="a synthetic teacher does not read them"):
        label_instructions(cfg("label_instructions=Upright"))
    # the page reads only a regular file of the run, never through a link
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "instructions.md").symlink_to(md)
    assert read_instructions(tmp_path) == ""
    from themis.builder import make_workspace  # a web run writes them where its page reads

    ws = make_workspace(compose([*HUMAN_RUN, "teacher_ui=web", f"label_instructions={md}"]),
                        tmp_path / "run")
    assert read_instructions(tmp_path / "run") == "# What is better\n\nStaying upright."
    ws.logger.close()


# ----------------------------------------------------------------- end to end in a pty
def spawn(*overrides: str) -> pexpect.spawn:
    env = {**os.environ, "THEMIS_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return pexpect.spawn(str(ROOT / "themis_train.sh"), list(overrides), cwd=str(ROOT), env=env,
                         encoding="utf-8", timeout=300, dimensions=(50, 400))


def answer(child: pexpect.spawn, keys: str) -> None:
    for key in keys:
        child.expect_exact(PROMPT)
        child.send(key)


@pytest.mark.slow
def test_a_person_labels_in_a_terminal_and_the_reward_model_trains_on_it(tmp_path):
    run = tmp_path / "run"
    child = spawn(*HUMAN_RUN, "max_feedback=8", f"hydra.run.dir={run}")
    # round 1: left, junk (re-prompt), right, equal, replay + skip (Enter)
    answer(child, "1x2" "0" "r\r")
    answer(child, "2" "1" "q")  # round 2: right, left, then stop the round
    answer(child, "q")  # round 3: stop at once
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before

    labels = pd.read_csv(run / "preferences" / "labels.csv")
    assert labels["label"].tolist() == [0.0, 1.0, 0.5, 1.0, 0.0]
    assert set(labels["labeler"]) == {"human:ann"} and labels["timestamp"].notna().all()
    reward = pd.read_csv(run / "reward.csv")
    assert reward["total_feedback"].tolist() == [4, 6, 6]  # the skip counts, unasked ones not
    assert reward["skipped"].tolist() == [1, 0, 0]
    assert reward["epochs"].iloc[0] > 0 and reward["train_accuracy"].notna().iloc[0]
    clips = sorted((run / "queries").glob("query_*.mp4"))
    assert len(clips) >= 7
    frames, _ = imageio_ffmpeg.count_frames_and_secs(str(clips[0]))
    assert frames == SEGMENT
    reader = imageio_ffmpeg.read_frames(str(clips[0]))
    width, height = next(reader)["size"]
    reader.close()
    pendulum_width = FRAME  # Pendulum renders square frames
    assert (width, height) == (2 * pendulum_width + GAP, FRAME + BANNER)


def visible_line(text: str) -> str:
    """What a terminal shows of the last line of ``text`` (``\\r`` returns to its start;
    colour codes dropped)."""
    import re

    line = re.sub(r"\x1b\[[0-9;]*m", "", text.rsplit("\n", 1)[-1])
    shown = ""
    for part in line.split("\r"):
        shown = part + shown[len(part):]
    return shown


@pytest.mark.slow
def test_the_progress_bar_is_off_the_terminal_while_a_person_is_asked(tmp_path):
    run = tmp_path / "run"
    child = spawn(*HUMAN_RUN, "max_feedback=4", "num_train_steps=500", f"hydra.run.dir={run}")
    child.expect_exact("clip: ")
    assert "step/s" in child.before  # the bar was running (a pty: tqdm draws it)
    assert visible_line(child.before).strip() == "", "the clip line starts behind the bar"
    child.expect_exact("q stop: ")
    with pytest.raises(pexpect.TIMEOUT):  # nothing is drawn over the question while it waits
        child.expect(r"\r|step/s", timeout=2)
    child.send("q")
    child.expect(r"\d+step/s")  # the bar is back once the person has answered
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before


@pytest.mark.slow
def test_no_answered_label_is_lost_when_the_run_is_killed_mid_labeling(tmp_path):
    run = tmp_path / "run"
    child = spawn(*HUMAN_RUN, f"hydra.run.dir={run}")
    answer(child, "1212")  # round 1 (a checkpoint follows the round)
    answer(child, "21")  # round 2: two answers, then the run dies at the third prompt
    child.expect_exact(PROMPT)
    os.kill(child.pid, signal.SIGKILL)
    child.close()
    assert pd.read_csv(run / "preferences" / "labels.csv")["label"].tolist() == [
        0.0, 1.0, 0.0, 1.0, 1.0, 0.0]

    resumed = spawn(f"resume={run}", "human_piped=true")
    resumed.expect(r"resumed from \S+ at step \d+ \((\d+) queries asked\)")
    assert resumed.match.group(1) == "6"  # 4 counted by the checkpoint + 2 answered after it
    resumed.expect_exact(PROMPT)  # the run continues and asks again
    resumed.sendline("q")
    resumed.sendeof()
    resumed.expect(pexpect.EOF)
    resumed.close()
    assert resumed.exitstatus == 0, resumed.before
    labels = pd.read_csv(run / "preferences" / "labels.csv")
    assert labels["label"].tolist()[:6] == [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]


def test_human_teacher_without_a_terminal_fails_before_training(tmp_path):
    import subprocess

    proc = subprocess.run([str(ROOT / "themis_train.sh"), *HUMAN_RUN,
                           f"hydra.run.dir={tmp_path / 'run'}"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "THEMIS_THREADS": "1"})
    assert proc.returncode == 2
    assert "stdin is not a TTY" in proc.stderr and "human_piped=true" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "train.csv").exists()


@pytest.mark.slow
def test_piped_answers_label_minigrid_clips_for_ppo(tmp_path):
    import subprocess

    from tests.test_domains import TINY_PPO

    run = tmp_path / "run"
    overrides = [o for o in TINY_PPO if not o.startswith(("max_feedback", "reward_batch"))]
    proc = subprocess.run(
        [str(ROOT / "themis_train.sh"), *overrides, "domain=Minigrid", "env=DistShift1-v0",
         "max_feedback=6", "reward_batch=3", "human_teacher=true", "human_piped=true",
         "human_frame_size=48", f"hydra.run.dir={run}"],
        input="1\n2\n0\n2\n\n1\n", capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "THEMIS_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "agent ppo" in proc.stdout
    labels = pd.read_csv(run / "preferences" / "labels.csv")
    assert labels["label"].tolist() == [0.0, 1.0, 0.5, 1.0, 0.0]  # the empty line skipped
    clip = run / "queries" / "query_000000.mp4"
    assert imageio_ffmpeg.count_frames_and_secs(str(clip))[0] == 8  # segment=8 in TINY_PPO


@pytest.mark.slow
def test_collect_prefs_only_asks_and_learns_but_never_relabels_the_agents_reward(compose,
                                                                                  tmp_path):
    from themis.builder import make_workspace

    ws = make_workspace(compose([*TINY_PENDULUM, "collect_prefs_only=true"]), tmp_path)
    ws.run()
    finish(ws)
    assert len(ws.learner.dataset) == 30  # every round asked (max_feedback=30)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert (rounds["epochs"] > 0).all()  # the reward model is trained each round
    assert not ws.buffer.rewards[: len(ws.buffer)].any()  # the agent never got r̂
    assert set(pd.read_csv(tmp_path / "train.csv")["phase"]) >= {"collect"}


@pytest.mark.slow
def test_saved_labels_train_the_reward_model_before_a_person_is_asked(tmp_path):
    import subprocess

    first = tmp_path / "first"
    proc = subprocess.run([str(ROOT / "themis_train.sh"), *TINY_PENDULUM,
                           f"hydra.run.dir={first}"], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env={**os.environ, "THEMIS_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run(
        [str(ROOT / "themis_train.sh"), *HUMAN_RUN, "human_piped=true", "max_feedback=4",
         f"prefs_path={first / 'preferences'}", f"hydra.run.dir={tmp_path / 'second'}"],
        input="1\n2\n1\n2\n", capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "THEMIS_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    trained = proc.stdout.index("reward model trained on 30 preferences from")
    assert trained < proc.stdout.index(PROMPT)
    labels = pd.read_csv(tmp_path / "second" / "preferences" / "labels.csv")
    assert len(labels) == 34 and (labels["labeler"].iloc[30:] == "human:ann").all()


@pytest.mark.parametrize("width", [96, 128, 256])
def test_the_frame_counter_does_not_cover_the_right_caption(width):
    from lib.human_interface import BANNER, GAP, side_by_side

    frames = np.zeros((120, width, width, 3), np.uint8)
    clip = side_by_side(frames, frames)
    banner = clip[-1, :BANNER].astype(int)  # "120/120": the widest counter
    caption = banner[:, width + GAP:width + GAP + 16]  # where the blue "2" is drawn
    grey = (np.abs(caption[..., 0] - caption[..., 2]) < 40) & (caption.sum(-1) < 450)
    assert not grey.any()  # no black counter text over the caption
    assert (banner[..., 2] - banner[..., 0] > 100).any()  # the "2" is there
