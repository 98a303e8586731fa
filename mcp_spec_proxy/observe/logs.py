"""The process's log lines: plain text, or one JSON object a line (`--log-format json`).

Every line logged while a call is at the gate names that call and its session (`about_call`, a
context the gate enters; the tasks a call starts inherit it), in both formats' records as
`call` and `session`, so an operator joins a log line to the call's audit lines by its id. The
command line configures logging once (`configure`); nothing here runs at import.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal

LogFormat = Literal["text", "json"]
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(about)s"

_ABOUT: ContextVar[tuple[str, str] | None] = ContextVar("mcp_spec_proxy_log_call", default=None)


@contextmanager
def about_call(call: str | None, session: str) -> Iterator[None]:
    """The lines logged in this block (and its tasks) are about `call` of `session`."""
    token = _ABOUT.set((call or "", session))
    try:
        yield
    finally:
        _ABOUT.reset(token)


class _CallFields(logging.Filter):
    """Stamps each record with the call it is about, if any (a filter: on the handler, for every logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        about = _ABOUT.get()
        record.call, record.session = about if about else ("", "")
        record.about = f" [call {about[0]} session {about[1]}]" if about and about[0] else ""
        return True


class JsonLines(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and the call and session it is about."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        call, session = getattr(record, "call", ""), getattr(record, "session", "")
        if call:
            line["call"] = call
        if session:
            line["session"] = session
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class _NoLoginTracebacks(logging.Filter):
    """Drops the SDK OAuth client's tracebacks: a failed login is said in one line by the proxy
    (`backend 'x' could not log in: ...`), and a traceback of a token endpoint's unreadable answer
    quotes that answer, token and all."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.name.startswith("mcp.client.auth"))


def configure(level: str, fmt: LogFormat = "text") -> None:
    """Log to stderr at `level`, in `fmt` (as `logging.basicConfig` would, once)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_CallFields())
    handler.addFilter(_NoLoginTracebacks())
    handler.setFormatter(JsonLines() if fmt == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=level, handlers=[handler])
    if logging.getLevelName(level) != logging.DEBUG:
        # FAISS says at INFO which CPU build it tried, each miss with its ModuleNotFoundError: not news to a user.
        logging.getLogger("faiss.loader").setLevel(logging.WARNING)
