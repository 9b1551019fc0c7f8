"""Result statuses and dead-letter kinds are spelt once, in :mod:`rewardq.queue.states`.

Given the enums, every kind a worker can write is one ``rewardq dead-letters list --kind``
accepts and filters on (checked against the real Redis with dead letters written by the worker's
own :class:`~rewardq.consumers.failures.FailureHandler`), the worker's code passes enum members,
never literals, and every status or kind the Lua scripts write is a member.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import msgpack
import pytest

import rewardq
from rewardq.consumers.failures import FailureHandler
from rewardq.consumers.metrics import NoMetrics
from rewardq.ops.deadletters.commands import KINDS
from rewardq.queue.broker import StreamBroker
from rewardq.queue.connection import connect_async
from rewardq.queue.entries import Entry
from rewardq.queue.keys import Keyspace
from rewardq.queue.meta import ensure_meta
from rewardq.queue.results import RewardResult
from rewardq.queue.states import DEAD_LETTER_FAILURE, DeadLetterKind, FailureKind, ResultStatus
from tests.support.cli_ops import arq

PACKAGE = Path(rewardq.__file__).parent
#: method -> position of its ``kind`` argument
KIND_ARG = {"fail_trajectory": 3, "dead_letter": 1}


def test_members_are_their_values_wherever_a_string_goes() -> None:
    for member in (*DeadLetterKind, *ResultStatus, *FailureKind):
        assert member == member.value and f"{member}" == str(member) == member.value
        assert json.dumps(member) == json.dumps(member.value)
        assert msgpack.unpackb(msgpack.packb(member)) == member.value
    assert [k.value for k in DeadLetterKind] == [
        "invalid",
        "tokenizer",
        "conflict",
        "scoring",
        "crashed",
        "exhausted",
        "incomplete",
        "memory",
    ]
    assert [k.value for k in FailureKind] == ["transient", "timeout", "scorer", "config", "input", "memory"]
    assert RewardResult.from_hash("k", {b"status": b"ok"}).status is ResultStatus.OK
    assert RewardResult.from_hash("k", {}).status is ResultStatus.ERROR


def test_the_cli_filter_takes_exactly_the_enums_kinds() -> None:
    assert KINDS == tuple(k.value for k in DeadLetterKind)


def _kind_args() -> list[tuple[str, ast.expr]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in KIND_ARG:
                kw = next((k.value for k in node.keywords if k.arg == "kind"), None)
                pos = KIND_ARG[node.func.attr] if len(node.args) > 1 else 0
                arg = kw if kw is not None else node.args[pos] if len(node.args) > pos else None
                if arg is not None:
                    found.append((f"{path.relative_to(PACKAGE)}:{node.lineno}", arg))
    return found


def test_the_worker_names_kinds_by_the_enum_never_by_a_literal() -> None:
    calls = _kind_args()
    assert len(calls) >= 6  # the scan sees the worker's calls (a scan that found none would prove nothing)
    literals = {where: ast.unparse(arg) for where, arg in calls if isinstance(arg, ast.Constant)}
    assert not literals, f"dead-letter kinds spelt as literals: {literals}"


def test_every_state_the_lua_scripts_write_is_a_member() -> None:
    kinds, statuses, failures = set(), set(), set()
    for path in sorted((PACKAGE / "queue" / "lua").glob("*.lua")):
        text = path.read_text()
        kinds |= set(re.findall(r"'kind',\s*'([a-z_]+)'", text))
        statuses |= set(re.findall(r"'status',\s*'([a-z_]+)'", text))
        statuses |= set(re.findall(r"HGET', traj, 'status'\) or '([a-z_]+)'", text))
        failures |= set(re.findall(r"'failure_kind',\s*'([a-z_]+)'", text))
        failures |= set(re.findall(r"error_result\([^,()]+,\s*'([a-z_]+)'", text))
    # what the scripts spell today
    assert kinds == {"incomplete"} and statuses == {"ok", "error", "cancelled"} and failures == {"input"}
    assert kinds <= {k.value for k in DeadLetterKind}
    assert statuses <= {s.value for s in ResultStatus}
    assert failures <= {f.value for f in FailureKind}


@pytest.mark.parametrize("kind", list(DeadLetterKind))
async def test_dead_letters_list_filters_on_each_kind_the_worker_writes(kind: Any, ns: str, redis_url: str) -> None:
    # Given a dead letter of this kind written by the worker's failure handler, beside one of another kind
    other = DeadLetterKind.SCORING if kind is not DeadLetterKind.SCORING else DeadLetterKind.INVALID
    client = connect_async(redis_url)
    try:
        await ensure_meta(client, Keyspace(ns), None)  # as a worker's start-up does
        broker = StreamBroker(client, Keyspace(ns), worker="w-test")
        await broker.ensure_groups()
        failures = FailureHandler(broker, worker_name="w-test", max_record_bytes=1024, stats={}, metrics=NoMetrics())
        failures.stats.update(dead_letters=0, errors=0)
        for k in (kind, other):
            fields = {b"key": f"u-{k}_s_0".encode(), b"data": b"\x93junk"}
            entry_id = (
                await client.xadd(broker.ks.stream(0), {name: value for name, value in fields.items()})
            ).decode()
            await failures.dead_letter(Entry(0, entry_id, fields), k, f"a {k} dead letter")
    finally:
        await client.aclose()

    # When the operator lists that kind
    code, out, err = await arq(
        "dead-letters", "list", "--redis-url", redis_url, "--namespace", ns, "--kind", kind.value, "--json"
    )

    # Then exactly the dead letter of that kind is listed, under its kind
    assert code == 0, err
    (listed,) = json.loads(out)["dead_letters"]
    assert listed["kind"] == kind.value and listed["key"] == f"u-{kind}_s_0"
    assert listed["reason"] == f"a {kind} dead letter"
    # and the key's error result says the failure kind that dead-letter kind means
    stored = await read_result(redis_url, Keyspace(ns), f"u-{kind}_s_0")
    assert stored.status is ResultStatus.ERROR and stored.failure_kind is DEAD_LETTER_FAILURE[kind]


async def read_result(redis_url: str, ks: Keyspace, key: str) -> RewardResult:
    client = connect_async(redis_url)
    try:
        return RewardResult.from_hash(key, await client.hgetall(ks.reward_key(key)))  # type: ignore[misc]  # redis-py types asyncio hash commands as blocking ones
    finally:
        await client.aclose()
