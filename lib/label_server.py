"""Web labeling: a FastAPI app serving a run's pending queries to many labelers.

    ./themis_train.sh human_teacher=true teacher_ui=web            # prints the URL, keeps training
    python scripts/label_server.py RUN_DIR                         # label a run trained elsewhere

The training loop posts each round's queries to the run's :class:`themis.label_store.LabelStore`
(SQLite) and gathers whatever answers have arrived at the next round; this server is the other
side: the labeling page (``/``: the side-by-side clip looping, buttons Left / Right / Equal /
Can't tell, keys 1, 2, 0, s, counters), the status page (``/status``: learning curve, labels per
labeler, agreement) and a small JSON API (``/api/...``, OpenAPI spec at ``/openapi.json``).

Security: binds 127.0.0.1 by default; any other address needs labeler tokens (``labelers=N``),
and with tokens every request needs one (``?token=`` or the ``X-Themis-Token`` header), the
OpenAPI spec included (there is no ``/docs`` page). Requests must name the bound host in their
``Host`` header (no DNS rebinding of the anonymous loopback mode); pages cannot be framed
(``X-Frame-Options``, CSP ``frame-ancestors``) and send no referrer (tokens are in URLs). Bodies
are limited to 4 KiB, IDs and labels validated, clips served by query ID only, and a labeler
cannot answer a query twice, nor a query that has its answers (409).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.middleware.trustedhost import TrustedHostMiddleware

from themis import crowd
from themis.label_store import DuplicateAnswer, LabelStore, QueryFull, UnknownQuery

MAX_BODY = 4096
LABELS: dict[str, float | None] = {"left": 0.0, "right": 1.0, "equal": 0.5, "skip": None}
LOCAL_LABELER = "local"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
                               "style-src 'unsafe-inline'; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Answer(BaseModel):
    """One answer: ``label`` left (segment 1 better), right, equal or skip (can't tell) for a
    pair; for a rating query (``feedback=rating``) ``rating`` 1 … n (worst to best) or ``label``
    skip."""

    model_config = ConfigDict(extra="forbid")
    query_id: int
    label: Literal["left", "right", "equal", "skip"] | None = None
    rating: int | None = Field(None, ge=1, le=9)


class _BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: requests with a body over ``limit`` bytes get 413."""

    def __init__(self, app: Any, limit: int = MAX_BODY) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = PlainTextResponse("request body too large", status_code=413)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await too_large(scope, receive, send)
            return
        received = 0

        async def limited() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _BodyTooLarge:
            await too_large(scope, receive, send)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str) -> list[str]:
    """``Host`` header values a server bound to ``host`` answers: the loopback names, plus
    ``host`` itself; bound to every interface (``0.0.0.0``, ``::``, where tokens are required)
    any name, since the machine's names and addresses are not known here."""
    if host in ("0.0.0.0", "::", ""):
        return ["*"]
    return sorted({*LOOPBACK_NAMES, host})


INSTRUCTIONS_FILE = "instructions.md"
"""``RUN_DIR/web/instructions.md``: the run's ``label_instructions``, written by the run."""
INSTRUCTIONS_LIMIT = 8000


def read_instructions(run_dir: Path | None) -> str:
    """The run's instructions for labelers (:data:`INSTRUCTIONS_FILE`), as plain text the page
    shows as text, never as HTML; ``""`` without them. A received run folder is not trusted:
    a link (the file or ``web/``) or anything but a regular file is ignored, and at most
    :data:`INSTRUCTIONS_LIMIT` bytes are read, undecodable bytes replaced."""
    if run_dir is None:
        return ""
    web = Path(run_dir) / "web"
    path = web / INSTRUCTIONS_FILE
    if web.is_symlink() or not web.is_dir() or path.is_symlink():
        return ""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        return f.read(INSTRUCTIONS_LIMIT).decode("utf-8", errors="replace").strip()


def create_app(store: LabelStore, run_dir: Path | None = None,
               hosts: list[str] | tuple[str, ...] = LOOPBACK_NAMES) -> Any:
    """The labeling app for a store (``run_dir``: where ``eval.csv`` is, for the status page;
    ``hosts``: the accepted ``Host`` header names, see :func:`allowed_hosts`).

    Without labelers in the store everyone is the anonymous labeler ``local`` (only allowed on
    a loopback address, see :class:`LabelServer`); with labelers a valid token is required.
    """
    app = FastAPI(title="Themis labeling", version="1", docs_url=None, redoc_url=None,
                  openapi_url=None)
    instructions = read_instructions(run_dir)  # what "better" means (label_instructions)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    def labeler(token: str | None = Query(None, max_length=64),
                x_themis_token: str | None = Header(None, max_length=64)) -> str:
        given = token or x_themis_token
        if not store.has_labelers():
            return LOCAL_LABELER
        name = store.labeler_for_token(given) if given else None
        if name is None:
            raise HTTPException(401, "a valid labeler token is required")
        return name

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(who: str = Depends(labeler)) -> dict[str, Any]:
        return app.openapi()

    @app.get("/", response_class=HTMLResponse)
    def page(who: str = Depends(labeler)) -> str:
        return LABEL_PAGE

    @app.get("/status", response_class=HTMLResponse)
    def status_page(who: str = Depends(labeler)) -> str:
        return STATUS_PAGE

    @app.get("/api/next")
    def next_query(who: str = Depends(labeler)) -> dict[str, Any]:
        qid = store.next_query(who)
        return {"query_id": qid, "labeler": who, "pending": store.pending_count(),
                "answered": store.answered_by(who),
                "rating_classes": store.rating_classes(qid) if qid is not None else 0,
                "instructions": instructions}

    @app.get("/api/clips/{query_id}", response_class=FileResponse)
    def clip(query_id: int = PathParam(ge=1, le=2**62),
             who: str = Depends(labeler)) -> FileResponse:
        try:
            path = store.clip_path(query_id)
        except UnknownQuery:
            raise HTTPException(404, f"no query {query_id}") from None
        if not path.is_file():
            raise HTTPException(404, f"the clip of query {query_id} is missing")
        media = "video/mp4" if path.suffix == ".mp4" else "image/gif"
        return FileResponse(path, media_type=media)

    @app.post("/api/answers", status_code=201)
    def answer(body: Answer, who: str = Depends(labeler)) -> dict[str, Any]:
        if not 1 <= body.query_id <= 2**62:
            raise HTTPException(404, f"no query {body.query_id}")
        if (body.label is None) == (body.rating is None):
            raise HTTPException(422, "give a label (left, right, equal, skip) or a rating")
        label = LABELS[body.label] if body.label is not None else float(body.rating or 0) - 1
        try:
            classes = store.rating_classes(body.query_id)  # a query's kind never changes
            if (body.label not in (None, "skip")) if classes else body.rating is not None:
                raise ValueError(f"query {body.query_id} takes " + (
                    f"a rating 1 … {classes} or skip" if classes else
                    "a label (left, right, equal, skip), not a rating"))
            if classes and body.rating is not None and not 1 <= body.rating <= classes:
                raise ValueError(f"rating {body.rating} is out of range: query {body.query_id} "
                                 f"takes an integer rating from 1 (worst) to {classes} (best), "
                                 "or the label skip")
            store.answer(body.query_id, who, label)
        except UnknownQuery:
            raise HTTPException(404, f"no query {body.query_id}") from None
        except (DuplicateAnswer, QueryFull) as e:
            raise HTTPException(409, str(e)) from None
        except ValueError as e:  # a rating for a pair, a pair's label for a rating, 7 of 5
            raise HTTPException(422, str(e)) from None
        return {"stored": True, "query_id": body.query_id, "labeler": who,
                "answered": store.answered_by(who)}

    @app.get("/api/status")
    def status(who: str = Depends(labeler)) -> dict[str, Any]:
        out = store.status()
        curve: list[list[float]] = []
        eval_csv = run_dir / "eval.csv" if run_dir else None
        if eval_csv is not None and eval_csv.is_file() and eval_csv.stat().st_size:
            df = pd.read_csv(eval_csv)
            curve = df[["step", "episode_reward"]].astype(float).values.tolist()
        out["learning_curve"] = curve
        out["labelers"] = [{k: (None if isinstance(v, float) and v != v else v)  # NaN: none
                            for k, v in row.items()} for row in crowd.labeler_scores(store)]
        return out

    return BodyLimit(TrustedHostMiddleware(app, allowed_hosts=list(hosts)))


class LabelServer:
    """uvicorn serving :func:`create_app` in a background thread of the training run.

    Raises:
        ValueError: a non-loopback ``host`` without labeler tokens.
    """

    def __init__(self, store: LabelStore, host: str = "127.0.0.1", port: int = 8765,
                 run_dir: Path | None = None) -> None:
        import uvicorn

        if not is_loopback(host) and not store.has_labelers():
            raise ValueError(f"binding {host} exposes the labeling page beyond this machine: "
                             "create labeler tokens with labelers=N")
        self.host, self.port, self.run_dir = host, port, run_dir
        config = uvicorn.Config(create_app(store, run_dir, allowed_hosts(host)), host=host,
                                port=port, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="label-server", daemon=True)

    @property
    def url(self) -> str:
        """The address to open: a server bound to all interfaces (0.0.0.0, ::) is named by
        this machine's host name, which other machines can reach."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}/"

    def start(self, timeout: float = 15.0) -> LabelServer:
        """Start serving; returns once the socket is open. Port 0 takes a free port, read back
        into :attr:`port`; with a ``run_dir`` the address is written to
        ``RUN_DIR/web/server.json`` (``{"url", "host", "port"}``) for scripts and tests.

        Raises:
            RuntimeError: the server did not start (e.g. the port is taken).
        """
        self.thread.start()
        deadline = time.time() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.time() > deadline:
                raise RuntimeError(f"the labeling server could not listen on "
                                   f"{self.host}:{self.port} (port taken?); set label_port=")
            time.sleep(0.05)
        if self.port == 0:
            self.port = int(self.server.servers[0].sockets[0].getsockname()[1])
        if self.run_dir is not None:
            info = self.run_dir / "web" / "server.json"
            info.parent.mkdir(parents=True, exist_ok=True)
            tmp = info.with_suffix(".tmp")
            tmp.write_text(json.dumps({"url": self.url, "host": self.host, "port": self.port}))
            os.replace(tmp, info)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        if self.run_dir is not None:
            (self.run_dir / "web" / "server.json").unlink(missing_ok=True)


LABEL_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Themis labeling</title>
<style>
 body { font-family: system-ui, sans-serif; margin: 0.5em auto; max-width: 60em;
        padding: 0 0.5em; }
 h1 { font-size: 1.5em; margin: 0.2em 0; }
 /* the clip and its buttons stay in view on a laptop screen (1366x768) */
 video { display: block; width: 100%; max-height: calc(100vh - 16em); object-fit: contain;
         background: #eee; }
 button { font-size: 1.2em; margin: 0.2em; padding: 0.35em 1em; }
 #counters { color: #555; margin: 0.3em 0; }
 #instructions { white-space: pre-wrap; max-height: 5.5em; overflow: auto; margin: 0.3em 0;
                 padding: 0.3em 0.6em; border-left: 4px solid #4a90d9; background: #f3f7fc; }
 .hint { margin: 0.2em 0; color: #333; }
 #answers { display: flex; flex-wrap: wrap; align-items: center; }
</style></head>
<body>
<h1 id="question">Which clip is better?</h1>
<div id="counters">answered: <span id="answered">0</span> · pending: <span id="pending">0</span>
 · labeler: <span id="labeler"></span> · <a id="status-link" href="status">status</a></div>
<div id="instructions" hidden></div>
<div id="query"><video id="clip" autoplay loop muted playsinline></video>
<div id="answers"><div id="pairwise"><span class="hint">Left = clip 1, right = clip 2.</span>
 <button id="left" onclick="send('left')">Left better (1)</button>
 <button id="right" onclick="send('right')">Right better (2)</button>
 <button id="equal" onclick="send('equal')">Equal (0)</button></div>
<div id="rating" hidden><span class="hint">1 = worst, the last = best.</span>
 <span id="ratings"></span></div>
<button id="skip" onclick="send('skip')">Can't tell (s)</button></div>
</div>
<p id="empty" hidden>No query waiting. This page checks again every few seconds.</p>
<script>
const token = new URLSearchParams(location.search).get("token");
const q = token ? "?token=" + encodeURIComponent(token) : "";
document.getElementById("status-link").href = "status" + q;
let current = null, classes = 0;
async function load() {
  const r = await fetch("api/next" + q);
  const d = await r.json();
  document.getElementById("answered").textContent = d.answered;
  document.getElementById("pending").textContent = d.pending;
  document.getElementById("labeler").textContent = d.labeler;
  current = d.query_id;
  classes = d.rating_classes;
  const told = document.getElementById("instructions");
  told.textContent = d.instructions || "";  // text, never HTML
  told.hidden = !d.instructions;
  document.getElementById("pairwise").hidden = classes > 0;
  document.getElementById("rating").hidden = classes === 0;
  document.getElementById("question").textContent =
    classes > 0 ? "How good is this clip?" : "Which clip is better?";
  const buttons = document.getElementById("ratings");
  buttons.replaceChildren();
  for (let c = 1; c <= classes; c++) {
    const b = document.createElement("button");
    b.id = "rate" + c; b.textContent = String(c); b.onclick = () => send(null, c);
    buttons.appendChild(b);
  }
  document.getElementById("query").hidden = current === null;
  document.getElementById("empty").hidden = current !== null;
  if (current === null) { setTimeout(load, 3000); return; }
  document.getElementById("clip").src = "api/clips/" + current + q;
  document.body.dataset.query = current;
}
async function send(label, rating) {
  if (current === null) return;
  const id = current; current = null;
  const body = rating ? {query_id: id, rating: rating} : {query_id: id, label: label};
  await fetch("api/answers" + q, {method: "POST", headers: {"Content-Type": "application/json"},
                                  body: JSON.stringify(body)});
  await load();
}
document.addEventListener("keydown", e => {
  const n = parseInt(e.key, 10);
  if (classes > 0 && n >= 1 && n <= classes) { send(null, n); return; }
  const k = e.key === "s" ? "skip" :
    classes > 0 ? null : {"1": "left", "2": "right", "0": "equal"}[e.key];
  if (k) send(k);
});
load();
</script></body></html>
"""

STATUS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Themis run status</title>
<style>body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; }
 td, th { padding: 0.2em 1em; text-align: left; }</style></head>
<body><h1>Run status</h1>
<p>Queries: <span id="queries"></span> · pending: <span id="pending"></span> · answers:
 <span id="answers"></span> · agreement between labelers: <span id="agreement"></span></p>
<h2>Learning curve (true return)</h2><p id="no-curve">No evaluation yet: the curve appears
 after the run's second evaluation (every eval_frequency steps).</p>
<div id="curve-box" hidden><svg id="curve" width="600" height="250"></svg></div>
<h2>Labelers</h2><table id="labelers"><tr><th>labeler</th><th>answers</th><th>gold answers</th>
<th>gold accuracy</th><th>agreement with others</th><th>median s per answer</th>
<th>flagged</th></tr></table>
<script>
const token = new URLSearchParams(location.search).get("token");
const q = token ? "?token=" + encodeURIComponent(token) : "";
fetch("api/status" + q).then(r => r.json()).then(d => {
  for (const k of ["queries", "pending", "answers"]) document.getElementById(k).textContent = d[k];
  document.getElementById("agreement").textContent =
    d.agreement === null ? "n/a" : (100 * d.agreement).toFixed(0) + " %";
  const t = document.getElementById("labelers");
  const pct = v => v === null ? "n/a" : (100 * v).toFixed(0) + " %";
  for (const s of d.labelers) {
    const row = t.insertRow();
    for (const v of [s.labeler, s.answers, s.gold_answers, pct(s.gold_accuracy),
                     pct(s.agreement), s.median_seconds === null ? "n/a" :
                     s.median_seconds.toFixed(1), s.flagged ? "yes" : ""])
      row.insertCell().textContent = v;
  }
  const c = d.learning_curve, svg = document.getElementById("curve");
  document.getElementById("no-curve").hidden = c.length > 1;
  document.getElementById("curve-box").hidden = c.length <= 1;
  if (c.length > 1) {
    const xs = c.map(p => p[0]), ys = c.map(p => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    const pts = c.map(p => [20 + 560 * (p[0] - x0) / ((x1 - x0) || 1),
                            230 - 210 * (p[1] - y0) / ((y1 - y0) || 1)].join(",")).join(" ");
    svg.innerHTML = '<polyline fill="none" stroke="steelblue" stroke-width="2" points="' + pts +
      '"/><text x="20" y="15">' + y1.toFixed(1) + '</text><text x="20" y="245">' +
      y0.toFixed(1) + '</text>';
  }
});
</script></body></html>
"""
