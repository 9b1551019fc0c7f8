"""Where scoring functions run, so that user code never blocks, kills or stops the worker.

:meth:`rewardq.reward.base.RewardManager.call_score_fn` hands every call to a
:class:`ScoreFnRouter`, which picks a place per function once and keeps it:

==========================================  =================================================
function                                    where it runs
==========================================  =================================================
built-in scorer, placement ``inline``       the event loop (regexes: tens of microseconds)
built-in scorer, placement ``process``      scorer processes running ``default_compute_score``
built-in scorer, placement ``async``        awaited in the event loop
``async def`` reward function               awaited in the event loop
sync reward function (default)              scorer processes (:class:`ScorerPool`), loaded
                                            there by name: ``--reward-fn`` or ``module:qualname``
sync function no process can load by name   threads of the worker (:class:`ThreadRunner`)
sync function, ``reward_fn_placement``      ``thread``: threads; ``inline``: the event loop
==========================================  =================================================

What failures become (each a :class:`~rewardq.errors.ScoringError` for that trajectory only,
so the worker writes its keys an error result and scores the others as usual):

* an exception: re-raised (from a process: its type and message, with the child's traceback
  as the cause);
* ``sys.exit()`` / ``KeyboardInterrupt``: "the reward function called sys.exit(3)" / "raised
  KeyboardInterrupt", from a process, a thread, an inline call or an awaited one alike;
* a scorer process that dies (``os._exit``, segfault, OOM kill): its exit code or signal and
  the usual cause; the process is replaced;
* a call still running when its trajectory times out: the worker's timeout cancels the call,
  and its scorer process is killed and replaced (a thread cannot be killed: it is left
  running, and replaced by a new one, up to ``max_lost_threads``).

A call that waits for a scorer process (or a thread) does not spend its trajectory's budget
while it waits (:mod:`~rewardq.reward.execution.budget`), and a scorer process stuck on a hung
call no longer counts toward the pool's size: calls waiting for a process then get a spare
(:mod:`~rewardq.reward.execution.spares`; at most ``max_spares`` at once), so hung calls never
time out the good ones behind them.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from rewardq.errors import RemoteTraceback, ScoringError, ScoringTimeout
from rewardq.reward import scoring
from rewardq.reward.execution.escapes import REWARD_FUNCTION, describe_escape
from rewardq.reward.execution.loader import FILE_MODULE_PREFIX, import_object, is_async_callable
from rewardq.reward.execution.process_pool import ScorerPool
from rewardq.reward.execution.scorer_slot import TaskResult
from rewardq.reward.execution.settings import ScoringSettings
from rewardq.reward.execution.threads import ThreadRunner

logger = logging.getLogger("rewardq.reward")

#: The built-in scorer, as scorer processes load it.
BUILTIN_SPEC = "rewardq.reward.scoring:default_compute_score"


def spec_of(fn: object) -> str | None:
    """``module:qualname`` (or ``path.py:qualname`` for a file the loader imported) when that
    name loads back to ``fn`` itself in another process; None otherwise (a lambda, a closure,
    a callable object, a function of ``__main__``)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "__main__" or "<" in qualname:
        return None
    loaded = sys.modules.get(module)
    if module.startswith(FILE_MODULE_PREFIX):
        # loaded from a file by rewardq.reward.execution.loader: a child finds it by path, not by that name
        path = getattr(loaded, "__file__", None)
        return f"{path}:{qualname}" if path and getattr(loaded, qualname, None) is fn else None
    try:
        return f"{module}:{qualname}" if import_object(f"{module}:{qualname}") is fn else None
    except Exception:  # noqa: BLE001 - not importable by name
        return None


def task_value(result: TaskResult) -> Any:
    """The value a scorer process returned, or the ScoringError that says what happened instead
    (of the failure kind the child's exception said: ``config`` for an unknown data source,
    ``transient`` for a judge's 503; a timeout is a :class:`~rewardq.errors.ScoringTimeout`)."""
    if result.status == "ok":
        return result.value
    if result.status == "error":
        error = ScoringError(result.message, failure_kind=result.failure_kind, retry_after=result.retry_after)
        if result.traceback:
            raise error from RemoteTraceback(result.traceback)
        raise error
    if result.status == "crash":
        raise ScoringError(result.message)
    after = f" after {result.message}" if result.message else ""
    raise ScoringTimeout(
        f"{REWARD_FUNCTION} timed out{after} in its scorer process (pid {result.pid}), which was killed and replaced"
    )


async def _awaited(fn: Callable[..., Awaitable[Any]], kwargs: Mapping[str, object]) -> object:
    try:
        return await fn(**kwargs)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise ScoringError(describe_escape(exc, REWARD_FUNCTION)) from None


def _inline(fn: Callable[..., object], kwargs: dict[str, object]) -> object:
    try:
        return fn(**kwargs)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise ScoringError(describe_escape(exc, REWARD_FUNCTION)) from None


class _Place:
    """Where one function runs: ``call`` it there; ``start`` and ``close`` what that needs."""

    where = ""

    async def call(self, kwargs: dict[str, Any]) -> object:
        raise NotImplementedError

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


class _Awaited(_Place):
    where = "awaited in the worker's event loop (async)"

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    async def call(self, kwargs: dict[str, Any]) -> object:
        return await _awaited(self.fn, kwargs)


class _Inline(_Place):
    where = (
        "inline in the worker's event loop (reward_fn_placement=inline): each call blocks the worker, "
        "and a hang, os._exit or segfault in it stops or kills the whole worker"
    )

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    async def call(self, kwargs: dict[str, Any]) -> object:
        return _inline(self.fn, kwargs)


class _Threads(_Place):
    def __init__(self, fn: Callable[..., Any], settings: ScoringSettings, *, chosen: bool) -> None:
        self.runner = ThreadRunner(fn, size=max(4, settings.process_count()), max_lost=settings.max_lost_threads)
        self.where = (
            f"in up to {self.runner.size} threads of the worker"
            + (" (reward_fn_placement=thread)" if chosen else "")
            + f": a hung call keeps its thread (at most {self.runner.max_lost}, then calls fail), and "
            "os._exit, a segfault or a call holding the GIL affect the whole worker"
        )

    async def call(self, kwargs: dict[str, Any]) -> object:
        return await self.runner.call(kwargs)


class _Processes(_Place):
    def __init__(self, target: str, kwargs: dict[str, Any], settings: ScoringSettings) -> None:
        self.pool = ScorerPool(
            target,
            kwargs,
            num_workers=settings.process_count(),
            start_method=settings.start_method,
            spare_after=settings.spare_after,
            max_spares=settings.max_spares,
            spare_idle=settings.spare_idle,
            output_cap=settings.output_cap,
            reply_cap=settings.reply_bytes,
        )
        self.where = (
            f"in {self.pool.num_workers} scorer processes ({self.pool.start_method}, loaded as {target!r}; "
            "a call still running at its trajectory's timeout is killed with its process, which is replaced)"
        )

    async def call(self, kwargs: dict[str, Any]) -> object:
        return task_value(await self.pool.run(kwargs))

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()


class ScoreFnRouter:
    """Calls scoring functions where they belong (see the module docstring).

    Args:
        settings: the worker's :class:`~rewardq.reward.execution.settings.ScoringSettings`.
        configured: the manager's ``compute_score``; when ``settings.reward_fn`` names it,
            scorer processes load it by that spec (with ``settings.reward_fn_kwargs``).
        code_runtime: gives the worker's code-execution runtime (its backend, limits and
            counters), passed as ``code_runtime`` to the built-in scorer's ``async`` (code)
            data sources; None: they run without one.
    """

    def __init__(
        self,
        settings: ScoringSettings,
        *,
        configured: object = None,
        code_runtime: Callable[[], Any] | None = None,
    ) -> None:
        self.settings = settings
        self.configured = configured
        self.code_runtime = code_runtime
        self._places: dict[int, tuple[Any, _Place]] = {}  # id(fn) -> (fn, place); fn kept so ids stay unique
        self._builtin: _Processes | None = None

    async def call(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> object:
        if fn is scoring.default_compute_score:
            return await self._call_builtin(kwargs)
        return await self.place_of(fn).call(kwargs)

    async def prepare(self, fn: Callable[..., object]) -> None:
        """Decide where ``fn`` runs (logged) and start its processes now."""
        if fn is not scoring.default_compute_score:
            await self.place_of(fn).start()

    async def close(self) -> None:
        places = [place for _, place in self._places.values()]
        if self._builtin is not None:
            places.append(self._builtin)
        self._places, self._builtin = {}, None
        for place in places:
            await place.close()

    def place_of(self, fn: Callable[..., object]) -> _Place:
        """Where ``fn`` runs, decided on its first call and logged once."""
        known = self._places.get(id(fn))
        if known is not None and known[0] is fn:
            return known[1]
        place = self._choose(fn)
        self._places[id(fn)] = (fn, place)
        level = logging.WARNING if isinstance(place, (_Inline, _Threads)) else logging.INFO
        logger.log(level, "reward function %s runs %s", self._name(fn), place.where)
        return place

    def _choose(self, fn: Callable[..., object]) -> _Place:
        if is_async_callable(fn):
            return _Awaited(fn)
        placement = self.settings.reward_fn_placement
        if placement == "inline":
            return _Inline(fn)
        if placement == "thread":
            return _Threads(fn, self.settings, chosen=True)
        target = self._target_of(fn)
        if target is None:
            logger.warning(
                "reward function %r cannot be loaded by name in a scorer process (a lambda, a closure or "
                "a callable object?), so it cannot be isolated; define it at module level or give it as "
                "--reward-fn FILE.py:FUNC",
                fn,
            )
            return _Threads(fn, self.settings, chosen=False)
        return _Processes(target[0], target[1], self.settings)

    def _target_of(self, fn: Callable[..., object]) -> tuple[str, dict[str, object]] | None:
        """The spec and bound keyword arguments a scorer process loads ``fn`` by, if any."""
        if self.settings.reward_fn and fn is self.configured:
            return self.settings.reward_fn, dict(self.settings.reward_fn_kwargs)
        kwargs: dict[str, Any] = {}
        if isinstance(fn, functools.partial) and not fn.args:
            kwargs, fn = dict(fn.keywords), fn.func
        spec = spec_of(fn)
        return (spec, kwargs) if spec is not None else None

    def _name(self, fn: object) -> str:
        if self.settings.reward_fn and fn is self.configured:
            return repr(self.settings.reward_fn)
        base = fn.func if isinstance(fn, functools.partial) else fn
        return spec_of(base) or repr(base)

    async def _call_builtin(self, kwargs: dict[str, Any]) -> object:
        placement = scoring.placement_of(kwargs.get("data_source"))
        if placement == "inline":
            return scoring.default_compute_score(**kwargs)
        if placement == "async":
            if self.code_runtime is not None:
                kwargs = {**kwargs, "code_runtime": self.code_runtime()}
            return await _awaited(scoring.compute_score_async, kwargs)
        if self._builtin is None:
            self._builtin = _Processes(BUILTIN_SPEC, {}, self.settings)
            logger.info("built-in scorers with placement 'process' run %s", self._builtin.where)
        return await self._builtin.call(kwargs)
