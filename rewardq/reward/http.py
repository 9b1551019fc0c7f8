"""One HTTP session per manager: opened on first use (in the worker's event loop), closed once.

The HTTP-speaking managers (``disrm``, ``genrm``'s judge) each keep one ``aiohttp`` connection
pool for all their requests; this is that pool's life cycle, in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import aiohttp


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
