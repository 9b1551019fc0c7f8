"""HTTP for the managers that call a server: one session each, and what a failed request means.

The HTTP-speaking managers (``disrm``, ``genrm``'s judge) each keep one ``aiohttp`` connection
pool for all their requests; :class:`HttpSession` is that pool's life cycle, in one place.

:func:`status_failure_kind` says what kind of failure an HTTP answer (or no answer) is, for every
client of a remote scorer (judges, reward models, SandboxFusion) alike: a server that may answer
later (no answer, 408, 429, 5xx) is ``transient`` and retried in place by the worker; one refusing
the fleet's credentials, permissions, model or path (401, 403, 404) is ``config``; any other 4xx
says the request itself is wrong (``scorer``). :func:`retry_after_seconds` reads the server's
``Retry-After``, which the worker's retry honours.
"""

from __future__ import annotations

import email.utils
import time
from typing import TYPE_CHECKING

from rewardq.queue.states import FailureKind

if TYPE_CHECKING:
    import aiohttp

#: Answers that say the server may answer later: retried (in place, by the worker).
TRANSIENT_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))
#: Answers that say the fleet is configured wrong for this server: credentials, permissions, the
#: model or the path. Nothing retried helps; the operator must change the configuration.
CONFIG_STATUSES = frozenset({401, 403, 404})


def status_failure_kind(status: int | None) -> FailureKind:
    """The kind of failure an HTTP answer with ``status`` is (None: no answer at all, a refused
    connection or a timeout): see the module doc."""
    if status is None or status in TRANSIENT_STATUSES:
        return FailureKind.TRANSIENT
    if status in CONFIG_STATUSES:
        return FailureKind.CONFIG
    return FailureKind.SCORER


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
