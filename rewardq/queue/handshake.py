"""A connection's handshake retried with its socket, by the one retry policy.

redis-py opens a connection's socket under its ``Retry``, then sends the handshake (``HELLO``,
``AUTH``, ``SELECT``, ``CLIENT SETINFO``) outside it. A connection is taken from the pool, and
connected, before a command's own retry begins (redis-py's pipelines, and a client's first
command), so a handshake that fails (a server SIGKILLed after it accepted the socket resets it; a
restarted server still loading its data answers ``LOADING``) reached the caller at once: a
producer's ``put_*`` failed on a one-second Redis restart that its retry policy rides out.
:class:`RetriedHandshake` (blocking) and :class:`AsyncRetriedHandshake` connect again, under the
connection's retry policy (:mod:`rewardq.queue.retry`), when the handshake failed; the socket's
own tries share the call's deadline, so the worst case stays the policy's ``DEADLINE``. A socket
that cannot be opened fails as before, once its own tries are spent (a refused connection: ~5-9 s),
and a refused password still fails at once (:func:`~rewardq.queue.retry.may_resend`).

:func:`mix_into` gives a pool's connections a mixin by subclassing whatever connection class the
URL chose (TCP, TLS or a Unix socket), so nothing else about them changes.
"""

from __future__ import annotations

from typing import Any

_CLASSES: dict[tuple[type, type], type] = {}


def mix_into(pool: Any, mixin: type) -> Any:
    """``pool`` (a redis-py connection pool) whose new connections are ``mixin`` + their class."""
    base = pool.connection_class
    if issubclass(base, mixin):
        return pool
    cls = _CLASSES.get((mixin, base))
    if cls is None:
        cls = _CLASSES[mixin, base] = type(f"{mixin.__name__}{base.__name__}", (mixin, base), {})
    pool.connection_class = cls
    return pool


class RetriedHandshake:
    """A mixin for blocking redis-py connections: a failed handshake is sent again under ``self.retry``.

    Only a failure inside the handshake (``on_connect``) is retried here: opening the socket already
    ran under the same policy, so a refused connection fails as soon as those tries are spent, not
    once per try of this layer.
    """

    _sock: Any
    retry: Any
    _handshaking = False

    def connect(self) -> None:
        if self._sock:
            return
        parent = super()

        def attempt() -> None:
            self._handshaking = False
            parent.connect()  # type: ignore[attr-defined]  # the redis-py connection this mixes into

        def failed(error: BaseException) -> None:
            self.disconnect()  # type: ignore[attr-defined]
            if not self._handshaking:
                raise error  # the socket's own tries are spent: do not multiply them

        self.retry.call_with_retry(attempt, failed)

    def on_connect(self) -> None:
        self._handshaking = True
        super().on_connect()  # type: ignore[misc]  # the redis-py connection this mixes into


class AsyncRetriedHandshake:
    """The asyncio twin of :class:`RetriedHandshake`."""

    is_connected: bool
    retry: Any
    _handshaking = False

    async def connect(self) -> None:
        if self.is_connected:
            return
        parent = super()

        async def attempt() -> None:
            self._handshaking = False
            await parent.connect()  # type: ignore[attr-defined]  # the redis-py connection this mixes into

        async def failed(error: BaseException) -> None:
            await self.disconnect()  # type: ignore[attr-defined]
            if not self._handshaking:
                raise error  # the socket's own tries are spent: do not multiply them

        await self.retry.call_with_retry(attempt, failed)

    async def on_connect(self) -> None:
        self._handshaking = True
        await super().on_connect()  # type: ignore[misc]  # the redis-py connection this mixes into


def retried_handshakes(pool: Any, *, sync: bool) -> Any:
    """``pool`` whose connections retry their handshake (see the module doc)."""
    return mix_into(pool, RetriedHandshake if sync else AsyncRetriedHandshake)
