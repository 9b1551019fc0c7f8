"""``rewardq produce FILE.jsonl``: replay recorded trajectories into a pipeline.

Each line of the file is one trajectory (see :mod:`rewardq.producers.jsonl` for the format). Every
line is validated exactly as the producer will encode it; a bad line is reported with its
line number and the offending field (``line 7: outputs[1].response_mask: has 12 entries but
response_ids has 13``) and skipped, and the others are still pushed. With ``--wait`` the
command then waits for every reward and prints the same summary as ``rewardq demo``.

Exit code: 0 when every line was pushed (and, with ``--wait``, every trajectory got a
non-error result); 1 otherwise.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewardq.errors import ConfigError, JsonlLineError, RewardqError
from rewardq.ops.summary import Pushed, render, summarize
from rewardq.producers.core import WAIT_TIMEOUT
from rewardq.producers.jsonl import read_jsonl

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["ProduceReport", "produce_file"]


@dataclass
class ProduceReport:
    """What :func:`produce_file` did: the trajectories pushed, the bad lines, the summary."""

    pushed: list[Pushed] = field(default_factory=list)
    bad: list[JsonlLineError] = field(default_factory=list)
    summary: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        failed = self.summary is not None and (self.summary["missing"] or self.summary["errors"])
        return 1 if self.bad or failed else 0


def _count_lines(path: Path) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def produce_file(
    path: str,
    *,
    redis_url: str,
    namespace: str,
    wait: bool = False,
    timeout: float = WAIT_TIMEOUT,
    cluster: bool = False,
    as_json: bool = False,
    console: Console | None = None,
    err_console: Console | None = None,
) -> ProduceReport:
    """Push every valid line of ``path``; optionally wait for the rewards and summarise.

    Args:
        path: the JSONL file.
        redis_url, namespace, cluster: where the pipeline lives.
        wait: wait for every reward, then summarise.
        timeout: seconds to wait at most (with ``wait``).
        as_json: print the summary as one JSON object instead of tables.
        console, err_console: rich consoles for the summary (stdout) and progress/errors (stderr).
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rewardq.ops.waiting import done_marks, wait_for_results
    from rewardq.producers.client import RewardClient
    from rewardq.queue.reachability import probe_redis

    console = console or Console()
    err = err_console or Console(stderr=True, soft_wrap=True)
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path} does not exist; write one with `rewardq generate {path} -n 100`")
    total = _count_lines(p)
    probe_redis(redis_url, cluster=cluster)
    report = ProduceReport()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with RewardClient.from_url(redis_url, namespace=namespace, cluster=cluster) as client:
        marks = done_marks(client) if wait else {}
        t0 = time.perf_counter()
        with Progress(*columns, console=err) as progress:
            task = progress.add_task("pushing trajectories", total=total)
            for number, item in read_jsonl(p):
                if isinstance(item, dict):
                    try:
                        keys = client.put_trajectory(item["uid"], item["session_id"], item["outputs"], item["sample"])
                        report.pushed.append(
                            Pushed(keys, str(item["sample"].get("data_source", "?")), item.get("expected"))
                        )
                    except RewardqError as exc:
                        item = JsonlLineError(number, getattr(exc, "field", "<push>"), str(exc))
                if isinstance(item, JsonlLineError):
                    report.bad.append(item)
                    progress.console.print(
                        f"[red]line {item.line}[/]: {escape(item.field)}: {escape(item.reason)}", soft_wrap=True
                    )
                progress.advance(task)
        if wait and report.pushed:
            with Progress(*columns, console=err) as progress:
                task = progress.add_task("waiting for rewards", total=len(report.pushed))
                results, finished = wait_for_results(
                    client, report.pushed, marks, timeout, lambda done: progress.update(task, completed=done)
                )
            report.summary = summarize(
                report.pushed,
                results,
                elapsed_s=finished - t0,
                extra={"namespace": namespace, "file": str(p), "bad_lines": len(report.bad)},
            )
    if report.summary is not None:
        if as_json:
            print(json.dumps(report.summary), flush=True)
        else:
            render(report.summary, console, title=escape(f"rewardq produce {p.name}: summary"))
    n_ok = len(report.pushed)
    msg = escape(f"pushed {n_ok} trajectories ({sum(len(x.keys) for x in report.pushed)} outputs) from {p}")
    if report.bad:
        err.print(
            f"[red]{msg}; {len(report.bad)} bad line(s): "
            f"{', '.join(str(b.line) for b in report.bad[:20])}{' ...' if len(report.bad) > 20 else ''}[/]"
        )
    else:
        err.print(f"[green]{msg}[/]")
    return report
