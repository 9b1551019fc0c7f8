"""``rewardq inspect REF``: one output key or one trajectory, decoded.

``REF`` is an output key ``<uid>_<session_id>_<i>``, a trajectory ``<uid>_<session_id>``, or a
full Redis key copied from ``redis-cli`` (``<ns>:{s0}:reward:<key>``, ``...:traj:<tid>``). Shows
the trajectory's state (collecting / done / failed) and what it waits for, each output's record
(token counts, turns, a decoded preview with ``--tokenizer``), the sample columns, each key's
reward, ``reward_extra_info`` or error, the worker that scored it, the timings, and what produced
it: each result's provenance blob (scoring fingerprint, rewardq version, scorer, judge, isolation),
attempt and judge request (:mod:`rewardq.reward.provenance`). Renders
:func:`inspect_trajectory` (built from :mod:`rewardq.queue.reads`); read-only.

Records are deleted once a trajectory ends, scored or failed, unless workers keep them
(``--keep-records SECONDS``, ``REWARDQ_KEEP_RECORDS``, or ``keep_records:`` in the worker's ``--config``).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from rewardq.errors import NotFound
from rewardq.ops.layout import WIDE_HELP, WIDE_WIDTH, fmt_age, fmt_duration
from rewardq.ops.target import opened, pipeline_options
from rewardq.queue.checks import MAX_OUTPUTS

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod

    from rewardq.queue.clients import SyncRedis
    from rewardq.queue.keys import Keyspace
    from rewardq.reward.tokenizer import Tokenizer

__all__ = ["inspect", "inspect_trajectory", "normalize_ref", "render_inspect"]

#: Characters of a decoded prompt or response ``rewardq inspect`` shows.
INSPECT_PREVIEW_CHARS = 200


_PREFIXES = (":reward:", ":traj:", ":records:")


def normalize_ref(ref: str, namespace: str) -> str:
    """Strip a copied Redis key down to the key or trajectory id it names."""
    ref = ref.strip()
    if ref.startswith(namespace + ":"):
        for marker in _PREFIXES:
            head, sep, tail = ref.partition(marker)
            if sep and tail:
                return tail
    return ref


def _f(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def timings(view: dict[str, Any]) -> dict[str, object]:
    """First/last output seen, scored at, waited for outputs, push-to-result latency (seconds)."""
    meta = view["meta"]
    first, last, done = _f(meta.get("first_seen")), _f(meta.get("last_seen")), _f(meta.get("done_at"))
    lat = [
        o["result"]["latency_ms"]
        for o in view["outputs"]
        if o.get("result") and o["result"].get("latency_ms") is not None
    ]
    return {
        "first_seen": first,
        "last_seen": last,
        "done_at": done,
        "collecting_s": None if first is None or last is None else round(last - first, 3),
        "since_first_s": None if first is None else round((done or time.time()) - first, 3),
        "latency_ms": max(lat) if lat else None,
    }


def inspect_trajectory(
    r: SyncRedis,
    ks: Keyspace,
    ref: str,
    tokenizer: Tokenizer | None = None,
    preview_chars: int = INSPECT_PREVIEW_CHARS,
) -> dict[str, Any]:
    """One key (``<uid>_<sid>_<i>``) or trajectory (``<uid>_<sid>``): records, state, rewards.

    A ref that names an existing trajectory is taken as one; otherwise as an output key.
    """
    from rewardq.queue import reads  # redis-py, numpy: only when a trajectory is inspected
    from rewardq.queue.codec import decode_output
    from rewardq.queue.results import RewardResult, as_text

    tid, index = reads.resolve_ref(r, ks, ref)
    shard = ks.shard_of(tid)
    h, kept = reads.trajectory_fields(r, ks, shard, tid)
    if not h and index is not None and not reads.reward_exists(r, ks, shard, ref):
        raise KeyError(
            f"nothing known about {ref!r} in namespace {ks.namespace!r} (expired, never pushed, "
            "or pushed to another namespace)"
        )
    meta = {k: as_text(v) for k, v in h.items() if not k.startswith("o:")}
    if meta.get("lease") and meta.get("lease_life"):
        live = reads.worker_life(r, ks, meta["lease"])
        meta["lease_earlier_life"] = "1" if live is not None and live != meta["lease_life"] else ""
    payloads = {int(k[2:]): v for k, v in h.items() if k.startswith("o:")}
    payloads = {**kept, **payloads}
    have, missing, final = reads.missing_outputs({**meta, **{f"o:{i}": "" for i in payloads}})
    if meta.get("whole") and final is not None:  # claimed whole: every record is in its stream entries
        have, missing = list(range(min(final + 1, MAX_OUTPUTS))), []
    n = int(reads.as_number(meta.get("n"), 0)) or (
        final + 1 if final is not None else (max(payloads) + 1 if payloads else 0)
    )
    indices = [index] if index is not None else list(range(min(n, MAX_OUTPUTS)))
    outputs = []
    for i in indices:
        item: dict[str, Any] = {"key": f"{tid}_{i}", "index": i}
        raw = payloads.get(i)
        if raw is not None:
            try:
                rec = decode_output(raw)
                item["record"] = {
                    "prompt_tokens": int(rec.prompt_ids.shape[0]),
                    "response_tokens": int(rec.response_ids.shape[0]),
                    "model_tokens": int(rec.response_mask.sum())
                    if rec.response_mask is not None
                    else int(rec.response_ids.shape[0]),
                    "final": rec.final,
                    "num_turns": rec.num_turns,
                    "extra_fields": rec.extra_fields,
                    "sample": rec.sample,
                }
                if tokenizer is not None:
                    text = tokenizer.decode(rec.response_ids.tolist(), skip_special_tokens=True)
                    item["record"]["response_preview"] = text[:preview_chars] + (
                        "…" if len(text) > preview_chars else ""
                    )
            except Exception as exc:  # noqa: BLE001 - show what is wrong rather than fail the whole view
                item["record_error"] = str(exc)
        res, ttl = reads.reward_hash(r, ks, shard, f"{tid}_{i}")
        if res:
            item["result"] = RewardResult.from_hash(f"{tid}_{i}", res).as_dict()
            item["result_expires_in_s"] = ttl
        outputs.append(item)
    state = meta.get("state") or ("done" if any("result" in o for o in outputs) else "unknown")
    from rewardq.queue.provenance import lookup

    digests = [o["result"].get("provenance", "") for o in outputs if o.get("result")]
    return {
        "provenance": lookup(r, ks, digests),
        "ref": ref,
        "tid": tid,
        "shard": shard,
        "state": state,
        "final": final,
        "n": n,
        "have": have,
        "missing": missing,
        "meta": meta,
        "outputs": outputs,
        "records_kept": bool(kept),
        "records_note": None
        if payloads or state != "done"
        else "records are deleted when a trajectory ends; start workers with --keep-records SECONDS "
        "(or REWARDQ_KEEP_RECORDS) to keep them",
    }


def inspect_view(
    r: SyncRedis,
    ks: Keyspace,
    ref: str,
    tokenizer: Tokenizer | None = None,
    preview: int = INSPECT_PREVIEW_CHARS,
) -> dict[str, Any]:
    """``inspect_trajectory`` plus timings; raises :class:`NotFound` when nothing is known about ``ref``."""
    where = f"namespace {ks.namespace!r}"
    hint = (
        "check --namespace (REWARDQ_NAMESPACE) and --redis-url, that REF is <uid>_<session_id> or "
        "<uid>_<session_id>_<i>, and that it is younger than the workers' result_ttl (7 days by default); "
        "`rewardq status` lists trajectories still collecting outputs"
    )
    try:
        view = inspect_trajectory(r, ks, ref, tokenizer=tokenizer, preview_chars=preview)
    except KeyError:
        raise NotFound(f"nothing known about {ref!r} in {where}: {hint}") from None
    known = view["meta"] or any("record" in o or "result" in o for o in view["outputs"])
    if not known:
        raise NotFound(f"nothing known about {ref!r} in {where}: {hint}")
    if view["state"] != "collecting":
        # A finished trajectory's records are dropped (unless kept): nothing is missing, they were scored.
        view["missing"] = []
    view["timings"] = timings(view)
    view["namespace"] = ks.namespace
    return view


def _json(value: object) -> object:
    """Pretty, highlighted JSON that folds long strings instead of cropping them."""
    from rich.json import JSON

    j = JSON(json.dumps(value, default=str, ensure_ascii=False))
    j.text.no_wrap, j.text.overflow = False, "fold"
    return j.text


def _state_style(state: str) -> str:
    return {"done": "green", "collecting": "yellow", "failed": "red"}.get(state, "white")


def render_inspect(view: dict[str, Any], *, console: Console | None = None, wide: bool = False) -> Any:  # noqa: C901 - one branch per section of the rendered page
    """The inspect dict as one rich renderable; the outputs table is stacked when it does not fit
    ``console``'s width (unless ``wide``): keys are never cut (:mod:`rewardq.ops.layout`)."""
    from rich.console import Console, Group
    from rich.markup import escape
    from rich.table import Table

    from rewardq.ops.layout import Column, table_or_stack

    parts: list[Any] = []
    meta, t = view["meta"], view["timings"]
    head = Table(
        show_header=False,
        box=None,
        padding=(0, 2),
        title=f"rewardq inspect {escape(view['ref'])}",
        title_justify="left",
    )
    head.add_column(style="bold")
    head.add_column()
    state = view["state"]
    head.add_row("trajectory", f"{escape(view['tid'])} (shard {view['shard']}, namespace {escape(view['namespace'])})")
    head.add_row(
        "state",
        f"[{_state_style(state)}]{escape(state)}[/]"
        + (f" — status {escape(meta['status'])}" if meta.get("status") else ""),
    )
    if state == "collecting" or view["have"]:
        head.add_row(
            "outputs",
            f"have {','.join(map(str, view['have'])) or 'none'}; final index "
            + ("not pushed yet" if view["final"] is None else str(view["final"])),
        )
    else:
        # the trajectory's count, also when one output key was asked for
        count = view.get("n") or len(view["outputs"])
        final = "no final output known" if view["final"] is None else f"final index {view['final']}"
        head.add_row("outputs", f"{count}, {final} (records deleted when it ended)")
    if view["missing"]:
        head.add_row("missing", f"[red]{','.join(map(str, view['missing']))}[/]")
    if meta.get("error"):
        head.add_row("error", f"[red]{escape(meta['error'])}[/]")
    if meta.get("failure_kind"):
        head.add_row("failure kind", f"[red]{escape(meta['failure_kind'])}[/]")
    if meta.get("retries"):
        head.add_row("retried", retry_line(meta, state))
    if meta.get("worker"):
        # an error result no scoring attempt made (a refused record, an expired trajectory) was
        # written by the worker that failed it: nothing scored it
        scored = meta.get("status") != "error" or (_f(meta.get("attempts")) or 0) > 0
        head.add_row("scored by" if scored else "failed by", escape(meta["worker"]))
    if meta.get("lease"):
        earlier = ", by an earlier process under this name" if meta.get("lease_earlier_life") else ""
        head.add_row("leased to", f"{escape(meta['lease'])} (until {fmt_age(_f(meta.get('lease_until')))}{earlier})")
    head.add_row("first output", fmt_age(t["first_seen"]))
    head.add_row("last output", fmt_age(t["last_seen"]))
    if t["done_at"]:
        head.add_row(
            "finished",
            f"{fmt_age(t['done_at'])}; {fmt_duration(t['since_first_s'])} after the first "
            "output" + ("" if t["latency_ms"] is None else f", push to result {t['latency_ms']:,.1f} ms"),
        )
    elif state == "collecting":
        head.add_row("waiting", f"{fmt_duration(t['since_first_s'])} since the first output")
    parts.append(head)

    right: JustifyMethod = "right"
    columns = [
        Column("i", right),
        Column("key", lead=True),
        Column("prompt", right),
        Column("response", right),
        Column("model", right),
        Column("turns", right),
        Column("status"),
        Column("reward", right),
        Column("worker"),
        Column("latency", right),
    ]
    rows = []
    for o in view["outputs"]:
        rec, res = o.get("record") or {}, o.get("result") or {}
        status = res.get("status", "")
        rows.append(
            [
                str(o["index"]),
                escape(o["key"]),
                str(rec.get("prompt_tokens", "-")),
                str(rec.get("response_tokens", "-")),
                str(rec.get("model_tokens", "-")),
                str(rec.get("num_turns", "-") if rec.get("num_turns") is not None else "-"),
                (
                    "[green]ok[/]"
                    if status == "ok"
                    else "[dim]cancelled[/]"
                    if status == "cancelled"
                    else f"[red]{escape(status)}"
                    + (f" ({escape(str(res['failure_kind']))})" if res.get("failure_kind") else "")
                    + "[/]"
                    if status
                    else "[yellow]no result[/]"
                ),
                "-" if res.get("reward_score") is None else f"{res['reward_score']:g}",
                escape(res.get("worker", "") or "-"),
                "-" if res.get("latency_ms") is None else f"{res['latency_ms']:,.1f} ms",
            ]
        )
    title = "outputs (tokens: prompt, response, model-generated)"
    parts.append(table_or_stack(console or Console(highlight=False), title, columns, rows, wide=wide))
    for o in view["outputs"]:
        res, rec = o.get("result") or {}, o.get("record") or {}
        error, extra = res.get("error"), res.get("reward_extra_info")
        if extra and extra != {"error": error}:  # error results carry the reason in both: shown once
            parts.append(f"[bold]{escape(o['key'])}[/] reward_extra_info:")
            parts.append(_json(extra))
        if error and error != meta.get("error"):  # the trajectory's error is in the header already
            parts.append(f"[bold]{escape(o['key'])}[/] error: [red]{escape(error)}[/]")
        if rec.get("response_preview") is not None:
            parts.append(f"[bold]{escape(o['key'])}[/] response: {escape(rec['response_preview'])}")
        if rec.get("extra_fields"):
            parts.append(f"[bold]{escape(o['key'])}[/] extra_fields: {escape(json.dumps(rec['extra_fields']))}")
        if o.get("record_error"):
            parts.append(f"[bold]{escape(o['key'])}[/] record: [red]{escape(o['record_error'])}[/]")
    parts += _provenance_lines(view)
    sample = next((o["record"]["sample"] for o in reversed(view["outputs"]) if o.get("record")), None)
    if sample:
        parts.append("[bold]sample columns:[/]")
        parts.append(_json(sample))
    if view.get("records_note"):
        parts.append(f"[dim]{escape(view['records_note'])}[/]")
    return Group(*parts)


def retry_line(meta: dict[str, Any], state: str) -> str:
    """What the trajectory's hash says of its retries in place after transient failures."""
    from rich.markup import escape

    n = int(_f(meta.get("retries")) or 0)
    line = f"{n} time(s) after a transient failure, the last because [yellow]{escape(meta.get('retry_reason', ''))}[/]"
    since = _f(meta.get("retry_since"))
    if since is not None:
        line += f"; first failed {fmt_age(since)}"
    at = _f(meta.get("retry_at"))
    if state == "collecting" and meta.get("lease") and at is not None and at > time.time():
        line += f"; scored again in {fmt_duration(at - time.time())}"
    return line


def _provenance_lines(view: dict[str, Any]) -> list[str]:
    """What produced the results: each provenance blob once, with the keys (and attempts) it names."""
    from rich.markup import escape

    by_digest: dict[str, list[str]] = {}
    for o in view["outputs"]:
        res = o.get("result") or {}
        if res.get("provenance"):
            attempt = f" (attempt {res['attempt']})" if res.get("attempt") else ""
            judge = f" judge request {res['judge_request'][:16]}" if res.get("judge_request") else ""
            by_digest.setdefault(res["provenance"], []).append(f"{o['index']}{attempt}{judge}")
    lines = []
    for digest, keys in by_digest.items():
        blob = view.get("provenance", {}).get(digest)
        what = (
            "; ".join(f"{k}={v if isinstance(v, str) else json.dumps(v, sort_keys=True)}" for k, v in blob.items())
            if blob
            else "its blob is not in this namespace's <ns>:provenance"
        )
        lines.append(f"[bold]provenance {escape(digest)}[/] (outputs {escape(', '.join(keys))}): {escape(what)}")
    return lines


@click.command()
@click.argument("ref")
@pipeline_options
@click.option("--tokenizer", default=None, help="Decode a response preview: tokenizer.json, a folder, or builtin:demo.")
@click.option(
    "--preview",
    type=click.IntRange(min=1),
    default=INSPECT_PREVIEW_CHARS,
    show_default=True,
    help="Characters of decoded response to show (with --tokenizer).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
def inspect(
    ref: str,
    redis_url: str,
    namespace: str,
    cluster: bool,
    group: str,
    tokenizer: str | None,
    preview: int,
    as_json: bool,
    wide: bool,
) -> int:
    """Show one output key (<uid>_<session_id>_<i>) or trajectory (<uid>_<session_id>): records, state, rewards.

    Exit code 0; 1 when nothing is known about REF; 2 for a bad --tokenizer; 3 when Redis is unreachable.
    """
    from rich.console import Console

    tok = None
    if tokenizer:
        from rewardq.reward.tokenizer import load_tokenizer

        tok = load_tokenizer(tokenizer)
    with opened(redis_url, namespace, cluster=cluster, group=group) as p:
        view = inspect_view(p.client, p.ks, normalize_ref(ref, namespace), tokenizer=tok, preview=preview)
    if as_json:
        click.echo(json.dumps(view, default=str))
    else:
        console = Console(highlight=False, width=WIDE_WIDTH if wide else None)
        console.print(render_inspect(view, console=console, wide=wide))
    return 0
