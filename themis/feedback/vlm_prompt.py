"""The VLM teacher's prompt: the template file, the task's goal, and the label in an answer.

RL-VLM-F (Wang et al., ICML 2024) asks in two stages: an *analysis* of the two images against
the goal, then, quoting it, a *label* line ``0`` / ``1`` / ``-1``. The template is a text file
(:data:`DEFAULT_PROMPT`, RL-VLM-F's two stages in our words; ``vlm_prompt=PATH`` replaces it,
:func:`load_prompt`); the goal is ``vlm_task`` or the env's entry of :data:`TASKS`
(:func:`task_description`); :func:`parse_label` reads an answer's label. Used by
:mod:`themis.feedback.vlm`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from themis.utils import ConfigError

DEFAULT_PROMPT = Path(__file__).with_name("vlm_prompt.txt")
"""The default template: RL-VLM-F's two stages, in our words (analysis, then a label line)."""

TASKS: dict[str, str] = {
    # Gymnasium MuJoCo (domain=Control) and classic control
    "halfcheetah": "to make the two-legged cheetah robot run forward (to the right) as fast as "
                   "possible without flipping over",
    "hopper": "to make the one-legged robot hop forward (to the right) while staying upright",
    "walker2d": "to make the two-legged robot walk forward (to the right) while staying upright",
    "ant": "to make the four-legged ant robot walk forward",
    "humanoid": "to make the humanoid robot walk forward without falling",
    "swimmer": "to make the three-segment swimmer move forward (to the right)",
    "reacher": "to move the tip of the two-joint robot arm onto the red target",
    "invertedpendulum": "to keep the pole balanced upright on the cart",
    "inverteddoublependulum": "to keep the two-link pole balanced upright on the cart",
    "pendulum": "to swing the pendulum up and hold it upright",
    # RL-VLM-F's own goals (prompt.py)
    "cartpole": "to balance the brown pole on the black cart to be upright",
    "drawer-open": "to open the drawer",
    "door-open": "to open the safe door",
    "sweep-into": "to minimize the distance between the green cube and the hole",
    "soccer": "to move the soccer ball into the goal",
    # DeepMind Control (domain=DMC)
    "walker_walk": "to make the two-legged robot walk forward (to the right) while staying "
                   "upright",
    "walker_run": "to make the two-legged robot run forward (to the right) while staying upright",
    "cheetah_run": "to make the cheetah robot run forward (to the right) as fast as possible",
    "quadruped_walk": "to make the four-legged robot walk forward",
    "cartpole_swingup": "to swing the pole up and keep it balanced upright on the cart",
}
"""``vlm_task`` of the envs where the goal is plain from the reward's definition, by env name
without its version (lower case; ``HalfCheetah-v5`` -> ``halfcheetah``)."""


def task_description(task: str, env: str) -> str:
    """The goal the prompt names: ``task`` (``vlm_task``) when set, else :data:`TASKS`'s.

    Raises:
        ConfigError: no ``vlm_task`` and no entry for ``env``.
    """
    if str(task or "").strip():
        return str(task).strip()
    name = re.sub(r"-v\d+$", "", str(env).split("/")[-1].split(":")[-1]).lower()
    if name in TASKS:
        return TASKS[name]
    raise ConfigError(f"teacher=vlm: no task description for env={env}; say what the agent "
                      "should do with vlm_task='to ...' (the prompt reads 'The goal is "
                      "<vlm_task>.')")


# ------------------------------------------------------------------ the prompt
@dataclass(frozen=True)
class PromptTemplate:
    """A VLM prompt in two stages (RL-VLM-F's "analysis, then label").

    Attributes:
        analysis: the first request's text; ``{images_1}`` and ``{images_2}`` mark where the
            two segments' images go, ``{task}`` the goal.
        label: the second, text-only request (``{analysis}``: the first answer; ``{task}``),
            or ``""`` for one stage (the first answer holds the label line).
        text: the whole file, as hashed into the cache key.
    """

    analysis: str
    label: str
    text: str


ANALYSIS, LABEL = "### analysis", "### label"


def load_prompt(path: str | Path | None = None) -> PromptTemplate:
    """Read a prompt file (default :data:`DEFAULT_PROMPT`): a ``### analysis`` section and,
    optionally, a ``### label`` section (the format of ``themis/feedback/vlm_prompt.txt``).

    Raises:
        ConfigError: the file cannot be read, has no analysis section, or lacks a placeholder
            (``{images_1}``, ``{images_2}`` in the analysis, ``{analysis}`` in the label).
    """
    where = Path(path).expanduser() if path else DEFAULT_PROMPT
    try:
        text = where.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else "not UTF-8 text"
        raise ConfigError(f"vlm_prompt={path}: cannot read it ({reason})") from None
    if ANALYSIS not in text:
        raise ConfigError(f"vlm_prompt={path}: no '{ANALYSIS}' line (the first request's "
                          f"text follows it; see {DEFAULT_PROMPT.name} in themis/feedback/)")
    body = text.split(ANALYSIS, 1)[1]
    analysis, _, label = body.partition(LABEL)
    for name in ("{images_1}", "{images_2}"):
        if name not in analysis:
            raise ConfigError(f"vlm_prompt={path}: the analysis has no {name} (where the "
                              "segment's images go)")
    if label.strip() and "{analysis}" not in label:
        raise ConfigError(f"vlm_prompt={path}: the label section has no {{analysis}} (where "
                          "the first answer is quoted)")
    return PromptTemplate(analysis.strip("\n"), label.strip("\n"), text)


# ------------------------------------------------------------------ the label of an answer
LABELS = {"0": 0.0, "1": 1.0, "-1": None, "0.5": 0.5, "equal": 0.5}
"""A label line's text -> the label: 0 = segment 1 better, 1 = segment 2, 0.5 = equal (for
templates that ask for ties), ``None`` = can't tell (RL-VLM-F's ``-1``)."""


def parse_label(text: str) -> tuple[float | None, str]:
    """The label of an answer: its last line that holds only a label of :data:`LABELS`
    (markdown, quotes, a trailing full stop and an ``Answer:`` prefix allowed).

    Returns:
        ``(label, reason)``: ``label`` 0, 0.5, 1 or ``None`` (can't tell); ``reason`` ``""``
        for a label, ``"unsure"`` for ``-1``, ``"malformed: ..."`` when no line holds one.
    """
    for line in reversed(str(text or "").strip().splitlines()):
        word = re.sub(r"^(final\s+)?(answer|label)\s*[:=]\s*", "",
                      line.strip().strip("*`'\" ").lower()).strip("*`'\" .")
        if word in LABELS:
            label = LABELS[word]
            return label, "" if label is not None else "unsure"
    shown = " ".join(str(text or "").split())[:80]
    return None, f"malformed: no label line (0, 1 or -1) in {shown!r}"


__all__ = ["DEFAULT_PROMPT", "LABELS", "TASKS", "PromptTemplate", "load_prompt", "parse_label",
           "task_description"]
