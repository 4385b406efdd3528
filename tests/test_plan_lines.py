"""Plan lines that match the run (issue 67 item 5): the start's query plan says what the run
will really ask, when, in words that fit the numbers; the terminal's counter moves."""

from __future__ import annotations

import io

import numpy as np

from lib.human_interface import KeyReader, TerminalTeacher
from tests.conftest import TINY_PENDULUM
from themis.builder import make_workspace
from themis.run.plan import query_plan

TINY = [o for o in TINY_PENDULUM if not o.startswith(("num_seed_steps", "num_unsup_steps"))] + [
    "num_seed_steps=50", "num_unsup_steps=50"]


def test_a_pretraining_run_prints_no_query_plan(compose, tmp_path, capsys):
    ws = make_workspace(compose(TINY, "pretrain_themis"), tmp_path)
    ws.run(until=ws.cfg.pretrain_end)  # what ./themis_pretrain.sh runs: no round comes
    ws.logger.close()
    out = capsys.readouterr().out
    assert "Themis | Pendulum-v1" in out and "queries:" not in out


def test_ppos_plan_says_rounds_come_at_whole_rollouts(compose, tmp_path):
    ws = make_workspace(compose(["domain=Classic", "env=CartPole-v1", "num_train_steps=20000",
                                 "num_seed_steps=500", "num_unsup_steps=1000",
                                 "num_interact=1000", "ppo.num_envs=1", "ppo.num_steps=1024",
                                 "max_feedback=100", "reward_batch=10"]), tmp_path)
    line, _ = query_plan(ws)
    ws.logger.close()
    assert "every 1024 steps (whole rollouts of 1024) from step 2048" in line, line
    assert "every 1000 steps" not in line and "from step 1500" not in line


def test_one_round_is_one_round(compose, tmp_path):
    ws = make_workspace(compose([*TINY, "max_feedback=10", "reward_batch=10"]), tmp_path)
    line, _ = query_plan(ws)
    ws.logger.close()
    assert "in 1 round of 10 (reward_batch)" in line and "1 rounds" not in line, line


def test_the_terminal_counter_advances_within_a_round(tmp_path):
    out = io.StringIO()
    teacher = TerminalTeacher(tmp_path, KeyReader(io.StringIO("1\n\n2\n"), piped=True),
                              viewer="none", fps=5, out=out)
    before = 6  # queries of earlier rounds

    def header(asked: int = 0) -> str:
        return f"round 2, {before + asked} of 30 queries asked before it"

    teacher.ask(np.zeros((3, 2, 3, 16, 16, 3), dtype=np.uint8), lambda i, label: None, header)
    text = out.getvalue()
    assert [f"{n} of 30 queries asked before it" in text for n in (6, 7, 8)] == [True] * 3
