"""The labeling server's transport guard: what keeps a page open to many labelers from taking the
training run down or being misused, apart from what the page does (:mod:`lib.label_server`).

- ASGI middleware: :class:`Guard` (security headers on every response, an error in the app is
  one console line and a 500), :class:`BodyLimit` (413 over :data:`MAX_BODY` bytes),
  :class:`HostCheck` (400 for a ``Host`` header the server does not answer: DNS rebinding);
- connection limits: :func:`guarded_h11`, uvicorn's h11 protocol with a cap on connections
  and deadlines for slow or idle clients. It subclasses uvicorn's ``H11Protocol``, which is not
  public API: ``pyproject.toml`` pins uvicorn's minor version, and
  ``tests/test_web_labeling.py::test_uvicorn_still_has_what_the_connection_guard_uses`` fails
  naming the attribute when a uvicorn release moves one of them.

Behind a reverse proxy (nginx, Caddy) for labellers outside the machine, the server stays on
127.0.0.1 and the proxy passes the loopback ``Host`` (docs/guide/web-labeling.md).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import MutableMapping
from typing import Any

from fastapi.responses import PlainTextResponse

LOG = logging.getLogger("themis.label_server")
MAX_BODY = 4096
KEEP_ALIVE = 5  # s: an idle connection (before its first request, or between two) is closed
REQUEST_TIMEOUT = 30.0  # s: a request and its response, from the connection or last response
LISTEN_QUEUE = 1024  # connections the kernel queues before the server accepts them

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


