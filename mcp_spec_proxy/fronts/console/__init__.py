"""The approval console: the proxy's own web page where a person decides on held writes.

For clients that cannot ask their user (no elicitation, no `input_required`), a write under
`review: console` — or under `human` with `review.fallback: console` — waits on the
`ConsoleQueue` (`review/console.py`) while this page shows it. The page reads the queue and the
audit log and posts decisions back to the queue; it never forwards anything itself: an approval
is a verdict, and the gate forwards (or not) as for any other reviewer.

Served on loopback only, behind `ConsoleGuard` (`guard.py`): the per-start secret in its link,
then a `SameSite=Strict` cookie; a loopback Host; an Origin equal to its own on every POST; no
CORS. `serve_console` binds, sets the queue's `url` (which the reviewers put in what the client
sees), optionally writes the link to a file (`mcp-spec-proxy console-url` reads it) and
announces new held calls on the desktop (`notify-send`, `osascript`) where one is available.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shutil
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mcp_spec_proxy.fronts.asgi import serve_asgi
from mcp_spec_proxy.fronts.console import assets, history, pages
from mcp_spec_proxy.fronts.console.guard import ConsoleGuard
from mcp_spec_proxy.fronts.console.overwrite import OldContent
from mcp_spec_proxy.review.console import ConsoleQueue, ConsoleRefused, Decision, Pending

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.leash.layers import Leash

logger = logging.getLogger(__name__)

CONSOLE_URL_FILE = "console-url"
"""The file in the state directory that holds the running console's link (`mcp-spec-proxy console-url`)."""
CONSOLE_PORT_FILE = "console-port"
"""The file in the state directory that holds the port the console prefers, so a restarted proxy serves
its console where the open tab looks for it (the key is new each run: the tab asks for the new link)."""
PORT_WAIT_S = 2.0
"""How long a starting console waits for its port, which the run before it may still hold while it stops."""
KEEPALIVE_S = 15.0
MAX_BODY = 1_000_000
ACTIONS = ("approve", "deny", "edit", "rule")
TAKEN_S = 5.0
"""How long a decision's answer waits for its call to take it (at once, unless the call is being stopped)."""
TOO_LATE = (
    "Too late: this call stopped waiting before your decision reached it (the proxy is shutting down,"
    " or its client left); it did not run — its History says so"
)
STOPPING = (
    "Approved, but the proxy is shutting down: the call runs only if it reaches its backend before the"
    " stop — its History says whether it ran"
)


AuditReader = Callable[[], Awaitable[list[dict[str, Any]]]]
"""The audit trail as rows, oldest first: `Store.read_audit`."""


class Console:
    """The console's routes over one queue, the store's audit trail (files or Postgres) and (maybe)
    LEASH's banks."""

    def __init__(
        self,
        queue: ConsoleQueue,
        audit: AuditReader,
        leash: Leash | None = None,
        old: OldContent | None = None,
        stopping: Callable[[], bool] | None = None,
    ) -> None:
        self.queue = queue
        self.audit = audit
        self.leash = leash
        self.stopping = stopping  # whether the replica is stopping: its drain ran out, or a second signal came
        self.old = old  # what a held overwrite would change, read through the gate (`overwrite.py`)
        self.secret = secrets.token_urlsafe(24)

    def app(self, port: int) -> ConsoleGuard:
        routes = [
            Route("/", self.index),
            Route("/pending/{item}", self.pending),
            Route("/logins", lambda _: HTMLResponse(pages.login_cards(dict(self.queue.logins)))),
            Route("/events", self.events),
            Route("/decide/{item}", self.decide, methods=["POST"]),
            Route("/history", self.history),
            Route("/call/{call}", self.story),
            Route("/leash", self.leash_page),
            Route("/alive", lambda _: JSONResponse({"alive": True})),
            Route("/console.js", lambda _: Response(assets.JS, media_type="text/javascript")),
            Route("/console.css", lambda _: Response(assets.CSS, media_type="text/css")),
        ]
        return ConsoleGuard(Starlette(routes=routes), secret=self.secret, port=port, command=self.queue.link_command)

    async def index(self, request: Request) -> Response:
        items = self.queue.pending()
        changes = {item.id: await self._changes(item) for item in items}
        page = pages.pending_page(
            items, self.queue.rules(), command=self.queue.link_command, changes=changes, logins=dict(self.queue.logins)
        )
        return HTMLResponse(page)

    async def pending(self, request: Request) -> Response:
        item = self.queue.get(request.path_params["item"])
        if item is None:
            return HTMLResponse("", status_code=404)
        return HTMLResponse(pages.card(item, await self._changes(item)))

    async def _changes(self, item: Pending) -> str:
        if self.old is None:
            return ""
        self.old.forget({waiting.id for waiting in self.queue.pending()})
        return await self.old.section(item)

    async def events(self, request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            version = -1
            while True:
                ids = [item.id for item in self.queue.pending()]
                version = self.queue.version
                logins = sorted(self.queue.logins)  # the servers waiting for a login: the page fetches their cards
                yield f"event: queue\ndata: {json.dumps({'ids': ids, 'logins': logins})}\n\n"
                with anyio.move_on_after(KEEPALIVE_S):
                    await self.queue.changed_since(version)

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def decide(self, request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_BODY:
            return JSONResponse({"error": "the decision is too large"}, status_code=413)
        try:
            data = json.loads(body)
        except RecursionError:  # nested past the parser's depth
            return JSONResponse({"error": "the decision is not JSON"}, status_code=400)
        except ValueError as exc:  # not JSON, not UTF-8, or an integer past Python's digit limit
            return JSONResponse({"error": f"the decision is not JSON the console reads: {_unread(exc)}"}, 400)
        if not isinstance(data, dict) or data.get("action") not in ACTIONS or not isinstance(data.get("digest"), str):
            return JSONResponse({"error": f"a decision names an action ({', '.join(ACTIONS)}) and a digest"}, 400)
        reason = data.get("reason")
        arguments = data.get("arguments") if data["action"] == "edit" else None
        if isinstance(arguments, str):  # the page sends the edit box's text: parsed here, every digit kept
            try:
                arguments = json.loads(arguments)
            except RecursionError:
                return JSONResponse({"error": "the edited arguments are nested too deep"}, status_code=409)
            except ValueError as exc:
                return JSONResponse({"error": f"the edited arguments are not valid JSON: {_unread(exc)}"}, 409)
        decision = Decision(
            data["action"],
            reason if isinstance(reason, str) else "",
            arguments=arguments,
            patterns=data.get("patterns") if data["action"] == "rule" else None,
        )
        try:
            item = self.queue.decide(request.path_params["item"], data["digest"], decision)
        except ConsoleRefused as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        with anyio.move_on_after(TAKEN_S):  # a waiting call takes it at once; one being stopped never does
            await item.taken.wait()
        if item.abandoned:
            return JSONResponse({"error": TOO_LATE, "call": item.call}, status_code=409)
        done = {
            "approve": "Approved: the call runs now.",
            "deny": "Denied: the agent is told"
            + (f" your reason: “{decision.reason.strip()}”." if decision.reason.strip() else " it was refused."),
            "edit": "Approved with your edited arguments: the call runs now.",
            "rule": "Approved; calls of this session now run without asking where "
            + (item.decision.rule.describe() if item.decision and item.decision.rule else "the rule matches")
            + ".",
        }[decision.action]
        if decision.action != "deny" and self.stopping is not None and self.stopping():
            done = STOPPING
        return JSONResponse({"message": done, "call": item.call})

    async def history(self, request: Request) -> Response:
        lines = await self.audit()
        filters = {name: request.query_params.get(name, "")[:200] for name in history.FILTERS}
        return HTMLResponse(history.history_page(history.calls(lines), filters))

    async def story(self, request: Request) -> Response:
        lines = await self.audit()
        return HTMLResponse(history.story_page(request.path_params["call"], lines))

    async def leash_page(self, request: Request) -> Response:
        lines = await self.audit()
        stats = None
        if self.leash is not None:
            stats = {"task": self.leash.tasks.stats(), "step": self.leash.steps.stats()}
        return HTMLResponse(history.leash_page(stats, lines))


async def serve_console(
    console: Console,
    host: str,
    port: int,
    *,
    url_file: Path | None = None,
    port_file: Path | None = None,
    notify: bool = False,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the console until cancelled; `task_status.started(url)` with its secret link once listening.

    With `port_file` and no port asked for, the console listens on the port it holds (the first run's
    free port, written there), or on a free one while another process holds that: a tab kept open
    across a restart then finds the new run at its address, and says to open the new link."""
    async with anyio.create_task_group() as tg:
        late = _Late()
        preferred = await _remembered_port(port_file, host) if port == 0 and port_file is not None else 0
        bound = 0
        if preferred:
            with contextlib.suppress(OSError):  # taken since it was seen free (a proxy starting beside this one)
                bound = await tg.start(
                    lambda task_status: serve_asgi(late, host, preferred, lifespan=False, task_status=task_status)
                )
        if not bound:
            bound = await tg.start(
                lambda task_status: serve_asgi(late, host, port, lifespan=False, task_status=task_status)
            )
        if port_file is not None:
            _remember_port(port_file, bound)
        late.current = console.app(bound)  # the guard needs the bound port: set before any request is read
        # The link names the address bound, never `localhost`: a browser tries ::1 as well, where
        # another local process could listen on the same port and be handed the key.
        shown = "127.0.0.1" if host == "localhost" else host
        address = f"http://{f'[{shown}]' if ':' in shown else shown}:{bound}/"
        url = f"{address}?token={console.secret}"
        console.queue.url = address  # what clients are told: never the key
        logger.info("approval console: %s (held writes wait there for your decision)", url)
        with _url_written(url_file, url):
            if notify:
                tg.start_soon(_notify_new, console.queue, url)
            task_status.started(url)
            try:
                await anyio.sleep_forever()
            finally:
                console.queue.url = None


def _unread(exc: ValueError) -> str:
    """One line for the person: Python's own words name a setting of Python, not of the console."""
    if isinstance(exc, json.JSONDecodeError):
        return str(exc)
    if isinstance(exc, UnicodeDecodeError):
        return "it is not UTF-8"
    if "digits" in str(exc):
        return f"it holds an integer longer than {sys.get_int_max_str_digits()} digits"
    return "it could not be read"


async def _remembered_port(path: Path, host: str) -> int:
    """The port in `path` once it is free (waiting up to PORT_WAIT_S for a stopping run to let go), else 0."""
    port = _read_port(path)
    if not port:
        return 0
    for _ in range(round(PORT_WAIT_S / 0.1)):
        if _free(host, port):
            return port
        await anyio.sleep(0.1)
    logger.info("the approval console's usual port %d is taken (another proxy with this state directory?)", port)
    return 0


def _read_port(path: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        port = int(path.read_text(encoding="utf-8").strip())
        if 0 < port < 65536:
            return port
    return 0


def _remember_port(path: Path, port: int) -> None:
    """The first run's port, kept: a later run that had to take another leaves the file as it was."""
    if _read_port(path):
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{port}\n", encoding="utf-8")


def _free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as serve_asgi binds: TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


class _Late:
    """The ASGI app, known once the port is bound (the guard checks the Host's port).

    uvicorn reads requests only after `serve_asgi` reports the port, and `current` is set at once then.
    """

    def __init__(self) -> None:
        self.current: ConsoleGuard | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert self.current is not None, "no request is read before the port is bound"
        await self.current(scope, receive, send)


@contextlib.contextmanager
def _url_written(path: Path | None, url: str) -> Any:
    """The link in `path` (owner-only: it holds the secret) while the console serves."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.write_text(url + "\n", encoding="utf-8")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if path.read_text(encoding="utf-8").strip() == url:  # another proxy may have written its own since
                path.unlink()


async def _notify_new(queue: ConsoleQueue, url: str) -> None:
    """A desktop notification for each newly held call, where the platform has a notifier."""
    if sys.platform == "darwin" and shutil.which("osascript"):
        command = ["osascript", "-e"]
    elif shutil.which("notify-send"):
        command = ["notify-send", "mcp-spec-proxy"]
    else:
        return
    seen: set[str] = set()
    version = queue.version
    while True:
        version = await queue.changed_since(version)
        for item in queue.pending():
            if item.id in seen:
                continue
            seen.add(item.id)
            text = f"A change waits for your approval: {item.tool.name}. Open {url.split('?')[0]}"
            if command[0] == "osascript":
                quoted = text.replace("\\", "\\\\").replace('"', '\\"')
                text = f'display notification "{quoted}" with title "mcp-spec-proxy"'
            argv = [*command, text]
            with contextlib.suppress(OSError, anyio.BrokenResourceError), anyio.move_on_after(5):
                await anyio.run_process(argv, check=False)


__all__ = ["CONSOLE_PORT_FILE", "CONSOLE_URL_FILE", "Console", "serve_console"]
