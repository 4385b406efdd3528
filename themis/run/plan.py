"""The console lines that say what a run will do: its banner (env, method, agent, reward
source, device, run dir) and its plan of queries (how many, in how many rounds, from which
step), both from the resolved config and the built :class:`~themis.run.workspace.Workspace`
(docs/guide/configuration.md); a feedback round's line; and the line that says how to continue
a stopped run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from themis.agents import agent_of, rollout_steps
from themis.feedback.factory import decaying_schedule, teacher_description, teacher_name
from themis.feedback.selector import feedback_rounds, round_grid
from themis.run.checkpoint import STATE_FILE

if TYPE_CHECKING:
    from themis.run.config import TrainConfig

ROUND_CONSOLE = {"total_feedback": "queries_total", "labeled_feedback": "labels_total",
                 "skipped": "round_skipped", "equal": "round_equal",
                 "oracle_agreement": "round_oracle_agreement"}
"""Console names of ``reward.csv`` columns in a round's line: ``*_total`` counts the whole run,
``round_*`` this round (the held-out numbers are on this round's new labels too)."""


def plural(count: int, word: str) -> str:
    """``1 round``, ``3 rounds``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def query_rounds(cfg: TrainConfig, agent: str) -> int:
    """Feedback rounds the run's schedule holds for its agent (``sac`` checks before every
    step, ``ppo`` after every rollout; :func:`themis.feedback.selector.feedback_rounds`)."""
    rollout = rollout_steps(cfg, agent)
    return feedback_rounds(cfg.num_train_steps, cfg.num_seed_steps + cfg.num_unsup_steps,
                           cfg.num_interact, rollout)


def log_banner(ws: Any, extra: str = "") -> None:
    """The run's first console lines: env, method, agent, reward source, device, threads, run
    dir (``extra``: the loop's own, e.g. PPO's rollout), then the query plan
    (:func:`query_plan`)."""
    cfg = ws.cfg
    if not cfg.learn_reward:
        reward = "environment"
    elif cfg.human_teacher:
        web = cfg.teacher_ui == "web"
        where = ws.run_dir / ("web/clips" if web else "queries")
        reward = (f"learned from {'people' if web else 'a person'} ({teacher_name(cfg)}, "
                  f"clips in {where})")
    elif cfg.max_feedback == 0:
        reward = f"learned from the saved preferences in {cfg.prefs_path}"
    else:
        reward = f"learned from {teacher_description(cfg)}"
    ws.logger.info(
        f"Themis | {ws.facts.env_id} | {ws.title} | agent {agent_of(ws.cfg, ws.driver.NAME)} "
        f"({'auto' if cfg.agent == 'auto' else 'agent=' + cfg.agent}: "
        f"{type(ws.env.action_space).__name__} action space: "
        f"{ws.env.action_space}){extra} | reward: {reward} | device {ws.device}, "
        f"{ws.thread_choice.describe()}"
        f"{', bf16 matmuls' if ws.precision is not None else ''} | "
        f"run dir {ws.run_dir}", "cyan")
    schedule = query_plan(ws)
    if schedule is not None:
        ws.logger.info(*schedule)


def query_plan(ws: Any) -> tuple[str, str] | None:
    """The console line (and its colour) that says at the start how many queries the run
    will ask, in how many rounds (docs/guide/configuration.md); yellow when the schedule cannot
    spend ``max_feedback``. ``None`` without queries."""
    cfg = ws.cfg
    if ws.learner is None or cfg.max_feedback == 0:
        return None
    until = getattr(ws, "until", None)  # ./themis_pretrain.sh: ends before any round
    if until is not None and until <= ws.cfg.pretrain_end:
        return None
    rounds = query_rounds(cfg, ws.driver.NAME)
    rollout = rollout_steps(cfg, ws.driver.NAME)
    first, every, _ = round_grid(cfg.num_train_steps, ws.cfg.pretrain_end, cfg.num_interact,
                                 rollout)  # PPO: rounds come after whole rollouts
    spacing = f"every {every} steps" + (f" (whole rollouts of {rollout})" if rollout > 1
                                        else "")
    if ws.learner.schedule is not None:  # query_schedule=decay
        plan = decaying_schedule(cfg, rollout).plan(first, cfg.max_feedback,
                                                             cfg.first_round_queries)
        return (f"queries: {sum(plan)} of max_feedback={cfg.max_feedback}, in "
                f"{plural(len(plan), 'round')} {spacing} from step {first}, decaying as "
                f"{cfg.query_decay_steps}/(T+{cfg.query_decay_steps}): "
                f"{', '.join(map(str, plan[:3]))}{', ...' if len(plan) > 3 else ''} "
                f"(query_schedule=decay)", "cyan")
    first_round = cfg.first_round_queries or cfg.reward_batch  # DRLHP: 500 first
    asked = min(cfg.max_feedback, first_round + max(0, rounds - 1) * cfg.reward_batch) \
        if rounds else 0
    used = min(rounds, 1 + -(-max(0, asked - first_round) // cfg.reward_batch))
    line = (f"queries: {asked} of max_feedback={cfg.max_feedback}, in "
            f"{plural(used, 'round')} of {cfg.reward_batch} (reward_batch), {spacing} from "
            f"step {first}")
    if asked < cfg.max_feedback:
        return (f"{line}: the run holds only {plural(rounds, 'round')}, so "
                f"{cfg.max_feedback - asked} queries of the budget stay unasked; raise "
                "num_train_steps or reward_batch, or lower num_interact", "yellow")
    return line, "cyan"


__all__ = ["log_banner", "plural", "query_plan", "query_rounds"]


def log_round(logger: Any, report: Any, pending: int | None = None) -> None:
    """A feedback round's ``reward.csv`` row (a :class:`themis.feedback.RoundReport`, its
    method's statistics as columns) and its console line (:func:`round_line`)."""
    row = report._asdict()
    row.update(row.pop("method_stats"))
    logger.reward.write(row)
    logger.console("reward", round_line(row, pending))


def round_line(row: dict[str, Any], pending: int | None = None) -> dict[str, Any]:
    """A feedback round's console fields from its ``reward.csv`` row (:data:`ROUND_CONSOLE`'s
    names); ``pending``: web queries still waiting for answers (with the round's new labels),
    ``None`` for teachers that answer at once."""
    line = {ROUND_CONSOLE.get(k, k): v for k, v in row.items()
            if k not in ("sampler", "new_labels")}
    if pending is not None:
        line.update(round_new_labels=row["new_labels"], pending=pending)
    return line


def stop_line(ws: Any, launcher: str) -> str:
    """The line printed after Ctrl-C: the step reached and how to go on — the command that
    continues from the last checkpoint (``launcher resume=RUN_DIR``), that there is none yet,
    or, for ``reward_training=async`` runs with people (which cannot be resumed), where the
    labels are."""
    run_async = ws.cfg.reward_training == "async"
    if run_async and (ws.run_dir / "labels.sqlite").is_file():  # web
        return (f"stopped at step {ws.step}; an async run cannot be resumed: every answer is "
                f"in its labels.sqlite: python scripts/store_to_prefs.py {ws.run_dir} DIR "
                "writes them all (a new run with prefs_path=DIR keeps them)")
    if run_async and ws.cfg.human_teacher:
        return (f"stopped at step {ws.step}; an async run with people cannot be resumed: its "
                f"labels are in {ws.run_dir / 'preferences'} (a new run with prefs_path= keeps "
                "them)")
    if not (ws.run_dir / "checkpoints" / STATE_FILE).is_file():
        first = min(ws.cfg.pretrain_end, ws.cfg.checkpoint_frequency)
        return (f"stopped at step {ws.step}, before the first checkpoint (at step {first}): "
                "run the command again to start over")
    return (f"stopped at step {ws.step}; last checkpoint at step {ws.last_checkpoint_step}; "
            f"continue with {launcher} resume={ws.run_dir.resolve()}")
