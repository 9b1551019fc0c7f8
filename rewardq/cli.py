"""The ``rewardq`` command (``python -m rewardq`` too): a thin door onto :mod:`rewardq.ops` and :mod:`rewardq.demo`.

Commands::

    rewardq worker   --redis-url URL --namespace NS --manager naive --tokenizer builtin:demo [...]
    rewardq config   [the worker's flags] [--json]                # every setting, its value and source
    rewardq demo     [--redis-url URL] [--workers 2] [--trajectories 200] [--json]
    rewardq produce  FILE.jsonl --redis-url URL --namespace NS [--wait] [--timeout S]
    rewardq generate FILE.jsonl -n 100 [--seed S]
    rewardq status   [--namespace NS] [--json]                # what is waiting for what
    rewardq top      [--namespace NS] [--once] [--json]       # live view (status --watch): rates, backlog
    rewardq inspect  KEY|TRAJECTORY [--tokenizer T] [--json]  # one key or trajectory, decoded
    rewardq dead-letters list|show|retry|purge                 # what could not be scored
    rewardq health   [--namespace NS] [--name W] [--json]     # exit 0 if a worker on this host is alive
    rewardq replay   LEDGER --out NEW_LEDGER [the worker's scoring flags] [--where C=V] [--limit N]
    rewardq diff     A B [--json]                             # two ledgers compared key by key
    rewardq report   LEDGER -o report.html                    # one self-contained HTML report

Exit codes: 0 success; 1 the run finished but something failed (bad lines, missing or error
results, a worker that died); 2 a configuration error (bad flag, unknown manager, missing
file): fix the setting, restarting will not help; 3 Redis unreachable; 130 interrupted.

Errors rewardq raises on purpose print as one red line that says what to do; add the
global ``--debug`` flag (or ``REWARDQ_DEBUG=1``) for the traceback. Heavy imports (torch,
tensordict) happen inside commands, so ``rewardq --help`` stays fast.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

import click

from rewardq import __version__
from rewardq.config import WorkerConfig
from rewardq.demo.run import DEMO_TIMEOUT, DEMO_TRAJECTORIES, DEMO_WORKERS
from rewardq.errors import ConfigError
from rewardq.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, explain
from rewardq.ops.deadletters.commands import dead_letters
from rewardq.ops.flags import click_options
from rewardq.ops.health import health
from rewardq.ops.inspect import inspect
from rewardq.ops.judge_cache_cmds import judge_cache
from rewardq.ops.ledger_cmds import diff, report
from rewardq.ops.status import status
from rewardq.ops.supervisor import SUPERVISOR_KILL_SLACK
from rewardq.ops.top import top
from rewardq.producers.core import WAIT_TIMEOUT
from rewardq.queue.connection import REDIS_URL
from rewardq.queue.keys import NAMESPACE
from rewardq.replay.command import replay

if TYPE_CHECKING:
    from rewardq.consumers.process import EarlySignals


#: Trajectories ``rewardq generate`` writes.
GENERATE_TRAJECTORIES = 100

_state = {"debug": False}


def _debug() -> bool:
    from rewardq.config import parse_bool

    return _state["debug"] or parse_bool(os.environ.get("REWARDQ_DEBUG", "")) is True


def _error(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors (also REWARDQ_DEBUG=1).")
@click.version_option(__version__, prog_name="rewardq")
def cli(debug: bool) -> None:
    """rewardq: durable, horizontally scaled reward scoring for RL post-training, on Redis Streams."""
    _state["debug"] = _state["debug"] or debug


# ---------------------------------------------------------------------------------------------
# worker
# ---------------------------------------------------------------------------------------------


def _config_option(f: Any) -> Any:
    return click.option(
        "--config",
        "config",
        type=click.Path(dir_okay=False),
        default=None,
        help="YAML/JSON file of rewardq settings and/or verl's trainer config (lowest precedence).",
    )(f)


@cli.command()
@_config_option
@click_options(WorkerConfig)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=None,
    help="Run N worker processes under a supervisor that restarts them.  [default: 1]",
)
def worker(processes: int | None, **params: Any) -> int:
    """Run a reward worker: read trajectories, score them, write rewards back.

    Flags win over REWARDQ_* environment variables, which win over --config. Every setting
    is a flag, a REWARDQ_<NAME> variable and a config-file key; `rewardq config` shows the
    value each one takes and where it comes from.
    """
    from rewardq.consumers.process import EarlySignals
    from rewardq.install import require_worker_extra
    from rewardq.logs import setup_logging
    from rewardq.ops import redis_secret
    from rewardq.ops.worker import load_config, run_worker

    require_worker_extra()  # before Redis is probed: a missing torch is the thing to fix first
    cfg = load_config(params)
    try:
        setup_logging(cfg.log_level, cfg.log_format)
    except ValueError as exc:
        raise ConfigError(f"log settings: {exc}") from None
    if (cfg.manager_options or {}).get("code_local_isolation") == "rlimits":
        redis_secret.conceal()  # programs run as this user: nothing of the URL where they can look
    early = EarlySignals().install()  # a SIGTERM during start-up still ends in a clean exit 0
    if processes and processes > 1:
        return _supervise(processes, params, cfg, early)
    redis_secret.warn_if_on_command_line(params.get("redis_url"))
    return run_worker(cfg, early)


@cli.command("config")
@_config_option
@click_options(WorkerConfig)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: each setting's value and source.")
def config_command(as_json: bool, **params: object) -> int:
    """Show every worker setting and manager option: the value it takes and where it comes from.

    Reads the same flags, REWARDQ_* variables and --config file as `rewardq worker` and prints,
    for each setting, its value and its source (flag, env, file or default), then every option
    the --manager declares (manager_options.<name>), without starting anything. Passwords in the
    Redis URL and credential options are redacted.
    """
    from rewardq.ops.worker import config_rows, load_config

    rows = config_rows(load_config(params))
    if as_json:
        click.echo(json.dumps({r["name"]: r for r in rows}, indent=2, default=str))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        value = json.dumps(r["value"], default=str) if isinstance(r["value"], (dict, list)) else r["value"]
        click.echo(f"{r['name']:<{width}}  {value}  ({r['source']})")
    return 0


def _supervise(n: int, params: dict[str, Any], cfg: WorkerConfig, early: EarlySignals) -> int:
    from rewardq.errors import ConfigError
    from rewardq.ops.redis_secret import child_environment, warn_if_on_command_line
    from rewardq.ops.supervisor import Supervisor, child_argvs
    from rewardq.ops.worker import worker_argv
    from rewardq.queue.reachability import wait_for_redis

    if not cfg.tokenizer:  # every child would exit 2 with it: say it once, before waiting for Redis
        from rewardq.reward.tokenizer import NO_TOKENIZER

        raise ConfigError(NO_TOKENIZER)
    # the parent stays light; a SIGTERM or one Ctrl-C ends the wait (exit 0), as for one process,
    # also where the signal was ignored on entry (a shell's background job ignores SIGINT)
    if wait_for_redis(cfg.redis_url, cluster=cfg.cluster, timeout=cfg.connect_timeout, stopping=lambda: early.received):
        return 0
    if early.received:
        logging.getLogger("rewardq.cli").info("received %s during start-up; exiting", early.received)
        return 0
    warn_if_on_command_line(params.get("redis_url"))
    # the URL goes to the children in their environment, never on their command lines
    from_flag = cfg.sources["redis_url"].startswith("flag")
    leave_out = ("name", "metrics_port", "redis_url", *(("redis_url_file",) if from_flag else ()))
    base = worker_argv(params, leave_out=leave_out)
    argvs = child_argvs(
        base,
        n,
        name=cfg.name,
        metrics_port=cfg.metrics_port,
        prefix=["--debug"] if _debug() else [],
    )
    return Supervisor(
        argvs,
        grace=cfg.shutdown_grace + SUPERVISOR_KILL_SLACK,
        env=child_environment(cfg.redis_url, from_flag=from_flag),
    ).run()


# ---------------------------------------------------------------------------------------------
# demo, produce, generate
# ---------------------------------------------------------------------------------------------


@cli.command()
@click.option(
    "--redis-url",
    default=None,
    help="Use this Redis (default: an embedded stand-in, from rewardq[demo]; without that extra, a Redis "
    "answering at REWARDQ_REDIS_URL or redis://127.0.0.1:6379/0).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=DEMO_WORKERS,
    show_default=True,
    help="Worker processes to start; 0: use workers already running on --namespace (needs --redis-url).",
)
@click.option("--trajectories", "-n", type=click.IntRange(min=1), default=DEMO_TRAJECTORIES, show_default=True)
@click.option(
    "--namespace",
    default=None,
    help="Keep this namespace's keys afterwards (the demo prints the commands that show them). "
    "Default: a fresh demo-<random>, deleted afterwards (--workers 0: REWARDQ_NAMESPACE or rewardq).",
)
@click.option("--manager", default=WorkerConfig.manager, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--timeout", type=float, default=DEMO_TIMEOUT, show_default=True, help="Seconds to wait for rewards.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option(
    "--write-jsonl",
    type=click.Path(dir_okay=False),
    default=None,
    help="Only write the generated trajectories to this JSONL file, then exit.",
)
def demo(
    redis_url: str | None,
    workers: int,
    trajectories: int,
    namespace: str | None,
    manager: str,
    seed: int,
    timeout: float,
    as_json: bool,
    write_jsonl: str | None,
) -> int:
    """Run producers and worker processes end to end and print a summary."""
    if write_jsonl:
        return _generate(write_jsonl, trajectories, seed)
    from rewardq.demo.run import DemoOptions, run_demo

    if manager != "naive":
        from rewardq.reward.registry import get_manager_class

        get_manager_class(manager)
    code, _ = run_demo(
        DemoOptions(
            redis_url=redis_url,
            workers=workers,
            trajectories=trajectories,
            namespace=namespace,
            manager=manager,
            seed=seed,
            as_json=as_json,
            timeout=timeout,
        )
    )
    return code


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--redis-url", default=REDIS_URL, show_default=True, envvar="REWARDQ_REDIS_URL")
@click.option("--namespace", default=NAMESPACE, show_default=True, envvar="REWARDQ_NAMESPACE")
@click.option("--cluster", is_flag=True, help="Treat --redis-url as a Redis Cluster.")
@click.option("--wait", is_flag=True, help="Wait for every reward and print a summary.")
@click.option("--timeout", type=float, default=WAIT_TIMEOUT, show_default=True, help="Seconds to wait (with --wait).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def produce(file: str, redis_url: str, namespace: str, cluster: bool, wait: bool, timeout: float, as_json: bool) -> int:
    """Replay recorded trajectories from a JSONL file (one trajectory per line).

    Exits 0 when every line was put (and, with --wait, every key got an ok result); 1 when a line
    could not be read or put, or, with --wait, a key ended in an error or had no result in time.
    """
    from rewardq.ops.produce import produce_file

    return produce_file(
        file, redis_url=redis_url, namespace=namespace, wait=wait, timeout=timeout, cluster=cluster, as_json=as_json
    ).exit_code


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-n", "--trajectories", type=click.IntRange(min=1), default=GENERATE_TRAJECTORIES, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def generate(file: str, trajectories: int, seed: int) -> int:
    """Write demo trajectories (GSM8K and MATH, with expected rewards) to a JSONL file."""
    return _generate(file, trajectories, seed)


def _generate(path: str, n: int, seed: int) -> int:
    from rewardq.demo.data import make_trajectories
    from rewardq.producers.jsonl import write_jsonl

    count = write_jsonl(path, make_trajectories(n, seed=seed))
    click.echo(f"wrote {count} trajectories to {path}", err=True)
    return 0


# ---------------------------------------------------------------------------------------------
# operator commands: bodies and options live in rewardq.ops (imports there stay light)
# ---------------------------------------------------------------------------------------------


cli.add_command(health)
cli.add_command(status)
cli.add_command(top)
cli.add_command(inspect)
cli.add_command(dead_letters)
cli.add_command(replay)
cli.add_command(diff)
cli.add_command(report)
cli.add_command(judge_cache)


# ---------------------------------------------------------------------------------------------
# entry point and error reporting
# ---------------------------------------------------------------------------------------------


def _exit_code_for(exc: BaseException) -> int | None:
    """Report an exception as one line; returns the exit code, or None for an unexpected one."""
    explained = explain(exc)
    if explained is None:
        return None
    code, line = explained
    _error(line)
    return code


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the CLI and turn the outcome into an exit code.

    Called as the process entry (``argv`` None) after a command that imported torch, the
    process ends with ``os._exit`` once logs and output are flushed: torch's interpreter
    teardown takes ~2 s and there is nothing left to clean but multiprocessing's folder, removed
    first (the worker has stopped, closed its manager and connections), so a stopped worker
    really is gone when SIGTERM says so.
    """
    code = _run(argv)
    if argv is None and "torch" in sys.modules:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        from rewardq.consumers.process import remove_multiprocessing_folder

        remove_multiprocessing_folder()
        os._exit(code)
    sys.exit(code)


def _run(argv: list[str] | None) -> int:
    try:
        code = cli.main(args=argv, prog_name="rewardq", standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        code = EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the one place every error is turned into an exit code
        code = _exit_code_for(exc)
        if code is None:
            _error(f"unexpected {type(exc).__name__}: {exc} (this is a bug; please report it with the traceback)")
            traceback.print_exc()
            code = EXIT_FAILED
        elif _debug():
            traceback.print_exc()
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    main()
