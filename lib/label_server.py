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
connections capped (:func:`guarded_h11`).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import socket
import stat
import sys
import threading
import time
import weakref
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from themis.crowd import aggregation as crowd
from themis.crowd.label_store import OWNER, DuplicateAnswer, LabelStore, QueryFull, UnknownQuery

LOG = logging.getLogger("themis.label_server")
MAX_BODY = 4096
KEEP_ALIVE = 5  # s: an idle connection (before its first request, or between two) is closed
REQUEST_TIMEOUT = 30.0  # s: a request and its response, from the connection or last response
LISTEN_QUEUE = 1024  # connections the kernel queues before the server accepts them
FREE_PORT = "label_port=0 picks a free port (or label_port=N another one)"
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
    skip. Strict: integers only (``true``, ``"2"`` or ``2.0`` are refused)."""

    model_config = ConfigDict(extra="forbid", strict=True)
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


class Guard:
    """Outermost ASGI middleware: every response carries :data:`SECURITY_HEADERS` (the 400 of
    the ``Host`` check and the 413 of the body limit too), and an error inside the app is one
    line on the console (``themis.label_server`` logger) and a 500, never a traceback."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def secured(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(
                    (k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()
                    if k.lower().encode() not in names)]
            await send(message)

        try:
            await self.app(scope, receive, secured)
        except Exception as e:
            LOG.warning("labeling server: %s %s failed: %s: %s", scope.get("method"),
                        scope.get("path"), type(e).__name__, str(e).splitlines()[0][:200]
                        if str(e) else "")
            if not started:
                await PlainTextResponse("internal error", status_code=500)(scope, receive,
                                                                            secured)


def connection_cap() -> int:
    """How many connections the server holds at most: a quarter of this process's file
    descriptor limit (the training run shares it), between 16 and 256."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # no resource module (Windows)
        return 256
    if soft == resource.RLIM_INFINITY:
        return 256
    return int(min(256, max(16, soft // 4)))


def guarded_h11(max_connections: int, request_timeout: float) -> type:
    """uvicorn's h11 protocol with limits on what a client can hold (pass as ``http=``).

    uvicorn closes a keep-alive connection idle after a response, but not one that never sends
    a request or sends it byte by byte; hundreds of those exhaust the process's file
    descriptors (the training run's too). Here:

    - a new connection gets the keep-alive timeout (``timeout_keep_alive``, 5 s) to start its
      request, and every request/response exchange ``request_timeout`` seconds (from the
      connection, or the previous response, to the end of the response): slow clients are cut;
    - at most ``max_connections`` connections are held: a new one beyond that closes the
      oldest connection that is not being answered (idle, or still sending its request's
      headers), or is itself closed when every one is being answered.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        opened = 0.0
        deadline: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.opened = self.loop.time()
            open_ = [c for c in self.connections if isinstance(c, GuardedH11Protocol)
                     and c is not self and not c.transport.is_closing()]
            if len(open_) >= max_connections:  # closed ones leave the set a moment later
                idle = [c for c in open_ if c.idle()]
                if not idle:
                    self.transport.close()
                    return
                min(idle, key=lambda c: c.opened).transport.close()
            # idle before a first request: closed like an idle keep-alive connection
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler)
            self.arm()

        def idle(self) -> bool:
            """Not being answered: no request's headers in yet, or the last response sent."""
            return self.cycle is None or self.cycle.response_complete

        def arm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
            self.deadline = self.loop.call_later(request_timeout, self.expire)

        def expire(self) -> None:
            if not self.transport.is_closing():
                self.transport.abort()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
            super().connection_lost(exc)

    return GuardedH11Protocol


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host name or address of a ``Host`` header, without the port and (IPv6) brackets,
    lower case, addresses in their short form: ``[::1]:8765`` → ``::1``, ``Example:80`` →
    ``example``; ``""`` when malformed (an IPv6 address without brackets)."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        name, rest = (header[1:end], header[end + 1:]) if end > 0 else ("", "")
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return ""
    elif header.count(":") > 1:
        return ""
    else:
        name = header.split(":", 1)[0]
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return name


class HostCheck:
    """ASGI middleware: requests whose ``Host`` header names none of ``hosts`` get 400 (DNS
    rebinding). ``hosts`` as :func:`allowed_hosts` gives them (``*``: any); IPv6 addresses are
    matched in brackets, ``[::1]:8765``."""

    def __init__(self, app: Any, hosts: list[str] | tuple[str, ...]) -> None:
        self.app, self.any = app, "*" in hosts
        self.hosts = {host_name(f"[{h}]" if ":" in h else h) for h in hosts if h != "*"}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self.any:
            header = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if host_name(header) not in self.hosts:
                await PlainTextResponse("Invalid host header", status_code=400)(scope, receive,
                                                                               send)
                return
        await self.app(scope, receive, send)


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


LABEL_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Themis labeling</title>
<style>
 body { font-family: system-ui, sans-serif; margin: 0.5em auto; max-width: 60em;
        padding: 0 0.5em; }
 h1 { font-size: 1.5em; margin: 0.2em 0; }
 /* the clip and its buttons stay in view on a laptop screen (1366x768) */
 video { display: block; width: 100%; max-height: calc(100vh - 16em); object-fit: contain;
         background: #eee; }
 #episode { width: 40%; max-height: 30vh; }
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
<div id="episode-box" hidden><p class="hint">The agent's last full episode (refreshed when an
 episode ends), to see how its behaviour changes:</p>
<video id="episode" autoplay loop muted playsinline></video></div>
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
  const clip = document.getElementById("clip");
  clip.poster = "api/posters/" + current + q;  // the first frame until the video paints
  clip.src = "api/clips/" + current + q;
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
let episodeShown = null;
async function episode() {
  const r = await fetch("api/episode" + q);
  if (r.ok) {
    const d = await r.json();
    if (d.episode_id !== null && d.episode_id !== episodeShown) {
      episodeShown = d.episode_id;
      document.getElementById("episode").src = "api/episodes/" + d.episode_id + q;
      document.getElementById("episode-box").hidden = false;
    }
  }
  setTimeout(episode, 5000);
}
load();
episode();
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
  const none = document.getElementById("no-curve");
  if (c.length === 1)  // one evaluation: its return, not "no evaluation yet"
    none.textContent = "One evaluation so far: true return " + c[0][1].toFixed(1) +
      " at step " + c[0][0] + "; the curve appears after the second.";
  none.hidden = c.length > 1;
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
