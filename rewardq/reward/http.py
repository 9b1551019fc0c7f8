"""HTTP for the managers that call a server: one session each, and what a failed request means.

The HTTP-speaking managers (``disrm``, ``genrm``'s judge) each keep one ``aiohttp`` connection
pool for all their requests; :class:`HttpSession` is that pool's life cycle, in one place.

:func:`status_failure_kind` (:mod:`rewardq.queue.states`, where every failure kind is decided)
says what kind of failure an HTTP answer (or no answer) is, for every client of a remote scorer
(judges, reward models, SandboxFusion) alike: a server that may answer later (no answer, 408, 429,
5xx) is ``transient`` and retried in place by the worker; one refusing the fleet's credentials,
permissions, model or path (401, 403, 404) is ``config``; any other 4xx says the request itself is
wrong (``scorer``). :func:`retry_after_seconds` reads the server's ``Retry-After``, which the
worker's retry honours, and :func:`retry_after_of` finds it on a failure.
"""

from __future__ import annotations

import email.utils
import logging
import time
from typing import TYPE_CHECKING

from rewardq.queue.states import CONFIG_STATUSES, TRANSIENT_STATUSES, status_failure_kind

__all__ = [
    "CONFIG_STATUSES",
    "TRANSIENT_STATUSES",
    "HttpSession",
    "retry_after_of",
    "retry_after_seconds",
    "status_failure_kind",
    "warn_retired_options",
]

if TYPE_CHECKING:
    import aiohttp

logger = logging.getLogger("rewardq.reward")


def warn_retired_options(manager: str, given: dict[str, object]) -> None:
    """Warn when any of ``given`` (option -> value, None: not set) is set: options of the HTTP
    managers that once set their own retries (``max_retries``, ``backoff_base``, ...). The worker
    retries a transient failure in place (``retry_for``; :mod:`rewardq.consumers.retries`), the one
    retry policy, so they are accepted (a config that sets them still loads) and ignored."""
    named = sorted(k for k, v in given.items() if v is not None)
    if named:
        logger.warning(
            "%s: %s no longer set(s) anything and is ignored: a request is sent once, and a transient failure "
            "(no answer, 408, 429, 5xx) is retried in place by the worker, honouring Retry-After, until the "
            "worker's retry_for runs out; set retry_for (--retry-for, REWARDQ_RETRY_FOR) instead",
            manager,
            ", ".join(named),
        )


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date (RFC 9110); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class HttpSession:
    """A lazily opened ``aiohttp.ClientSession`` whose every request is bounded by ``timeout`` seconds."""

    def __init__(self, timeout: float) -> None:
        self.timeout = float(timeout)
        self._session: aiohttp.ClientSession | None = None

    async def get(self) -> aiohttp.ClientSession:
        """The session, opened on the first call."""
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        """Close the session (a later :meth:`get` opens a new one)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def retry_after_of(exc: BaseException) -> float | None:
    """The seconds a failure says to wait: its ``retry_after`` (rewardq's failures), else the
    ``Retry-After`` header of the answer an HTTP client's exception holds (``headers`` on it or on
    its ``response``: openai, httpx, requests, aiohttp); None when it says nothing."""
    value = getattr(exc, "retry_after", None)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if value >= 0 else None
    for holder in (exc, getattr(exc, "response", None)):
        headers = getattr(holder, "headers", None)
        getter = getattr(headers, "get", None)
        if callable(getter):
            try:
                text = getter("Retry-After") or getter("retry-after")
            except Exception:  # noqa: BLE001 - a headers object of an unknown kind: it says nothing
                text = None
            if isinstance(text, str):
                return retry_after_seconds(text)
    return None
