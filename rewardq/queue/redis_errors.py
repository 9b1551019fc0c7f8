"""The redis-py exception types the rest of rewardq reacts to.

``rewardq/queue/`` is the only code that speaks Redis; code above it that must tell one Redis
failure from another (the CLI's exit codes, the operator commands, the worker's reader) names
the types through this module, so a redis-py change lands in one place.
"""

from __future__ import annotations

from redis.exceptions import (
    AuthenticationError,
    ConnectionError,
    NoPermissionError,
    RedisError,
    ResponseError,
    TimeoutError,
)

__all__ = [
    "AuthenticationError",
    "ConnectionError",
    "NoPermissionError",
    "RedisError",
    "ResponseError",
    "TimeoutError",
]
