"""``rewardq replay LEDGER --out NEW_LEDGER``: the command (:mod:`rewardq.replay.run` runs it)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import click

from rewardq.config import WorkerConfig
from rewardq.exit_codes import EXIT_FAILED
from rewardq.ops.flags import click_options
from rewardq.ops.ledger_cmds import trajectory_filters
from rewardq.producers.core import WAIT_TIMEOUT

__all__ = ["replay"]

#: Trajectories ``rewardq replay`` keeps in flight at once (each waits for its result).
REPLAY_WINDOW = 64


@click.command()
@click.argument("source", metavar="LEDGER")
@click.option("--out", "out", required=True, metavar="NEW_LEDGER", help="The ledger the replay writes (folder or URL).")
@trajectory_filters
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Replay at most this many trajectories (the first scored; those already in --out do not count).",
)
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=REPLAY_WINDOW,
    show_default=True,
    help="Trajectories in flight at once.",
)
@click.option(
    "--timeout",
    type=float,
    default=WAIT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for one trajectory's result.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as one JSON object.")
@click.option(
    "--config",
    "config",
    type=click.Path(dir_okay=False),
    default=None,
    help="YAML/JSON file of rewardq settings and/or verl's trainer config, as for `rewardq worker`.",
)
@click.option(
    "--redis-url",
    "redis_url",
    default=None,
    metavar="URL",
    help="Run on this Redis, in a namespace of its own (default: an embedded stand-in; REWARDQ_REDIS_URL is not read).",
)
@click.option(
    "--namespace",
    "namespace",
    default=None,
    metavar="NS",
    help="Run in this namespace and keep it (default: one of its own, deleted at the end; REWARDQ_NAMESPACE "
    "is not read). Refused unless unused or left by a replay into the same --out with the same configuration.",
)
@click_options(WorkerConfig, leave_out=("ledger", "name", "redis_url", "namespace"))
def replay(
    source: str,
    out: str,
    where: tuple[str, ...],
    since: str | None,
    until: str | None,
    limit: int | None,
    window: int,
    timeout: float,
    as_json: bool,
    **params: object,
) -> int:
    """Score the trajectories of LEDGER again and write the results to --out NEW_LEDGER.

    Takes the scoring flags of `rewardq worker` (--manager, --reward-fn, --config with a verl
    trainer config, --manager-option, --tokenizer, ...) and runs one worker in this process, on an
    embedded Redis stand-in (no fleet needed; pip install 'rewardq[demo]') or, with --redis-url, on
    a namespace of its own on that Redis. The judge's answers kept in LEDGER are reused. Ctrl-C
    stops it; run it again with the same --out to go on where it stopped. Then: rewardq diff LEDGER
    NEW_LEDGER.

    --where, --since and --until select trajectories: one with any row that passes them is
    replayed whole, and --limit counts trajectories. The summary accounts for every trajectory
    selected: replayed, already in --out, incomplete (its final output never arrived: never
    scored), rows missing (the ledger lacks an output's row), without ids, or past --limit.

    Only --redis-url and --namespace choose the Redis and namespace (not REWARDQ_REDIS_URL,
    REWARDQ_NAMESPACE or a config file's). A --namespace must be the replay's own: unused, or left
    by a replay into the same --out with the same configuration (run again there, it goes on); one
    live workers serve, or another pipeline or replay used, is refused. --out records its scoring
    configuration: a resume with another is refused, as is an --out inside LEDGER.

    Exit code 0; 1 when trajectories ended with errors or were refused, or it was interrupted (a
    signal, a trajectory past --timeout, its worker stopping: the summary still printed); 2 for a
    bad flag or a refusal (nothing scored); 3 when the connection to Redis was lost.
    """
    from rich.console import Console

    from rewardq.install import require_worker_extra
    from rewardq.ledger import replay as rp
    from rewardq.ledger.read import parse_where
    from rewardq.ledger.sink import require_writer
    from rewardq.logs import setup_logging
    from rewardq.ops.worker import load_config
    from rewardq.replay import run
    from rewardq.replay.stops import Stops

    require_worker_extra()
    require_writer()
    base = load_config(params)
    setup_logging("WARNING" if base.sources.get("log_level", "default") == "default" else base.log_level, "text")
    rp.check_out(source, out)
    select = {"where": parse_where(where), "since": since, "until": until, "limit": limit}
    given_url = run.flag_given(base, "redis_url")
    err = Console(stderr=True)
    p, outcome = rp.Plan([]), run.Outcome()
    with Stops() as stops, run.redis_for(base, given_url) as url:
        cfg = run.replay_config(base, out, given_url=given_url, url=url)
        outcome.namespace = cfg.namespace
        try:
            with stops.raising():
                p, prepared = _prepare(cfg, source, out, select, err)
            try:
                outcome = _run(prepared, p, window, timeout, stops, err)
                run.drop_spool_folder(cfg)
            finally:
                if given_url and not run.flag_given(base, "namespace"):  # its own, not one --namespace named
                    _drop_namespace(cfg)
        except KeyboardInterrupt:  # a stop before the replay started: nothing to clean
            pass
        outcome.interrupted = outcome.interrupted or stops.received is not None
        outcome.stopped_by = outcome.stopped_by or stops.received
        _say(p, outcome, source, out, as_json, err)
    return EXIT_FAILED if outcome.interrupted or outcome.errors or outcome.refused else 0


def _prepare(cfg: WorkerConfig, source: str, out: str, select: dict[str, Any], err: Any) -> tuple[Any, Any]:
    """Check every flag, then read the rows of the ledger ``select`` picks (:func:`rewardq.ledger.replay.plan`'s
    filters): the plan and the prepared worker (ConfigError first)."""
    from rewardq.consumers.compose import prepare_worker
    from rewardq.ledger import replay as rp
    from rewardq.replay import run
    from rewardq.replay.namespace import check_namespace, mark_namespace, replay_mark
    from rewardq.reward.scoring_fingerprint import scoring_fingerprint
    from rewardq.reward.tokenizer_fingerprint import tokenizer_fingerprint

    prepared = prepare_worker(cfg)  # an unknown manager, no --tokenizer: refused before anything else
    mine = scoring_fingerprint(cfg, tokenizer_fingerprint(prepared.tokenizer))
    out_id = run.check_resume(out, mine)
    with err.status("reading the ledger"):
        p = rp.plan(source, **select, skip_keys=rp.existing_keys(out))
    named = run.flag_given(cfg, "namespace")
    mark = replay_mark(out_id, mine.digest, out)
    resuming = check_namespace(cfg, p.trajectories, mark) if named else False
    run.record_scoring(out, source, mine, out_id)
    if named:  # after the record: a stop in between leaves the namespace unused, not marked for no --out
        mark_namespace(cfg, mark, resuming=resuming)
        prepared = dataclasses.replace(prepared, replay=mark)  # its worker is the one the mark lets start
    return p, prepared


def _say(p: Any, outcome: Any, source: str, out: str, as_json: bool, err: Any) -> None:
    from rewardq.replay import run

    if as_json:
        click.echo(run.summary_json(p, outcome, source, out))
        return
    left = {
        f"already in {out}": p.done_before,
        "incomplete (final output never arrived)": p.incomplete,
        "with rows missing": p.rows_missing,
        "without ids": p.unreadable,
        "past --limit": p.over_limit,
    }
    skipped = "; skipped " + ", ".join(f"{n} {why}" for why, n in left.items() if n) if any(left.values()) else ""
    why = f" by {outcome.stopped_by}" if outcome.stopped_by else ""
    state = f"interrupted{why} (run again with the same --out to go on)" if outcome.interrupted else "done"
    refused = f", {outcome.refused} refused (rows no record can be made of: see the log)" if outcome.refused else ""
    err.print(
        f"replay {state}: {outcome.scored} of {p.selected} trajectories selected scored into {out}, "
        f"{outcome.errors} with errors{refused}{skipped}"
    )
    if not outcome.interrupted:
        err.print(f"compare: rewardq diff {source} {out}")


def _run(prepared: Any, p: Any, window: int, timeout: float, stops: Any, err: Any) -> Any:
    """Run the replay with a progress bar; a SIGINT or SIGTERM stops it cleanly (:mod:`.stops`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from rewardq.replay.run import run_replay

    bar = Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err)

    async def main() -> Any:
        progress = bar.add_task("replay", total=len(p.trajectories))
        interrupt = asyncio.Event()
        with stops.interrupting(asyncio.get_running_loop(), interrupt):
            return await run_replay(
                prepared,
                p.trajectories,
                window=window,
                timeout=timeout,
                progress=lambda n: bar.update(progress, completed=n),
                interrupt=interrupt,
            )

    with bar:
        return asyncio.run(main())


def _drop_namespace(cfg: WorkerConfig) -> None:
    from rewardq.queue.connection import connect_sync
    from rewardq.queue.namespace import delete_namespace

    r = connect_sync(cfg.redis_url, cluster=cfg.cluster)
    try:
        delete_namespace(r, cfg.namespace)
    finally:
        r.close()
