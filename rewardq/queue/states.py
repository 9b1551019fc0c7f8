"""The states rewardq writes into Redis, each spelt once: result statuses and dead-letter kinds.

Both are ``str`` enums, as rq's ``JobStatus``: a member *is* its value wherever a string is
expected (a Redis field, a JSON document, a Prometheus label, a comparison with what a hash
holds), and everything that lists the states (``rewardq dead-letters --kind``, the metrics'
documentation, the tests) lists the members, so a new state cannot be forgotten by one of them.
The Lua scripts spell the few they write themselves (``'error'`` results, ``'incomplete'``
dead letters and their ``'input'`` failure kind); a test checks every literal they write against
these enums.

:func:`failure_kind_of` decides the kind of a failure from the exception that says it, and
:data:`DEAD_LETTER_FAILURE` the kind of each dead letter that needs no exception to explain it:
every error result's kind is decided here, at its source, never read back out of a message.
"""

from __future__ import annotations

from enum import Enum

from rewardq.errors import (
    ConfigError,
    FleetConfigError,
    RecordError,
    RedisUnavailable,
    RewardqError,
    ScoringError,
    ScoringTimeout,
    TokenizerMismatch,
    TransientError,
)

__all__ = [
    "DEAD_LETTER_FAILURE",
    "DeadLetterKind",
    "FailureKind",
    "ResultStatus",
    "failure_kind_of",
    "http_status",
    "status_failure_kind",
]


class _Text(str, Enum):
    """A ``str`` enum that prints as its value (``f"{kind}"`` is ``crashed`` on every Python)."""

    def __str__(self) -> str:
        return str(self.value)


class ResultStatus(_Text):
    """The ``status`` field of an output key's result hash."""

    #: scored: ``reward_score`` and ``reward_extra_info`` hold the reward.
    OK = "ok"
    #: not scored: ``error`` says why, ``reward_extra_info`` is ``{"error": reason}``.
    ERROR = "error"
    #: not scored because the producer no longer needed it (``RewardClient.cancel``): never a
    #: reward, never a failure (no failure kind, not counted against any failure budget).
    CANCELLED = "cancelled"


class FailureKind(_Text):
    """What kind of failure an error result is (its ``failure_kind`` field; empty when ``ok``).

    The trainer side decides by it: a ``config`` failure stops the run at once, a ``transient``
    one is retried in place until ``retry_for`` runs out, and none of them is ever a reward.
    A wrong answer is never a failure: a program that crashes, a response with no parsable
    answer or a judge saying "bad" are rewards.
    """

    #: infrastructure that may recover: a judge or reward-model endpoint answering 429/5xx or
    #: timing out, SandboxFusion unavailable, a lost connection, a worker that died.
    TRANSIENT = "transient"
    #: the scorer ran past its budget (``score_timeout``) on this response.
    TIMEOUT = "timeout"
    #: the reward function or the manager raised.
    SCORER = "scorer"
    #: the fleet cannot score this at all as configured: an unknown data source, a missing
    #: extra, a tokenizer mismatch, code isolation unavailable, a judge answering 401/404.
    CONFIG = "config"
    #: the record itself broke a bound or did not decode.
    INPUT = "input"
    #: Redis had no room for the results: it refused them past its ``maxmemory`` for longer than
    #: ``room_wait`` (the reason names their size and the cap).
    MEMORY = "memory"


class DeadLetterKind(_Text):
    """Why an entry or a trajectory ended in the dead-letter stream (its ``kind`` field).

    Every kind but ``exhausted`` and ``conflict`` on a key of an unknown trajectory also gives
    every key of the trajectory an error result.
    """

    #: the record does not decode or breaks a bound (size, ids, index, key), or the stored
    #: records of a trajectory do not assemble.
    INVALID = "invalid"
    #: the record's ids were made with another tokenizer than the worker decodes with (its
    #: ``tokenizer`` fingerprint names another vocabulary); the error names both tokenizers.
    TOKENIZER = "tokenizer"
    #: the record contradicts what is stored (two finals, another record for a key, an index
    #: past the final one) or arrived after its trajectory finished.
    CONFLICT = "conflict"
    #: the manager raised or timed out while scoring the trajectory.
    SCORING = "scoring"
    #: the trajectory took its worker process down ``max_crashes`` times while scored alone.
    CRASHED = "crashed"
    #: the entry was delivered more than ``max_deliveries`` times without finishing.
    EXHAUSTED = "exhausted"
    #: the trajectory waited ``incomplete_timeout`` seconds for outputs that never came.
    INCOMPLETE = "incomplete"
    #: its results were scored but Redis had no room for them for ``room_wait`` seconds.
    MEMORY = "memory"


#: The failure kind of each dead-letter kind: ``scoring`` is the default of the exception's own
#: (:func:`failure_kind_of` decides it per failure); the others need no exception to say it.
#:
#: * ``invalid``, ``conflict``, ``incomplete``: the records themselves are wrong or missing (``input``);
#: * ``tokenizer``: the producer and the fleet decode with different vocabularies (``config``);
#: * ``crashed``, ``exhausted``: the workers scoring it died or lost it, again and again
#:   (``transient``: nothing says the trajectory itself is wrong, and it was already tried anew);
#: * ``memory``: Redis had no room for its results (``memory``).
DEAD_LETTER_FAILURE: dict[DeadLetterKind, FailureKind] = {
    DeadLetterKind.INVALID: FailureKind.INPUT,
    DeadLetterKind.TOKENIZER: FailureKind.CONFIG,
    DeadLetterKind.CONFLICT: FailureKind.INPUT,
    DeadLetterKind.SCORING: FailureKind.SCORER,
    DeadLetterKind.CRASHED: FailureKind.TRANSIENT,
    DeadLetterKind.EXHAUSTED: FailureKind.TRANSIENT,
    DeadLetterKind.INCOMPLETE: FailureKind.INPUT,
    DeadLetterKind.MEMORY: FailureKind.MEMORY,
}

#: The data source a result is counted under when its record names none (a record refused before
#: its sample could be read): one word in ``rewardq status`` and ``top``, the Prometheus labels,
#: the health windows, ``rewardq report`` and ``rewardq diff``.
NO_DATA_SOURCE = "unknown"


#: HTTP answers that say the server may answer later: ``transient``, retried in place.
TRANSIENT_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))
#: HTTP answers that say the fleet is configured wrong for this server (credentials, permissions,
#: the model or the path): ``config``; nothing retried helps.
CONFIG_STATUSES = frozenset({401, 403, 404})
#: HTTP clients' exceptions for a connection that failed or was lost, or an answer that stopped
#: half-way, by (top-level package, class name) anywhere in the exception's classes: ``transient``.
#: (Named, not imported: a scorer process loads none of these unless its reward function does.)
TRANSIENT_CLIENT_ERRORS = frozenset(
    {
        ("aiohttp", "ClientConnectionError"),
        ("aiohttp", "ClientPayloadError"),
        ("httpx", "TransportError"),
        ("requests", "ConnectionError"),
        ("requests", "Timeout"),
        ("openai", "APIConnectionError"),
    }
)


def status_failure_kind(status: int | None) -> FailureKind:
    """The kind of failure an HTTP answer with ``status`` is (None: no answer at all, a refused
    connection or a timeout): no answer, 408, 429 and 5xx are ``transient``; 401, 403 and 404
    ``config``; any other status says the request itself is wrong (``scorer``)."""
    if status is None or status in TRANSIENT_STATUSES:
        return FailureKind.TRANSIENT
    if status in CONFIG_STATUSES:
        return FailureKind.CONFIG
    return FailureKind.SCORER


def failure_kind_of(exc: BaseException) -> FailureKind:
    """The kind of failure ``exc`` says, decided by its class or by its raiser (``failure_kind``).

    ============================================================  ==============
    exception                                                      kind
    ============================================================  ==============
    a :class:`~rewardq.errors.ScoringError` raised with ``failure_kind=``  that kind
    :class:`~rewardq.errors.TransientError` (SandboxFusion down, a judge's 429/5xx),
    Redis unreachable, ``ConnectionError``                          ``transient``
    :class:`~rewardq.errors.ScoringTimeout`                        ``timeout``
    :class:`~rewardq.errors.FleetConfigError` (unknown data source, missing extra, no code
    isolation, a judge's 401/403/404), :class:`~rewardq.errors.ConfigError`,
    :class:`~rewardq.errors.TokenizerMismatch`                     ``config``
    :class:`~rewardq.errors.RecordError` (a bound broken, a record that does not decode)  ``input``
    an HTTP client's error for a failed connection (aiohttp, httpx,
    requests, openai: :data:`TRANSIENT_CLIENT_ERRORS`)                ``transient``
    an HTTP client's error for an answer (a ``status_code`` or
    ``status``: openai, httpx, requests, aiohttp)                  :func:`status_failure_kind`
    anything else a reward function or manager raised              ``scorer``
    ============================================================  ==============
    """
    declared = getattr(exc, "failure_kind", None) if isinstance(exc, ScoringError) else None
    if declared:
        try:
            return FailureKind(declared)
        except ValueError:
            pass
    transient = (TransientError, RedisUnavailable, ConnectionError)
    if isinstance(exc, transient) or _redis_away(exc) or _client_error(exc, TRANSIENT_CLIENT_ERRORS):
        return FailureKind.TRANSIENT
    status = None if isinstance(exc, RewardqError) else http_status(exc)
    if status is not None:
        return status_failure_kind(status)
    if isinstance(exc, ScoringTimeout):
        return FailureKind.TIMEOUT
    if isinstance(exc, (FleetConfigError, ConfigError, TokenizerMismatch)):
        return FailureKind.CONFIG
    if isinstance(exc, RecordError):
        return FailureKind.INPUT
    return FailureKind.SCORER


def _redis_away(exc: BaseException) -> bool:
    """Whether ``exc`` is redis-py's word for a Redis that is away or busy (a rate limiter's or a
    judge cache's Redis, say). Read only for redis-py's own exceptions, so a process that never
    imported redis (a scorer process) never imports it here."""
    if not type(exc).__module__.startswith("redis."):
        return False
    from rewardq.queue.retry import is_transient  # redis-py is loaded already: the exception is its own

    return is_transient(exc)


def _client_error(exc: BaseException, names: frozenset[tuple[str, str]]) -> bool:
    """Whether one of ``exc``'s classes is one of ``names`` (top-level package, class name)."""
    return any((c.__module__.partition(".")[0], c.__name__) in names for c in type(exc).__mro__)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an HTTP client's exception carries (``status_code``, or ``status``, on it or
    on its ``response``: openai, httpx, requests, aiohttp), None when it carries none."""
    for holder in (exc, getattr(exc, "response", None)):
        for name in ("status_code", "status"):
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None
