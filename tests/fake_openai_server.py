"""A small OpenAI-compatible chat-completions server for the VLM teacher's tests.

No inference server on PyPI ships a model that reads images (vLLM, llama-cpp-python's server
and Ollama all download their weights from a hub), so the tests start this one on 127.0.0.1:
``POST /v1/chat/completions`` in OpenAI's request and response format, images in as
``data:image/png;base64`` URLs, and an answer by a rule the tests know — **the brighter
segment wins**: the first request (images) answers an analysis ending in ``VERDICT: n``; the
second (text only, quoting the analysis) answers the label line ``n`` (``0``: the first
segment's images are brighter, ``1``: the second's, ``-1``: equal). On demand it answers
429 (``rate_limited`` requests), waits (``delay`` seconds), answers without a label line
(``malformed``) or refuses with 400 after ``refuse_after`` answers (a run that stops
mid-round). Every request it received is in :attr:`FakeOpenAIServer.requests`.
"""

from __future__ import annotations

import base64
import io
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def decode_image(url: str) -> np.ndarray:
    """A ``data:image/png;base64,...`` URL -> ``(h, w, 3)`` uint8."""
    from PIL import Image

    head, data = url.split(",", 1)
    assert head == "data:image/png;base64", head
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))


class FakeOpenAIServer:
    """The server, run by uvicorn in a thread (:meth:`start`, :meth:`stop`; a context manager).

    Attributes:
        requests: every request body received (JSON), with its ``Authorization`` header under
            ``"authorization"``.
        rate_limited: the next this-many requests get HTTP 429 (``retry-after-ms: 1``).
        delay: seconds to wait before each answer, or a function of the request's arrival
            number (0, 1, ...) giving them.
        malformed: label answers have no label line.
        refuse_after: after this many answered requests, every request gets HTTP 400.
        cost: the ``usage.cost`` reported per request (``None``: no cost field).
        most_in_flight: the most requests it was answering at once.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.rate_limited = 0
        self.delay: float | Callable[[int], float] = 0.0
        self.malformed = False
        self.refuse_after: int | None = None
        self.cost: float | None = 0.001
        self.answered = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.lock = threading.Lock()
        self.port = free_port()
        self.server: Any = None
        self.thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            with self.lock:
                self.requests.append({**body, "authorization":
                                      request.headers.get("authorization", "")})
                if self.rate_limited > 0:
                    self.rate_limited -= 1
                    return JSONResponse({"error": {"message": "slow down", "type": "rate"}},
                                        status_code=429, headers={"retry-after-ms": "1"})
                if self.refuse_after is not None and self.answered >= self.refuse_after:
                    return JSONResponse({"error": {"message": "refused on purpose"}},
                                        status_code=400)
                arrival = self.answered
                self.answered += 1
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                wait = self.delay(arrival) if callable(self.delay) else self.delay
                if wait:
                    import asyncio

                    await asyncio.sleep(wait)
                return JSONResponse(self.answer(body))
            finally:
                with self.lock:
                    self.in_flight -= 1

        return app

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's response to one request, by the brighter-segment rule."""
        content = body["messages"][-1]["content"]
        if isinstance(content, list):  # the analysis: images in
            urls = [p["image_url"]["url"] for p in content if p["type"] == "image_url"]
            images = [decode_image(u) for u in urls]
            half = len(images) // 2
            first = float(np.mean(images[:half])) if half else 0.0
            second = float(np.mean(images[half:])) if half else 0.0
            verdict = "0" if first > second else "1" if second > first else "-1"
            text = (f"Image 1 has brightness {first:.1f}, image 2 {second:.1f}. "
                    f"VERDICT: {verdict}")
            prompt_tokens = 85 * len(images) + 50
        else:  # the label: text only, quoting the analysis
            found = re.search(r"VERDICT: (-?\d)", content)
            text = "I am not sure what to say." if self.malformed or not found else \
                f"The analysis says so.\n{found.group(1)}"
            prompt_tokens = len(content) // 4
        usage: dict[str, Any] = {"prompt_tokens": prompt_tokens,
                                 "completion_tokens": len(text) // 4 + 1,
                                 "total_tokens": prompt_tokens + len(text) // 4 + 1}
        if self.cost is not None:
            usage["cost"] = self.cost
        return {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", ""),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": usage}

    def start(self) -> FakeOpenAIServer:
        import uvicorn

        # log_config=None: uvicorn's default logging config would bind handlers to this
        # moment's (a test's captured) stderr and stop the uvicorn loggers propagating, for
        # every later test of the process (test_web_labeling checks the label server's)
        config = uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="error",
                                lifespan="off", log_config=None)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
