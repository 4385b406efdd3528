"""A vision-language model as the teacher: images of two segments in, a preference label out.

RL-VLM-F (Wang et al., ICML 2024, "RL-VLM-F: Reinforcement Learning from Vision Language
Foundation Model Feedback"; its prompts: ``prompt.py`` of the authors' repository) shows a VLM
one image of each segment (its last frame) with the task's goal and asks in two stages: first
an *analysis* (what each image shows, and whether either is closer to the goal), then, in a
second text-only request that quotes the analysis, a *label*: ``0`` (image 1 closer), ``1``
(image 2) or ``-1`` (unsure / no difference; RL-VLM-F drops those pairs).
:class:`VLMTeacher` does the same through any OpenAI-compatible chat-completions endpoint
(vLLM, Ollama, LM Studio, llama.cpp's server, OpenAI, Gemini's compatible endpoint) with the
official ``openai`` client:

- the prompt is a text file, the goal ``vlm_task`` or the env's entry of a table
  (:mod:`themis.feedback.vlm_prompt`);
- every answer is paid once: an answer cache keyed by the images, prompt, task and model
  (:mod:`themis.feedback.vlm_cache`), appended and fsynced as each answer arrives (after its
  caller has recorded the label), so a crash mid-round loses no answer and a repeated
  question is not sent again;
- requests run in parallel (``vlm_max_concurrency`` threads); the ``openai`` client's own
  timeout and retries (exponential backoff with jitter on 408/409/429/5xx and connection
  errors, ``Retry-After`` honoured) are used as they are;
- an answer without a label line is *can't tell* with its reason kept (``malformed``); a
  request that still fails after the retries is *can't tell* too (not cached: asked again next
  time); an endpoint that refuses the request itself (:data:`FATAL_STATUS`: a wrong key, model
  or URL, a model that reads no images) ends the run with one line.

The API key is read from the environment only (:data:`API_KEY_VARIABLES`), never from the
config, and is never written anywhere.
"""

from __future__ import annotations

import base64
import io
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from themis.core.run_keys import RunKeys
from themis.feedback.vlm_cache import Answer, AnswerCache, answer_key
from themis.feedback.vlm_prompt import PromptTemplate, load_prompt, parse_label, task_description
from themis.utils import ConfigError

API_KEY_VARIABLES = ("THEMIS_VLM_API_KEY", "OPENAI_API_KEY")
"""Environment variables the endpoint's API key is read from, the first one set. Local servers
(vLLM, Ollama) take any key: without one, the placeholder :data:`NO_KEY` is sent."""

NO_KEY = "no-key"
"""Sent as the key when no variable of :data:`API_KEY_VARIABLES` is set (local servers)."""

VLM_FRAMES = ("last", "key")
"""``vlm_frames``: ``last`` (one image per segment, its last frame: RL-VLM-F) or ``key``
(``vlm_key_frames`` frames evenly spaced over the segment, first and last included)."""

VLM_GOLD_FROM = ("none", "oracle")
"""``vlm_gold_from``: ``oracle``: a few queries per round answered by the env's reward score
the VLM (PRIMT/PrefVLM's trusted labels; :class:`VLMChannel`)."""

VLM_KEYS = ("vlm_base_url", "vlm_model", "vlm_task", "vlm_prompt", "vlm_cache")
"""Keys that only ``teacher=vlm`` reads (a value without it is refused)."""


def check_vlm(cfg: RunKeys) -> None:
    """The ``vlm_*`` keys of a run config: what ``teacher=vlm`` needs, and what it cannot do.

    Raises:
        ConfigError: one line naming the key, the problem and the fix.
    """
    if not cfg.vlm_teacher:
        idle = [key for key in (*VLM_KEYS, "vlm_gold_from")
                if str(getattr(cfg, key) or "") not in ("", "none")]
        if idle:
            raise ConfigError(f"{idle[0]}={getattr(cfg, idle[0])} is read by a VLM teacher "
                              "only: add teacher=vlm or drop it")
        return
    for key, example in (("vlm_base_url", "http://127.0.0.1:8000/v1"),
                         ("vlm_model", "Qwen/Qwen2.5-VL-7B-Instruct")):
        if not str(getattr(cfg, key) or "").strip():
            raise ConfigError(f"teacher=vlm needs {key} on the command line (e.g. "
                              f"{key}={example}); the API key goes in ${API_KEY_VARIABLES[0]}")
    if not str(cfg.vlm_base_url).startswith(("http://", "https://")):
        raise ConfigError(f"vlm_base_url={cfg.vlm_base_url} is not an http:// or https:// URL")
    if cfg.vlm_frames not in VLM_FRAMES:
        raise ConfigError(f"vlm_frames={cfg.vlm_frames} is unknown; use "
                          f"{' or '.join(VLM_FRAMES)}")
    if cfg.vlm_gold_from not in VLM_GOLD_FROM:
        raise ConfigError(f"vlm_gold_from={cfg.vlm_gold_from} is unknown; use "
                          f"{' or '.join(VLM_GOLD_FROM)}")
    load_prompt(cfg.vlm_prompt or None)
    task_description(cfg.vlm_task, cfg.env)
    if cfg.vlm_cache:
        cache = Path(cfg.vlm_cache).expanduser()
        if cache.is_dir() or not cache.parent.is_dir():
            raise ConfigError(f"vlm_cache={cfg.vlm_cache} is not a file in an existing folder "
                              "(answers are appended to it, one JSON object a line)")
    if not cfg.learn_reward:
        raise ConfigError("teacher=vlm needs learn_reward=true (preferences are only asked for "
                          "a learned reward)")
    if cfg.feedback != "pairwise":
        raise ConfigError("teacher=vlm compares two segments: use feedback=pairwise")
    if cfg.reward_training != "sync":
        raise ConfigError("teacher=vlm looks at the frames the run keeps, which the background "
                          "learner does not have: use reward_training=sync")
    web = cfg.human_teacher and cfg.teacher_ui == "web"
    if cfg.human_teacher and not web:
        raise ConfigError("teacher=vlm beside a person is one labeler of the crowd on the "
                          "labeling page: add teacher_ui=web (or drop human_teacher)")
    if cfg.vlm_gold_from == "oracle":
        if web:
            raise ConfigError("vlm_gold_from=oracle scores a VLM alone; beside people the "
                              "crowd's gold queries score it (gold_fraction, label_quality="
                              "filter): drop vlm_gold_from")
        if not cfg.gold_fraction:
            raise ConfigError("vlm_gold_from=oracle scores the VLM on gold queries: set "
                              "gold_fraction (e.g. 0.1)")


# ------------------------------------------------------------------ images
def segment_images(frames: np.ndarray, mode: str, key_frames: int = 4) -> np.ndarray:
    """The frames shown of each segment: ``(n, 2, H, h, w, 3) -> (n, 2, k, h, w, 3)`` uint8,
    ``k`` = 1 for ``last`` (the segment's last frame, RL-VLM-F), ``key_frames`` evenly
    spaced ones (first and last included) for ``key``.

    Raises:
        ValueError: an unknown ``mode``.
    """
    horizon = frames.shape[2]
    if mode == "last":
        return frames[:, :, -1:]
    if mode == "key":
        steps = np.unique(np.linspace(0, horizon - 1, min(key_frames, horizon)).round()
                          .astype(np.int64))
        return frames[:, :, steps]
    raise ValueError(f"vlm_frames={mode} is unknown; use {' or '.join(VLM_FRAMES)}")


def png_data_url(image: np.ndarray) -> str:
    """One ``(h, w, 3)`` uint8 image as a ``data:image/png;base64,...`` URL (OpenAI's
    ``image_url`` content part)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


# ------------------------------------------------------------------ the endpoint
def api_key() -> str:
    """The endpoint's API key from :data:`API_KEY_VARIABLES`, or :data:`NO_KEY`."""
    return next((os.environ[name] for name in API_KEY_VARIABLES if os.environ.get(name)), NO_KEY)


def make_client(base_url: str, timeout: float, max_retries: int) -> Any:
    """The official ``openai`` client for ``base_url`` (key: :func:`api_key`), with its own
    timeout (seconds per request) and retries (exponential backoff on 408/409/429/5xx).

    Raises:
        ConfigError: the ``openai`` package is not installed.
    """
    import logging

    for name in ("httpx", "openai"):  # a line per request otherwise, on the run's console
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        import openai
    except ImportError:
        raise ConfigError("teacher=vlm needs the openai package: pip install 'themis[vlm]' (or "
                          "pip install openai)") from None
    return openai.OpenAI(base_url=base_url, api_key=api_key(), timeout=timeout,
                         max_retries=max_retries)


@dataclass
class VLMStats:
    """What a round's VLM answers cost and how they went (``vlm_*`` columns of ``reward.csv``).

    Attributes:
        queries: queries answered (cached ones included).
        requests: HTTP requests that got an answer (two per query with a two-stage prompt;
            the client's retries not counted).
        cache_hits: queries answered from :class:`AnswerCache` (no request).
        prompt_tokens, completion_tokens: as the endpoint reported them.
        cost: the endpoint-reported cost, NaN when it reported none.
        seconds: summed wall time of the requests (latency; cached answers add none).
        cant_tell: queries with no label (unsure, malformed or failed).
        malformed: answers without a label line.
        errors: queries whose request failed after the retries (timeouts included).
    """

    queries: int = 0
    requests: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = float("nan")
    seconds: float = 0.0
    cant_tell: int = 0
    malformed: int = 0
    errors: int = 0

    def add(self, answer: Answer) -> None:
        """Count one answer."""
        self.queries += 1
        self.cache_hits += int(answer.cached)
        self.cant_tell += int(answer.label is None)
        self.malformed += int(answer.reason.startswith("malformed"))
        self.errors += int(answer.reason.startswith("error"))
        if answer.cached:
            return
        self.requests += answer.requests
        self.prompt_tokens += answer.prompt_tokens
        self.completion_tokens += answer.completion_tokens
        self.seconds += answer.seconds
        if np.isfinite(answer.cost):
            self.cost = answer.cost + (self.cost if np.isfinite(self.cost) else 0.0)

    def columns(self) -> dict[str, float]:
        """``reward.csv`` columns (``vlm_latency_s``: mean seconds per request)."""
        return {"vlm_queries": self.queries, "vlm_requests": self.requests,
                "vlm_cache_hits": self.cache_hits, "vlm_prompt_tokens": self.prompt_tokens,
                "vlm_completion_tokens": self.completion_tokens, "vlm_cost": self.cost,
                "vlm_latency_s": self.seconds / self.requests if self.requests else float("nan"),
                "vlm_cant_tell": self.cant_tell, "vlm_malformed": self.malformed,
                "vlm_errors": self.errors}


FATAL_STATUS = (400, 401, 403, 404, 422)
"""HTTP statuses that no retry mends (a wrong key, model, URL, a model without images, a
request the endpoint cannot read)."""


class VLMTeacher:
    """Asks a VLM which of two segments is better (RL-VLM-F's two-stage prompt).

    Args:
        client: an ``openai.OpenAI`` client (:func:`make_client`).
        model: the endpoint's model name (``vlm_model``).
        template: the prompt (:func:`load_prompt`).
        task: the goal the prompt names (:func:`task_description`).
        cache: the run's :class:`AnswerCache`.
        frames: ``vlm_frames`` (:data:`VLM_FRAMES`); ``key_frames``: images per segment for
            ``key``.
        max_concurrency: requests in flight at once.
        max_tokens, temperature: sampling of each request (RL-VLM-F: 1000, 0).

    Raises:
        ValueError: an unknown ``frames`` mode.
    """

    def __init__(self, client: Any, model: str, template: PromptTemplate, task: str,
                 cache: AnswerCache, frames: str = "last", key_frames: int = 4,
                 max_concurrency: int = 4, max_tokens: int = 1000,
                 temperature: float = 0.0) -> None:
        if frames not in VLM_FRAMES:
            raise ValueError(f"vlm_frames={frames} is unknown; use {' or '.join(VLM_FRAMES)}")
        self.client, self.model, self.template, self.task = client, model, template, task
        self.cache, self.frames, self.key_frames = cache, frames, key_frames
        self.max_concurrency, self.max_tokens = max_concurrency, max_tokens
        self.temperature = temperature

    def ask(self, frames: np.ndarray, stats: VLMStats | None = None,
            on_answer: Callable[[int, Answer], None] | None = None) -> list[Answer]:
        """Answer a batch of queries from their frames ``(n, 2, H, h, w, 3)`` uint8: ``n``
        answers in order. ``on_answer(i, answer)`` is called on this thread for each query in
        order, as soon as its answer and those of the queries before it have come (e.g. to
        record the label in the dataset at once: in the same order whatever the network's
        timing, so a run stays deterministic); a new answer is appended to the cache right
        after that call, or at once when it waits for earlier queries (a crash then leaves a
        recorded label, or a cached answer, never a lost one). ``stats`` counts them. Queries
        that show the same images are asked once.

        Raises:
            ConfigError: the endpoint refused a request for good (:data:`FATAL_STATUS`); the
                requests not sent yet are cancelled, the answers received are cached.
        """
        images = segment_images(frames, self.frames, self.key_frames)
        if not len(images):
            return []
        keys = [answer_key(pair, self.template, self.task, self.model) for pair in images]
        alike: dict[str, list[int]] = {}  # one request per key, in the queries' order
        for i, key in enumerate(keys):
            alike.setdefault(key, []).append(i)
        answers: list[Answer | None] = [None] * len(keys)
        unstored = {key for key in alike}  # new answers not in the cache yet
        told = 0  # on_answer has been called for queries 0 … told − 1

        def store(key: str) -> None:
            answer = answers[alike[key][0]]
            if key in unstored and answer is not None and answer.requests \
                    and not answer.reason.startswith("error"):
                self.cache.put(key, self.model, answer)
            unstored.discard(key)

        def tell(up_to_gaps: bool) -> None:  # in query order: the same dataset every time
            nonlocal told
            while told < len(answers) and (answers[told] is not None or up_to_gaps):
                if answers[told] is not None:
                    if on_answer is not None:
                        on_answer(told, answers[told])  # type: ignore[arg-type]
                    if alike[keys[told]][0] == told:
                        store(keys[told])  # recorded first, then cached
                told += 1

        failure: ConfigError | None = None
        pool = ThreadPoolExecutor(max_workers=max(1, self.max_concurrency))
        try:
            futures = {pool.submit(self.fetch, images[rows[0]], key): (key, rows)
                       for key, rows in alike.items()}
            for future in as_completed(futures):
                if future.cancelled():
                    continue
                try:
                    answer = future.result()
                except ConfigError as e:  # stop sending; keep what has come
                    failure = failure or e
                    pool.shutdown(wait=False, cancel_futures=True)
                    continue
                key, rows = futures[future]
                for k, i in enumerate(rows):
                    answers[i] = answer if k == 0 else Answer(
                        answer.label, answer.reason, list(answer.texts), cached=True)
                if rows[0] != told:  # told later, after the queries before it: cached now
                    store(key)
                tell(up_to_gaps=False)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            tell(up_to_gaps=True)  # after a failure: what came, in order
        if failure is not None:
            raise failure
        done = [a for a in answers if a is not None]
        if stats is not None:
            for answer in done:
                stats.add(answer)
        return done

    def ask_one(self, images: np.ndarray) -> Answer:
        """One query's answer from its images ``(2, k, h, w, 3)``: the cache's, or the
        endpoint's (then cached).

        Raises:
            ConfigError: the endpoint refused the request for good (:data:`FATAL_STATUS`).
        """
        key = answer_key(images, self.template, self.task, self.model)
        answer = self.fetch(images, key)
        if answer.requests and not answer.reason.startswith("error"):
            self.cache.put(key, self.model, answer)
        return answer

    def fetch(self, images: np.ndarray, key: str) -> Answer:
        """The answer of the cache under ``key``, else of the endpoint (not cached here:
        :meth:`ask` caches it once its caller has it). A request that fails after the
        client's retries gives *can't tell* with the reason ``error: ...``.

        Raises:
            ConfigError: the endpoint refused the request for good (:data:`FATAL_STATUS`).
        """
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        answer = Answer(None)
        start = time.perf_counter()
        try:
            first = self.request(self.first_messages(images), answer)
            text = first
            if self.template.label:
                text = self.request(self.second_messages(first), answer)
        except ConfigError:
            raise
        except Exception as e:  # timeouts, connection errors, 5xx/429 after the retries
            answer.seconds = time.perf_counter() - start
            answer.reason = f"error: {type(e).__name__}: {' '.join(str(e).split())[:120]}"
            return answer  # not cached: asked again next time
        answer.seconds = time.perf_counter() - start
        answer.label, answer.reason = parse_label(text)
        return answer

    def first_messages(self, images: np.ndarray) -> list[dict[str, Any]]:
        """The analysis request: the template's text with the two segments' images in place of
        ``{images_1}`` / ``{images_2}`` (OpenAI's content parts: text, image_url, ...)."""
        text = self.template.analysis.replace("{task}", self.task)
        before, rest = text.split("{images_1}", 1)
        middle, after = rest.split("{images_2}", 1)
        parts: list[dict[str, Any]] = []
        for words, segment in ((before, images[0]), (middle, images[1]), (after, None)):
            if words.strip():
                parts.append({"type": "text", "text": words.strip("\n")})
            for image in segment if segment is not None else ():
                parts.append({"type": "image_url", "image_url": {"url": png_data_url(image)}})
        return [{"role": "user", "content": parts}]

    def second_messages(self, analysis: str) -> list[dict[str, Any]]:
        """The label request: text only, quoting the analysis."""
        text = self.template.label.replace("{task}", self.task).replace("{analysis}", analysis)
        return [{"role": "user", "content": text}]

    def request(self, messages: list[dict[str, Any]], answer: Answer) -> str:
        """Send one chat-completions request; add its usage to ``answer``; its text.

        Raises:
            ConfigError: a status of :data:`FATAL_STATUS`.
        """
        import openai

        try:
            response = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.max_tokens,
                temperature=self.temperature)
        except openai.APIStatusError as e:
            if e.status_code in FATAL_STATUS:
                raise ConfigError(
                    f"teacher=vlm: {self.client.base_url} refused the request with HTTP "
                    f"{e.status_code} ({' '.join(str(e.message).split())[:120]}); check "
                    f"vlm_base_url, vlm_model={self.model} (a model that reads images) and the "
                    f"key in ${API_KEY_VARIABLES[0]}") from None
            raise
        answer.requests += 1
        answer.texts.append(str(response.choices[0].message.content or "")
                            if response.choices else "")
        usage = response.usage
        if usage is not None:
            answer.prompt_tokens += int(usage.prompt_tokens or 0)
            answer.completion_tokens += int(usage.completion_tokens or 0)
            cost = getattr(usage, "cost", None)
            if cost is None and usage.model_extra:
                cost = usage.model_extra.get("cost")
            if isinstance(cost, int | float):
                answer.cost = float(cost) + (answer.cost if np.isfinite(answer.cost) else 0.0)
        return answer.texts[-1]


__all__ = ["API_KEY_VARIABLES", "FATAL_STATUS", "VLM_FRAMES", "VLM_GOLD_FROM", "VLMStats",
           "VLMTeacher", "api_key", "check_vlm", "make_client", "png_data_url", "segment_images"]
