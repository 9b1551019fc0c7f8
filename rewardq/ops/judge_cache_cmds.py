"""``rewardq judge-cache list|clear [--model M]``: the LLM-judge answers shared across runs
(genrm ``judge_cache=shared``; docs/judges.md). Thin doors: :mod:`rewardq.reward.judge.shared`
does the work. The shared cache lives outside every namespace, so these take no ``--namespace``.

``rewardq`` imports this module at start; the commands import :mod:`rewardq.reward.judge.shared`
(and with it the manager contract, about 20 modules) when they run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from rewardq.config import WorkerConfig
from rewardq.ops.flags import setting_option
from rewardq.ops.target import connect_timeout
from rewardq.queue.connection import connect_sync
from rewardq.queue.reachability import wait_for_redis

__all__ = ["judge_cache"]

T = TypeVar("T")


def _server_options(f: Callable[..., object]) -> Callable[..., object]:
    """``--redis-url`` and ``--cluster``, the worker's own declarations of them."""
    known = WorkerConfig.settings()
    for name in ("cluster", "redis_url"):
        s = known[name]
        f = setting_option(s, envvar=s.env, default=s.default)(f)
    return f


def _on_redis(redis_url: str, cluster: bool, work: Callable[[Any], T]) -> T:
    """``work`` run on a connection to Redis (waited for as every operator command does), closed after."""
    wait_for_redis(redis_url, cluster=cluster, timeout=connect_timeout())
    r = connect_sync(redis_url, cluster=cluster)
    try:
        return work(r)
    finally:
        r.close()


@click.group("judge-cache")
def judge_cache() -> None:
    """The LLM-judge answers kept across runs (genrm judge_cache=shared)."""


@judge_cache.command("list")
@_server_options
@click.option("--model", default=None, help="Only this judge model.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def list_models(redis_url: str, cluster: bool, model: str | None, as_json: bool) -> int:
    """The judge models with shared answers, and how many each has. Exit code 0."""
    from rewardq.reward.judge.shared import shared_models

    models = _on_redis(redis_url, cluster, lambda r: shared_models(r, model))
    if as_json:
        click.echo(json.dumps({"models": models}))
        return 0
    if not models:
        click.echo("no shared judge answers" + (f" for model {model!r}" if model else ""))
    for m in models:
        click.echo(f"{m['model']}\t{m['entries']:,} answers\t(tag {m['tag']})")
    return 0


@judge_cache.command("clear")
@_server_options
@click.option("--model", default=None, help="Only this judge model's answers (default: every model's).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def clear(redis_url: str, cluster: bool, model: str | None, as_json: bool) -> int:
    """Delete the shared answers of one judge model, or of all. The next run asks the judge again.
    Exit code 0."""
    from rewardq.reward.judge.shared import clear_shared

    cleared = _on_redis(redis_url, cluster, lambda r: clear_shared(r, model))
    if as_json:
        click.echo(json.dumps({"cleared": cleared}))
        return 0
    if not cleared:
        click.echo("nothing to clear" + (f": no shared answers for model {model!r}" if model else ""))
    for name, n in cleared.items():
        click.echo(f"{name}: {n:,} shared answers deleted")
    return 0
