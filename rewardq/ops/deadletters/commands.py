"""``rewardq dead-letters list | show | retry | purge``: manage what could not be scored.

A dead letter (see :mod:`rewardq.ops.deadletters.stream`) is named on the command line by its
``REF``, ``<shard>:<entry id>`` as ``list`` prints it (a bare entry id works too).

* ``list [--kind K] [--limit N] [--json]``   newest first: when, kind, trajectory, reason;
* ``show REF [--json]``                      the reason, the traceback, the record's identity
                                             and the raw record's size;
* ``retry REF... | --all [--kind K]``        reopen each trajectory and re-queue its raw record
                                             (after you fixed the scorer); prints what was done
                                             for each, with a progress bar for many;
* ``purge REF... | --all [--kind K] [--older-than S] [--yes] [--json]``
                                             delete them; asks first, and without a terminal
                                             refuses unless ``--yes`` is given.

Exit codes: 0 done; 1 an unknown REF (nothing is changed then); 2 a bad combination of flags
(or ``purge`` without ``--yes`` and without a terminal to ask on); 3 Redis unreachable.

rich is imported by the functions that print (about 0.2 s): ``rewardq`` loads this module at start,
and only a command that prints a table pays for it.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import click

from rewardq.errors import ConfigError, NotFound
from rewardq.ops.layout import WIDE_HELP, WIDE_WIDTH, command_lines, fmt_age, fmt_duration
from rewardq.ops.target import opened, pipeline_options
from rewardq.queue.broker import INCOMPLETE_TIMEOUT
from rewardq.queue.states import DeadLetterKind

if TYPE_CHECKING:
    from rewardq.ops.deadletters.stream import DeadLetter, DeadLetters, Retried
    from rewardq.ops.target import Pipeline

__all__ = ["dead_letters", "KINDS"]

#: Dead letters ``rewardq dead-letters list`` shows.
DEAD_LETTERS_LISTED = 50


#: Kinds of dead letters the workers write: every :class:`~rewardq.queue.states.DeadLetterKind`.
KINDS = tuple(kind.value for kind in DeadLetterKind)
_kind_option = click.option("--kind", type=click.Choice(KINDS), default=None, help="Only dead letters of this kind.")


@dataclass(frozen=True)
class _Selection:
    """Which dead letters ``retry`` and ``purge`` act on, and where (see :func:`_select`)."""

    refs: tuple[str, ...]
    redis_url: str
    namespace: str
    cluster: bool
    group: str
    every: bool
    kind: str | None

    @contextmanager
    def opened(
        self, *, older_than: float | None = None, incomplete_timeout: float = INCOMPLETE_TIMEOUT
    ) -> Iterator[tuple[DeadLetters, list[DeadLetter], Pipeline]]:
        """The namespace's dead letters, the selected ones, and the pipeline they were read on."""
        with opened(self.redis_url, self.namespace, cluster=self.cluster, group=self.group) as p:
            dls = _letters(p, incomplete_timeout)
            listing = p.command("dead-letters", "list")
            yield dls, _select(dls, self.refs, self.every, self.kind, listing, older_than), p


def _selection_options(all_help: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """``REF...``, the pipeline options, ``--all`` and ``--kind``: which dead letters ``retry`` and
    ``purge`` act on, handed to the command as one :class:`_Selection` (its first argument)."""

    def wrap(f: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(f)
        def command(
            *,
            refs: tuple[str, ...],
            redis_url: str,
            namespace: str,
            cluster: bool,
            group: str,
            every: bool,
            kind: str | None,
            **rest: Any,
        ) -> object:
            return f(_Selection(refs, redis_url, namespace, cluster, group, every, kind), **rest)

        c: Callable[..., object] = _kind_option(command)
        c = click.option("--all", "every", is_flag=True, help=all_help)(c)
        return click.argument("refs", nargs=-1)(pipeline_options(c))

    return wrap


def _letters(p: Pipeline, incomplete_timeout: float = INCOMPLETE_TIMEOUT) -> DeadLetters:
    from rewardq.ops.deadletters.stream import DeadLetters

    return DeadLetters(p.client, p.ks, incomplete_timeout=incomplete_timeout)


def _resolve(dls: DeadLetters, refs: tuple[str, ...], listing: str) -> list[DeadLetter]:
    """Every REF's dead letter, or :class:`NotFound` naming all unknown ones (before anything changes);
    ``listing``: the command that lists them, as the hint prints it."""
    found, unknown = [], []
    for ref in refs:
        try:
            found.append(dls.get(ref))
        except KeyError:
            unknown.append(ref)
    if unknown:
        raise NotFound(
            f"no dead letter {', '.join(map(repr, unknown))} in namespace {dls.ks.namespace!r}; nothing "
            f"was changed. List them with `{listing}` (REF is <shard>:<entry id>)"
        )
    return found


def _select(
    dls: DeadLetters,
    refs: tuple[str, ...],
    every: bool,
    kind: str | None,
    listing: str,
    older_than: float | None = None,
) -> list[DeadLetter]:
    if refs and (every or kind or older_than is not None):
        raise ConfigError("give either REFs or --all (with --kind / --older-than), not both")
    if not refs and not every:
        raise ConfigError(
            "name the dead letters to act on (REF ...), or pass --all (optionally with --kind); "
            f"`{listing}` shows their REFs"
        )
    if refs:
        return _resolve(dls, refs, listing)
    cutoff = time.time() - older_than if older_than is not None else None
    return [d for d in dls.iter(kind=kind, newest_first=False) if cutoff is None or d.time <= cutoff]


#: Longest text of one column in ``list`` (key, trajectory, worker: one line each; reason: one line).
COLUMN_CHARS = {"ref": 40, "kind": 16, "tid": 400, "key": 400, "worker": 200, "reason": 400}


def _cap(text: object, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters: a longer one is cut at its last space
    before the limit (mid-word only when there is none) and ends with an ellipsis."""
    line = str(text).replace("\r", " ").replace("\n", " ")
    if len(line) <= limit:
        return line
    head = line[: limit - 1]
    cut = head.rsplit(" ", 1)[0]
    return (cut if len(cut) >= limit // 2 else head) + "…"


class ListedLetter(TypedDict):
    """One row of ``rewardq dead-letters list`` (``--json`` prints these objects)."""

    ref: str
    kind: str
    failure_kind: str
    time: float
    tid: str
    key: str
    deliveries: int | None
    worker: str
    reason: str
    data_bytes: int


def _row(d: DeadLetter) -> ListedLetter:
    """One dead letter as ``list`` shows it; every text column is capped (:data:`COLUMN_CHARS`)."""
    s = d.summary()
    deliveries = str(s.get("deliveries", ""))
    return {
        "ref": _cap(d.ref, COLUMN_CHARS["ref"]),
        "kind": _cap(d.kind, COLUMN_CHARS["kind"]),
        "failure_kind": _cap(s.get("failure_kind", ""), COLUMN_CHARS["kind"]),
        "time": d.time,
        "tid": _cap(s.get("tid", ""), COLUMN_CHARS["tid"]),
        "key": _cap(s.get("key", ""), COLUMN_CHARS["key"]),
        "deliveries": int(deliveries) if deliveries.isdigit() and len(deliveries) < 10 else None,
        "worker": _cap(s.get("worker", ""), COLUMN_CHARS["worker"]),
        "reason": _cap(s.get("reason", ""), COLUMN_CHARS["reason"]),
        "data_bytes": int(s["data_bytes"]),
    }


@click.group("dead-letters")
def dead_letters() -> None:
    """List, show, retry and purge dead letters (records that could not be scored)."""


@dead_letters.command("list")
@pipeline_options
@_kind_option
@click.option("--limit", type=click.IntRange(min=1), default=DEAD_LETTERS_LISTED, show_default=True, help="Newest N.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
def list_(
    redis_url: str, namespace: str, cluster: bool, group: str, kind: str | None, limit: int, as_json: bool, wide: bool
) -> int:
    """List dead letters, newest first."""
    from rich.console import Console
    from rich.markup import escape

    from rewardq.ops.layout import Column, table_or_stack

    with opened(redis_url, namespace, cluster=cluster, group=group) as p:
        dls = _letters(p)
        total = dls.count()
        rows = [_row(d) for d in dls.iter(kind=kind, limit=limit)]
        first = rows[0]["ref"] if rows else ""
        hints = {
            "details": p.command("dead-letters", "show", first),
            "after a fix": p.command("dead-letters", "retry", first),
            "or all of them": p.command("dead-letters", "retry", "--all", *(["--kind", kind] if kind else [])),
        }
    if as_json:
        click.echo(
            json.dumps({"namespace": namespace, "total": total, "kind": kind, "shown": len(rows), "dead_letters": rows})
        )
        return 0
    console = Console(highlight=False, width=WIDE_WIDTH if wide else None)
    now = time.time()
    title = f"dead letters in {escape(namespace)}: {len(rows)} shown of {total}" + (f" (kind {kind})" if kind else "")
    columns = [
        Column("ref", lead=True),
        Column("age", "right"),
        Column("kind"),
        Column("key", lead=True),
        Column("tries", "right"),
        Column("worker"),
        Column("reason", wrap=True),
    ]
    cells = [
        [
            escape(r["ref"]),
            fmt_duration(now - r["time"]) if r["time"] else "-",
            escape(r["kind"]) + (f" ({escape(r['failure_kind'])})" if r["failure_kind"] else ""),
            escape(r["key"] or r["tid"] or "-"),
            "-" if r["deliveries"] is None else str(r["deliveries"]),
            escape(r["worker"]),
            escape(r["reason"]),
        ]
        for r in rows
    ]
    console.print(table_or_stack(console, title, columns, cells, wide=wide, empty="[green]none[/]"))
    if rows:  # commands that run as printed, on the newest dead letter
        for what, command in hints.items():  # broken with shell line continuations: copied, it runs
            console.print(f"[dim]{escape(command_lines(what, command, console.width))}[/]", soft_wrap=True)
    return 0


@dead_letters.command()
@click.argument("ref")
@pipeline_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def show(ref: str, redis_url: str, namespace: str, cluster: bool, group: str, as_json: bool) -> int:
    """Show one dead letter: reason, traceback, the record it held."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    with opened(redis_url, namespace, cluster=cluster, group=group) as p:
        (d,) = _resolve(_letters(p), (ref,), p.command("dead-letters", "list"))
        again, purge = p.command("dead-letters", "retry", d.ref), p.command("dead-letters", "purge", d.ref)
        info = d.summary()
    if as_json:
        click.echo(json.dumps(info))
        return 0
    console = Console(highlight=False, soft_wrap=True)
    t = Table(show_header=False, box=None, padding=(0, 2), title=f"dead letter {d.ref}", title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("kind", f"[red]{escape(d.kind)}[/]")
    if info.get("failure_kind"):
        t.add_row("failure kind", f"[red]{escape(info['failure_kind'])}[/]")
    t.add_row("when", fmt_age(d.time))
    t.add_row("reason", escape(info.get("reason", "")))
    rec = info.get("record")
    t.add_row(
        "record",
        (
            f"uid {escape(rec['uid'])}, session {escape(rec['session_id'])}, output {rec['index']}"
            if rec
            else "[yellow]none decodable[/]"
        )
        + f"; raw {info['data_bytes']:,} bytes"
        + (
            f" (only its first {info['data_kept_bytes']:,} kept: `retry` cannot put it back)"
            if info.get("truncated")
            else ""
        ),
    )
    for name in ("tid", "key", "stream", "entry_id", "deliveries", "worker"):
        if info.get(name):
            t.add_row(name, escape(_cap(info[name], 1000)))
    console.print(t)
    if info.get("traceback"):
        console.print("[bold]traceback:[/]")
        console.print(escape(info["traceback"].rstrip()), markup=True)
    hints = [command_lines("retry after a fix", again, console.width), command_lines("delete", purge, console.width)]
    console.print(f"[dim]{escape(chr(10).join(hints))}[/]")
    return 0


@dead_letters.command()
@_selection_options("Retry every dead letter (of --kind).")
@click.option(
    "--incomplete-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=INCOMPLETE_TIMEOUT,
    show_default=True,
    help="Seconds a reopened incomplete trajectory waits again for its missing outputs.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was done as one JSON object.")
def retry(selection: _Selection, incomplete_timeout: float, as_json: bool) -> int:
    """Put dead letters back to work: reopen the trajectory and re-queue its record (after a fix)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out, err = Console(highlight=False, soft_wrap=True), Console(stderr=True, highlight=False, soft_wrap=True)
    done: list[dict[str, Any]] = []
    namespace = selection.namespace
    with selection.opened(incomplete_timeout=incomplete_timeout) as (dls, targets, p):
        live = p.client.zrangebyscore(p.ks.workers, time.time() - 30, "+inf", start=0, num=1)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=err, disable=len(targets) < 2, transient=False) as progress:
            task = progress.add_task("retrying dead letters", total=len(targets))
            for d in targets:
                action = describe_retry(dls.retry(d))
                done.append({"ref": d.ref, "kind": d.kind, "tid": d.text("tid"), "action": action})
                if not as_json:
                    out.print(
                        f"{d.ref} [bold]{escape(d.kind)}[/] {escape(d.text('tid') or d.text('key') or '?')}: "
                        f"{escape(action)}"
                    )  # above the bar: Progress redirects stdout
                progress.advance(task)
    if as_json:
        click.echo(json.dumps({"namespace": namespace, "retried": done, "workers_alive": bool(live)}))
        return 0
    out.print(f"[green]retried {len(done)} dead letter(s)[/]" if done else "no dead letters matched; nothing to do")
    if done and not live:
        err.print(
            f"[yellow]no live worker on namespace {escape(namespace)}: the retried trajectories are scored "
            f"once one starts (rewardq worker --namespace {escape(namespace)})[/]"
        )
    return 0


@dead_letters.command()
@_selection_options("Purge every dead letter (of --kind, older than --older-than).")
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="With --all: only dead letters older than this.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print what was purged as one JSON object.")
def purge(selection: _Selection, older_than: float | None, yes: bool, as_json: bool) -> int:
    """Delete dead letters for good (their records are lost)."""
    namespace, kind = selection.namespace, selection.kind
    with selection.opened(older_than=older_than) as (dls, targets, _):
        if not targets:
            click.echo(
                json.dumps({"namespace": namespace, "purged": 0, "refs": []})
                if as_json
                else "no dead letters matched; nothing to do"
            )
            return 0
        what = (
            f"{len(targets)} dead letter(s)"
            + (f" of kind {kind}" if kind else "")
            + (f" older than {fmt_duration(older_than)}" if older_than is not None else "")
            + f" from namespace {namespace!r}"
        )
        if not yes:
            if not sys.stdin.isatty():
                raise ConfigError(
                    f"refusing to purge {what} without confirmation: there is no terminal to ask on; "
                    "add --yes to delete them (their records are lost for good)"
                )
            if not click.confirm(f"Delete {what}? Their records are lost for good", default=False, err=True):
                click.echo("nothing deleted", err=True)
                return 1
        n = dls.purge([d.ref for d in targets])
    if as_json:
        click.echo(json.dumps({"namespace": namespace, "purged": n, "refs": [d.ref for d in targets]}))
    else:
        click.echo(f"purged {n} dead letter(s) from namespace {namespace!r}")
    return 0


def describe_retry(done: Retried) -> str:
    """What a retry did, as ``rewardq dead-letters retry`` prints it."""
    actions = []
    if done.reopened:
        actions.append(f"reopened {done.tid} ({done.cleared} results cleared)")
        actions.extend(_records_note(done.outputs, done.restored, done.requeued))
    if done.requeued:
        actions.append("record re-queued")
    elif done.truncated:
        actions.append(
            f"the record was not re-queued: the dead letter keeps only the first bytes of its "
            f"{done.record_bytes:,}-byte record; put the trajectory again"
        )
    return "; ".join(actions) or "nothing to retry (no record and no trajectory); removed"


def _records_note(outputs: int, restored: int, requeued: bool) -> list[str]:
    """What a retry says about the trajectory's records: which came back, which the producer must
    put again (records are deleted when a trajectory ends, unless workers keep them)."""
    if restored:
        return [f"{restored} kept record(s) restored"]
    if outputs > 1 or (outputs == 0 and not requeued):
        return [
            "its other outputs' records were not kept (workers delete them when a trajectory ends unless "
            "--keep-records is set): put the trajectory again, or it ends as incomplete after incomplete_timeout"
        ]
    return []
