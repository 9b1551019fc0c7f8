"""What a producer's ``put_*`` raises when Redis fails it: rewardq's errors, short and actionable.

redis-py's own exceptions are no use to an agent loop: an out-of-memory refusal inside a pipeline
carries the whole command, record bytes included, in its message (a 1 MB record makes a 1 MB
message), and a stalled server gives a bare ``TimeoutError``. :func:`put_error` turns each into a
:class:`~rewardq.errors.PutError` subclass whose message (under 1,000 characters, never a record
byte) says what happened, whether this call wrote anything, and what to do:

* :class:`~rewardq.errors.RedisOutOfMemory`: Redis is past ``maxmemory``; raise it or let workers
  drain the backlog, then put again;
* :class:`~rewardq.errors.RedisTimeout`: no answer in time; whether it was applied is unknown, and
  putting the same outputs again is safe (a record sent twice is scored once);
* :class:`~rewardq.errors.RedisConnectionLost`: Redis could not be reached (after the retry policy);
* :class:`~rewardq.errors.RedisPermissionError`: the ACL user may not run a command (``NOPERM``),
  with the ``ACL SETUSER`` that grants what rewardq needs, as the worker and the CLI say it;
* :class:`~rewardq.errors.PutError`: refused credentials, and any other refusal (``MISCONF``,
  ``READONLY``, ...), with Redis's own words, cut short.

They are raised ``from None``: the original's message is exactly what must not be printed; its
type and Redis's own words are in ours.
"""

from __future__ import annotations

from redis.exceptions import AuthenticationError, NoPermissionError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rewardq.errors import PutError, RedisConnectionLost, RedisOutOfMemory, RedisTimeout, RewardqError
from rewardq.queue.connection import is_out_of_memory, permission_error

#: Characters of Redis's own message kept in ours.
_REDIS_WORDS = 160
_PIPELINE_NOTE = " of pipeline caused error: "
#: Characters past which a message of no known shape is not quoted at all.
_LONG_MESSAGE = 1_000


def redis_words(exc: BaseException) -> str:
    """Redis's own message of ``exc``, without the command redis-py prepends to pipeline errors
    (which holds the record bytes), cut to a few words.

    The command ends where redis-py's note begins, however long it is: the words are what follows
    the note's last occurrence (the asyncio client writes them as an args tuple, unwrapped here). A
    long message of another shape may hold a record anywhere: only its length is said.
    """
    text = str(exc.args[0]) if exc.args else str(exc)
    if _PIPELINE_NOTE in text:
        text = text.rpartition(_PIPELINE_NOTE)[2].strip()
        if text.startswith("(") and text.endswith(",)"):  # the asyncio client's ('words',)
            text = text[1:-2].strip("'\"")
    elif len(text) > _LONG_MESSAGE:
        return f"a {len(text):,}-character message, not shown: it may hold record bytes"
    text = " ".join(text.split())
    return text if len(text) <= _REDIS_WORDS else text[: _REDIS_WORDS - 3] + "..."


def put_error(
    exc: BaseException,
    what: str,
    keys: list[str],
    *,
    written: bool | None,
    namespace: str = "",
    user: str = "default",
) -> RewardqError | None:
    """The rewardq error for a Redis failure of a put, or None when ``exc`` is not a Redis failure
    (a bug, a cancellation: the caller re-raises it as is).

    ``what`` names the call (``put_trajectory of 40 outputs of u_s (1.2 MB)``); ``written`` says
    whether anything of it was written (False: nothing; None: unknown); ``namespace`` and ``user``
    go into the grant a permission error suggests.
    """
    nothing = "nothing of it was written" if written is False else "it may or may not have been written"
    earlier = "outputs put by earlier calls stay queued"
    again = "putting the same outputs again is safe: a record sent twice is scored once"
    if isinstance(exc, NoPermissionError):
        return permission_error(exc, namespace or "<namespace>", "", user=user)
    if isinstance(exc, AuthenticationError):
        return PutError(
            f"Redis refused the credentials for {what} ({redis_words(exc)}); nothing of it was written. "
            "Check the user and password in the Redis URL",
            keys=keys,
            written=False,
        )
    if is_out_of_memory(exc):
        return RedisOutOfMemory(
            f"Redis is out of memory and refused {what} ({redis_words(exc)}); {nothing}, and {earlier}. "
            "Raise Redis's maxmemory, or drain the backlog (start more workers; `rewardq status` shows it), "
            "then put these outputs again",
            keys=keys,
            written=written,
        )
    if isinstance(exc, RedisTimeoutError) or (isinstance(exc, TimeoutError) and not isinstance(exc, RedisError)):
        return RedisTimeout(
            f"Redis did not answer {what} in time ({type(exc).__name__}: {redis_words(exc) or 'timed out'}); "
            f"{nothing}, and {again}. Check that Redis is not stalled (a long script, a slow disk, swapping)",
            keys=keys,
            written=None,
        )
    if isinstance(exc, (RedisConnectionError, ConnectionError, OSError)):
        return RedisConnectionLost(
            f"could not reach Redis for {what} ({type(exc).__name__}: {redis_words(exc)}); {nothing}, and "
            f"{again}. Check the Redis URL and that the server is up",
            keys=keys,
            written=written if written is False else None,
        )
    if isinstance(exc, RedisError):
        return PutError(
            f"Redis refused {what} ({type(exc).__name__}: {redis_words(exc)}); {nothing}, and {earlier}. "
            "Fix what Redis names, then put these outputs again",
            keys=keys,
            written=written,
        )
    return None
