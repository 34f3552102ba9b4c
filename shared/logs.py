"""Log lines for every process: text (default) or JSON (the `log_format` setting:
TOKENQ_LOG_FORMAT=json, or `log_format = "json"` in the TOML file), with the job's context
(job_id, tenant, model, attempt, worker) on every line logged while it is bound
(`bind(job_id=...)`, per thread or asyncio task: a context variable)."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator

_CTX: contextvars.ContextVar[dict[str, str | int] | None] = contextvars.ContextVar(
    "tokenq_log_context", default=None)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextlib.contextmanager
def bind(**fields: str | int | None) -> Iterator[None]:
    """Add fields to every log line in this block (nested binds merge)."""
    token = _CTX.set({**(_CTX.get() or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _CTX.reset(token)


def context() -> dict[str, str | int]:
    return dict(_CTX.get() or {})


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, msg, the bound context, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name,
            "msg": record.getMessage(), **(_CTX.get() or {}),
        }
        for key in ("job_id", "tenant", "model", "attempt", "worker", "method", "path",
                    "status", "duration_ms"):
            if key in record.__dict__:
                out[key] = record.__dict__[key]
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def log_format() -> str:
    """The `log_format` setting, read where every setting is (TOKENQ_LOG_FORMAT, else the
    TOML file); text while the settings do not load (the command says why itself)."""
    from tokenq.shared.settings import Settings

    try:
        return Settings().log_format
    except (ValueError, OSError):
        return "text"


def json_wanted() -> bool:
    """Whether this process writes JSON lines (a root handler formats them): then a log
    line's context is worth a Redis read."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def formatter(fmt: str | None = None) -> logging.Formatter:
    """The formatter of `fmt` (`text` | `json`; None: the `log_format` setting)."""
    return JsonFormatter() if (fmt or log_format()) == "json" else logging.Formatter(TEXT_FORMAT)


def configure(level: str | int = "INFO", fmt: str | None = None) -> None:
    """Root logging to stderr in the chosen format (None: the `log_format` setting; replaces
    earlier handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # after the handler is in place: a warning from reading the settings (an old variable
    # name) is not lost
    handler.setFormatter(formatter(fmt))
