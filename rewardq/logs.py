"""Logging set-up for the command line; the library itself installs no handlers.

Every rewardq module logs through a named logger (``rewardq.worker``, ``rewardq.queue``,
``rewardq.reward``, ...) and leaves the decision of *where* lines go to the application.
The ``rewardq`` command is such an application: it calls :func:`setup_logging` once,
with the worker's ``log_level`` and ``log_format``.

Two formats:

``text``
    one human line per event::

        2026-11-30 08:50:51.123 INFO  rewardq.worker: trajectory u1_s0 manager=naive outcome=ok elapsed_ms=3.1

``json``
    one JSON object per line, for log shippers. It always has ``time`` (ISO 8601, UTC),
    ``level``, ``logger`` and ``message``, plus every field the caller passed with
    ``extra=`` (the worker passes ``tid``, ``manager``, ``outcome``, ``elapsed_ms``)::

        {"time": "2026-11-30T08:50:51.123Z", "level": "INFO", "logger": "rewardq.worker",
         "message": "trajectory u1_s0 ...", "tid": "u1_s0", "manager": "naive", "outcome": "ok",
         "elapsed_ms": 3.1}

    An exception adds ``exc`` (the formatted traceback). Values JSON cannot carry are
    written with ``str()``, so a log line never fails because of what was logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = ["JsonFormatter", "TextFormatter", "setup_logging", "LOG_FORMATS", "startup_step"]

LOG_FORMATS = ("text", "json")

#: Attributes every LogRecord has; anything else on a record came in through ``extra=``.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

#: Marks the handler we install, so calling :func:`setup_logging` twice replaces it.
_HANDLER_MARK = "_rewardq_cli_handler"


def _iso_utc(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


def extra_fields(record: logging.LogRecord) -> dict[str, object]:
    """The ``extra=`` fields of a record (everything that is not a standard attribute)."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, then the ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for k, v in extra_fields(record).items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<local time> <LEVEL> <logger>: <message>``; the ``extra`` fields are already in the message."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s.%(msecs)03d %(levelname)-5s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")


def setup_logging(level: str | int = "INFO", fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """Send log records at ``level`` and above to ``stream`` (stderr) in format ``fmt``.

    Replaces the handler a previous call installed; leaves any other handler alone.

    Args:
        level: a level name (``"debug"``, ``"INFO"``, ...) or number.
        fmt: ``"text"`` or ``"json"``.
        stream: where lines go; default ``sys.stderr``.

    Returns:
        The installed handler.

    Raises:
        ValueError: unknown level or format (the CLI validates both before calling).
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {fmt!r}")
    if isinstance(level, str):
        numeric = logging.getLevelName(level.upper())
        if not isinstance(numeric, int):
            raise ValueError(f"unknown log level {level!r}; use DEBUG, INFO, WARNING, ERROR or CRITICAL")
        level = numeric
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    return handler


@contextlib.contextmanager
def startup_step(logger: logging.Logger, what: str) -> Iterator[None]:
    """Log ``start-up: <what> ...`` before a slow start-up step and how long it took after it, so
    a worker that takes seconds to start says what it is doing (``extra``: ``startup_step``,
    ``elapsed_ms``)."""
    logger.info("start-up: %s ...", what, extra={"startup_step": what})
    t0 = time.perf_counter()
    yield
    ms = (time.perf_counter() - t0) * 1000
    logger.info(
        "start-up: %s: done in %.1fs", what, ms / 1000, extra={"startup_step": what, "elapsed_ms": round(ms, 1)}
    )
