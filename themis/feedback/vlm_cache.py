"""The VLM teacher's answers, each paid once: an answer, and the cache that keeps them by content.

:class:`AnswerCache` keeps every answer under :func:`answer_key` (the hash of the model, the
prompt file, the task and the images) in a JSON-lines file (``RUN_DIR/vlm_answers.jsonl`` or
``vlm_cache``), appended and fsynced as each answer is taken, so a crash loses none and a
question asked again is not sent again. Used by :mod:`themis.feedback.vlm`.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from themis.feedback.vlm_prompt import PromptTemplate

CACHE_FILE = "vlm_answers.jsonl"
"""The run folder's answer cache (:class:`AnswerCache`)."""


@dataclass
class Answer:
    """One query's answer.

    Attributes:
        label: 0, 0.5, 1, or ``None`` (can't tell).
        reason: why there is no label (``unsure``, ``malformed: ...``, ``error: ...``), or ``""``.
        texts: the answers of the two stages (one for a one-stage prompt).
        prompt_tokens, completion_tokens: as the endpoint reported them (0 if it did not).
        cost: the cost the endpoint reported (``usage.cost``, e.g. OpenRouter), else NaN.
        seconds: wall time of the requests.
        requests: requests sent (0 when the answer came from the cache).
        cached: the answer came from :class:`AnswerCache`.
    """

    label: float | None
    reason: str = ""
    texts: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = float("nan")
    seconds: float = 0.0
    requests: int = 0
    cached: bool = False


class AnswerCache:
    """Every answer a VLM gave, by content: one JSON object a line in ``path``, appended and
    fsynced as the answer is taken, so a crash loses none and no answer is paid twice.

    A line is ``{"key": ..., "model": ..., "label": 0|0.5|1|null, "reason": ..., "texts": [...],
    "prompt_tokens": ..., "completion_tokens": ..., "cost": ..., "seconds": ..., "time": ...}``;
    a torn last line (a crash while writing) is skipped on reading.

    Args:
        path: the JSON-lines file (created on the first answer).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.answers: dict[str, Answer] = {}
        if path.is_file():
            with path.open(encoding="utf-8") as f:
                for line in f:
                    try:
                        row = json.loads(line)
                        key = str(row["key"])
                        label = row["label"]
                        answer = Answer(
                            None if label is None else float(label), str(row.get("reason", "")),
                            [str(t) for t in row.get("texts", [])],
                            int(row.get("prompt_tokens", 0)),
                            int(row.get("completion_tokens", 0)),
                            float(row.get("cost") if row.get("cost") is not None else "nan"),
                            float(row.get("seconds", 0.0)))
                    except (ValueError, KeyError, TypeError):  # a torn or foreign line
                        continue
                    if answer.label in (None, 0.0, 0.5, 1.0):
                        self.answers[key] = answer

    def get(self, key: str) -> Answer | None:
        """The answer stored under ``key`` (``cached`` set, no request counted), or ``None``."""
        with self.lock:
            found = self.answers.get(key)
        if found is None:
            return None
        return Answer(found.label, found.reason, list(found.texts), found.prompt_tokens,
                      found.completion_tokens, found.cost, found.seconds, 0, True)

    def put(self, key: str, model: str, answer: Answer) -> None:
        """Append ``answer`` under ``key`` and fsync before returning."""
        row = {"key": key, "model": model, **asdict(answer), "time": time.time()}
        row.pop("cached")
        row.pop("requests")
        if not np.isfinite(row["cost"]):
            row["cost"] = None
        line = json.dumps(row, ensure_ascii=False) + "\n"
        with self.lock:
            new = not self.path.exists()
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            if new:
                from themis.utils import fsync_dir

                fsync_dir(self.path.parent)
            self.answers[key] = answer


def answer_key(images: np.ndarray, template: PromptTemplate, task: str, model: str) -> str:
    """SHA-256 of what decides an answer: the model, the prompt file, the task and the images
    (``(2, k, h, w, 3)`` uint8: their shape and bytes)."""
    digest = hashlib.sha256()
    for part in (model, template.text, task, str(images.shape)):
        digest.update(part.encode("utf-8") + b"\0")
    digest.update(np.ascontiguousarray(images, dtype=np.uint8).tobytes())
    return digest.hexdigest()


__all__ = ["CACHE_FILE", "Answer", "AnswerCache", "answer_key"]
