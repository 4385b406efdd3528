"""Web labeling: a FastAPI app serving a run's pending queries to many labelers.

    ./themis_train.sh human_teacher=true teacher_ui=web            # prints the URL, keeps training
    python scripts/label_server.py RUN_DIR                         # label a run trained elsewhere

The training loop posts each round's queries to the run's
:class:`themis.crowd.label_store.LabelStore` (SQLite) and gathers whatever answers have
arrived at the next round; this server is the other side: the labeling page (``/``: the
side-by-side clip looping, buttons Left / Right / Equal / Can't tell, keys 1, 2, 0, s,
counters), the status page (``/status``: learning curve, labels per
labeler, agreement) and a small JSON API (``/api/...``, OpenAPI spec at ``/openapi.json``).

Security: binds 127.0.0.1 by default; any other address needs labeler tokens (``labelers=N``),
and with tokens every request needs one (``?token=`` or the ``X-Themis-Token`` header), the
OpenAPI spec included (there is no ``/docs`` page). The status shows a labeler their own scores,
and every labeler's to the run's owner (the anonymous user of a loopback server, or the owner's
token). Requests must name the bound host in their ``Host`` header (no DNS rebinding of the
anonymous loopback mode; IPv6 in brackets); no response can be framed (``X-Frame-Options``, CSP
``frame-ancestors``) and none sends a referrer (tokens are in URLs). Bodies are limited to 4 KiB,
IDs (integers only) and labels validated, clips served by query ID only and only from the run's
``web/clips/`` (whatever path a received ``labels.sqlite`` names), and a labeler cannot answer a
query twice, nor a query that has its answers (409). Idle and slow clients are cut and
connections capped (:mod:`lib.http_guard`). The two pages are the package files
``lib/pages/label.html`` and ``lib/pages/status.html``, served as they are.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import sys
import threading
import time
import weakref
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from lib.http_guard import (
    KEEP_ALIVE,
    LISTEN_QUEUE,
    LOOPBACK_NAMES,
    REQUEST_TIMEOUT,
    BodyLimit,
    Guard,
    HostCheck,
    allowed_hosts,
    connection_cap,
    guarded_h11,
    is_loopback,
)
from themis.crowd import aggregation as crowd
from themis.crowd.label_store import OWNER, DuplicateAnswer, LabelStore, QueryFull, UnknownQuery

LOG = logging.getLogger("themis.label_server")
PAGES = resources.files("lib") / "pages"
LABEL_PAGE = PAGES / "label.html"  # the labeling page (``/``)
STATUS_PAGE = PAGES / "status.html"  # the status page (``/status``)
FREE_PORT = "label_port=0 picks a free port (or label_port=N another one)"
LABELS: dict[str, float | None] = {"left": 0.0, "right": 1.0, "equal": 0.5, "skip": None}
LOCAL_LABELER = "local"
class Answer(BaseModel):
    """One answer: ``label`` left (segment 1 better), right, equal or skip (can't tell) for a
    pair; for a rating query (``feedback=rating``) ``rating`` 1 … n (worst to best) or ``label``
    skip. Strict: integers only (``true``, ``"2"`` or ``2.0`` are refused)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    query_id: int
    label: Literal["left", "right", "equal", "skip"] | None = None
    rating: int | None = Field(None, ge=1, le=9)


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

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # what was wrong and where, not the input itself (NaN or Infinity cannot be JSON)
        return JSONResponse({"detail": [{"loc": list(e.get("loc", ())), "msg": e.get("msg"),
                                         "type": e.get("type")} for e in exc.errors()]}, 422)

    def identity(token: str | None = Query(None, max_length=64),
                 x_themis_token: str | None = Header(None, max_length=64)) -> tuple[str, bool]:
        """``(labeler name, is the run's owner)``: the anonymous ``local`` of a loopback
        server is its owner; with tokens, a labeler's token or the owner's."""
        given = token or x_themis_token
        if not store.has_labelers():
            return LOCAL_LABELER, True
        name = store.labeler_for_token(given) if given else None
        if name is not None:
            return name, False
        if given and store.is_owner_token(given):
            return OWNER, True
        raise HTTPException(401, "a valid labeler token is required")

    def labeler(who: tuple[str, bool] = Depends(identity)) -> str:
        return who[0]

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(who: str = Depends(labeler)) -> dict[str, Any]:
        return app.openapi()

    @app.get("/", response_class=HTMLResponse)
    def page(who: str = Depends(labeler)) -> str:
        return LABEL_PAGE.read_text(encoding="utf-8")

    @app.get("/status", response_class=HTMLResponse)
    def status_page(who: str = Depends(labeler)) -> str:
        return STATUS_PAGE.read_text(encoding="utf-8")

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
            path = store.servable_clip(query_id)  # inside web/clips/ only, whatever the store says
        except UnknownQuery:
            raise HTTPException(404, f"no query {query_id}") from None
        except FileNotFoundError as e:
            raise HTTPException(404, str(e)) from None
        media = "video/mp4" if path.suffix == ".mp4" else "image/gif"
        return FileResponse(path, media_type=media)

    @app.get("/api/posters/{query_id}", response_class=FileResponse)
    def poster(query_id: int = PathParam(ge=1, le=2**62),
               who: str = Depends(labeler)) -> FileResponse:
        """The first frame of a query's clip (PNG), shown until the video paints."""
        try:
            path = store.servable_poster(query_id)  # inside web/clips/ only, as the clips
        except UnknownQuery:
            raise HTTPException(404, f"no query {query_id}") from None
        except FileNotFoundError as e:
            raise HTTPException(404, str(e)) from None
        return FileResponse(path, media_type="image/png")

    episodes = store.web_dir / "episodes"  # the agent's last full episodes (DRLHP)

    @app.get("/api/episode")
    def newest_episode(who: str = Depends(labeler)) -> dict[str, Any]:
        """The integer ID of the newest episode clip (``null`` before the first)."""
        from lib.clips import newest_episode_clip

        return {"episode_id": newest_episode_clip(episodes)}

    @app.get("/api/episodes/{episode_id}", response_class=Response)
    def episode_clip(episode_id: int = PathParam(ge=1, le=2**62),
                     who: str = Depends(labeler)) -> Response:
        """The clip of episode ``episode_id``: a regular file inside ``web/episodes/`` named
        from the integer alone (no symlink out of it is followed). The bytes are read here,
        in one go: the run drops the oldest clips while new episodes end, and a file
        streamed after its length was announced could vanish half-way (a small clip, at
        most ``EpisodeClips.max_frames`` frames at half size)."""
        from lib.clips import EPISODE_PATTERN

        base = episodes / EPISODE_PATTERN.format(episode_id)
        for path in (base, base.with_suffix(".gif")):
            real = Path(os.path.realpath(path))
            if (not os.path.islink(store.web_dir) and not os.path.islink(episodes)
                    and not os.path.islink(path) and real.is_file()
                    and real.is_relative_to(os.path.realpath(episodes))):
                try:
                    data = real.read_bytes()
                except FileNotFoundError:  # dropped since: a newer episode ended
                    break
                return Response(data, media_type="video/mp4" if path.suffix == ".mp4"
                                else "image/gif")
        raise HTTPException(404, f"no episode clip {episode_id}")

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
    def status(me: tuple[str, bool] = Depends(identity)) -> dict[str, Any]:
        """Counts, the learning curve and labeler scores: a labeler's own, or (the run's
        owner) every labeler's."""
        who, owner = me
        out = store.status()
        out["owner"] = owner
        if not owner:
            out["answers_per_labeler"] = {k: v for k, v in out["answers_per_labeler"].items()
                                          if k == who}
        curve: list[list[float]] = []
        eval_csv = run_dir / "eval.csv" if run_dir else None
        if eval_csv is not None and eval_csv.is_file() and eval_csv.stat().st_size:
            df = pd.read_csv(eval_csv)
            curve = df[["step", "episode_reward"]].astype(float).values.tolist()
        out["learning_curve"] = curve
        out["labelers"] = [{k: (None if isinstance(v, float) and v != v else v)  # NaN: none
                            for k, v in row.items()} for row in crowd.labeler_scores(store)
                           if owner or row["labeler"] == who]
        return out

    return Guard(BodyLimit(HostCheck(app, list(hosts))))


class LabelServer:
    """uvicorn serving :func:`create_app` in a background thread of the training run.

    The server cannot take the training run down with it: it holds at most
    ``max_connections`` connections (default :func:`connection_cap`, well below the file
    descriptor limit the run shares), cuts idle and slow clients (:func:`guarded_h11`), and an
    error that stops it is printed as one line while training goes on.

    Raises:
        ValueError: a non-loopback ``host`` without labeler tokens.
    """

    def __init__(self, store: LabelStore, host: str = "127.0.0.1", port: int = 8765,
                 run_dir: Path | None = None, max_connections: int | None = None,
                 request_timeout: float = REQUEST_TIMEOUT) -> None:
        import uvicorn

        if not is_loopback(host) and not store.has_labelers():
            raise ValueError(f"binding {host} exposes the labeling page beyond this machine: "
                             "create labeler tokens with labelers=N")
        self.host, self.port, self.run_dir = host, port, run_dir
        self.max_connections = max_connections or connection_cap()
        # log_config=None: uvicorn's default calls logging.config.dictConfig, which binds
        # its handlers to the sys.stderr of this moment (a test's captured stream, closed
        # once the test ends) and resets every handler of the process; without it uvicorn's
        # records propagate to the root logger (the console's last-resort handler in a run)
        config = uvicorn.Config(create_app(store, run_dir, allowed_hosts(host)), host=host,
                                port=port, log_level="warning", access_log=False,
                                log_config=None,
                                http=guarded_h11(self.max_connections, request_timeout),
                                ws="none", lifespan="off", timeout_keep_alive=KEEP_ALIVE,
                                # asyncio accepts up to `backlog` sockets in a burst before
                                # the cap can close any: keep the burst small
                                backlog=max(8, min(128, self.max_connections // 2)))
        self.server = uvicorn.Server(config)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="label-server", daemon=True)

    def _serve(self) -> None:
        try:
            self.server.run()
        except BaseException as e:  # SystemExit too: a server error never ends training
            self.error = e
            if self.server.started:
                print(f"labeling server stopped: {type(e).__name__}: {e}", file=sys.stderr)

    @property
    def url(self) -> str:
        """The address to open: a server bound to all interfaces (0.0.0.0, ::) is named by
        this machine's host name, which other machines can reach."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:  # an IPv6 address: http://[::1]:8765/
            host = f"[{host}]"
        return f"http://{host}:{self.port}/"

    def start(self, timeout: float = 15.0) -> LabelServer:
        """Start serving; returns once the socket is open. Port 0 takes a free port, read back
        into :attr:`port`; with a ``run_dir`` the address is written to
        ``RUN_DIR/web/server.json`` (``{"url", "host", "port"}``) for scripts and tests.

        Raises:
            RuntimeError: the server did not start (e.g. the port is taken).
        """
        self.check_port()  # before uvicorn, which logs its own raw [Errno 98] line
        self.thread.start()
        _LIVE.add(self)
        deadline = time.time() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.time() > deadline:
                raise RuntimeError(f"the labeling server could not listen on "
                                   f"{self.host}:{self.port} (port taken?); {FREE_PORT}")
            time.sleep(0.05)
        listening = self.server.servers[0].sockets
        for sock in listening:  # a longer queue in the kernel (no file held): see `backlog`
            with socket.socket(fileno=os.dup(sock.fileno())) as same:
                same.listen(LISTEN_QUEUE)
        if self.port == 0:
            self.port = int(listening[0].getsockname()[1])
        if self.run_dir is not None:
            info = self.run_dir / "web" / "server.json"
            info.parent.mkdir(parents=True, exist_ok=True)
            tmp = info.with_suffix(".tmp")
            tmp.write_text(json.dumps({"url": self.url, "host": self.host, "port": self.port}))
            os.replace(tmp, info)
        return self

    def check_port(self) -> None:
        """Refuse a port another program listens on, in one line.

        Raises:
            RuntimeError: the port is taken (or the address is not this machine's).
        """
        if self.port == 0:
            return
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                probe.bind((self.host, self.port))
            except OSError as e:
                why = "is taken" if e.errno == errno.EADDRINUSE else \
                    f"cannot be used ({e.strerror})"
                raise RuntimeError(f"port {self.port} on {self.host} {why}; {FREE_PORT}"
                                   ) from None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving and wait for the server's thread to end (at most ``timeout``
        seconds for a graceful stop, then open connections are cut and it waits as long
        again), so that nothing of the server writes after its owner has gone on."""
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=timeout)
        if self.thread.is_alive():  # connections that do not close: cut them
            self.server.force_exit = True
            self.thread.join(timeout=timeout)
        _LIVE.discard(self)
        if self.run_dir is not None:
            (self.run_dir / "web" / "server.json").unlink(missing_ok=True)


_LIVE: weakref.WeakSet[LabelServer] = weakref.WeakSet()
"""Servers started and not stopped (tests stop what a test left running:
:func:`live_servers`)."""


def live_servers() -> list[LabelServer]:
    """The label servers of this process that were started and not stopped."""
    return [server for server in list(_LIVE) if server.thread.is_alive()]

