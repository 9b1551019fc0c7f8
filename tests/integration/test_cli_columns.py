"""``status``, ``inspect`` and ``dead-letters list`` at 80 columns (the width when output is not a
terminal): no line is wider, and no worker name, pid, key, dead-letter ref or reason is cut or
shortened; ``--wide`` keeps the tables whole; ``--json`` on each parses.

A real worker process with a long name scores on a namespace holding a trajectory with a long
uid that fails (a scoring dead letter and its reason), an undecodable entry with a long key (an
invalid dead letter) and a trajectory missing an output (waiting).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from rewardq import RewardClient
from rewardq.queue.keys import Keyspace
from tests.conftest import _delete_namespace
from tests.support.checks import must
from tests.support.cli_procs import Procs, wait_for, worker_argv

pytestmark = pytest.mark.slow

WORKER = "reward-worker-with-a-rather-long-name-node17-cpu-pool-b-0"
BAD = "bad-uid-with-a-fairly-long-identifier-0123456789abcdef"
GAP = "gap-uid-2f7c9a8e-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
JUNK = "junk_key_with_a_long_name_for_testing_0"


@pytest.fixture(scope="module")
def crowded(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Procs]]:
    ns, procs = f"t-cols-{uuid.uuid4().hex[:8]}", Procs(tmp_path_factory.mktemp("cols"))
    w = procs.start(worker_argv(redis_url, ns, WORKER), tag="w")
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        wait_for(lambda: client.r.zcard(f"{ns}:workers"), 120, "the worker", procs=[w])
        ids = np.arange(1, 6)
        rec = {"prompt_ids": ids, "response_ids": ids}
        client.put_trajectory(BAD, "1", [rec], {"data_source": "no/such_source"})
        client.put_output(GAP, "1", 0, rec, {"data_source": "openai/gsm8k"})
        client.put_output(GAP, "1", 2, rec, {"data_source": "openai/gsm8k"}, final=True)
        client.r.xadd(Keyspace(ns).stream(0), {"key": JUNK, "data": b"\x00garbage"})
        wait_for(lambda: client.r.xlen(Keyspace(ns).dead(0)) == 2, 60, "two dead letters", procs=[w])
        pid = str(int(must(client.r.hget(Keyspace(ns).worker(WORKER), "pid"))))
        yield ns, pid, procs
    finally:
        client.close()
        procs.kill_all()
        _delete_namespace(redis_url, ns)


def _run(procs: Procs, *args: str) -> str:
    rc, p = procs.run(list(args), env={"COLUMNS": "80"}, timeout=60)
    assert rc == 0, p.stderr()
    return p.stdout()


def _fits(out: str) -> None:
    wide = [line for line in out.splitlines() if len(line.rstrip()) > 80]
    assert not wide, "\n".join(wide)
    assert "…" not in out, out  # nothing shortened


def _whole(out: str, *tokens: str) -> None:
    """Each token appears unbroken on one line (none is longer than a line here)."""
    for t in tokens:
        assert any(t in line for line in out.splitlines()), (t, out)


def _words(out: str, text: str) -> None:
    """Every word of ``text`` appears as a whole word (wrapping happens only between words)."""
    have = set(out.split())
    missing = [w for w in text.split() if w not in have]
    assert not missing, (missing, out)


def test_status_at_80_columns_cuts_nothing(crowded: tuple[str, str, Procs], redis_url: str) -> None:
    ns, pid, procs = crowded
    out = _run(procs, "status", "--redis-url", redis_url, "--namespace", ns)
    _fits(out)
    _whole(out, WORKER, pid, f"{GAP}_1", "outputs 1")
    assert re.search(r"backlog\s+\d+ entries", out)
    wide = _run(procs, "status", "--wide", "--redis-url", redis_url, "--namespace", ns)
    header = next(line for line in wide.splitlines() if "name" in line and "pid" in line)
    assert re.search(r"name\s+host\s+pid\s+in flight", header)  # the table, on one line however wide
    assert any(WORKER in line and pid in line for line in wide.splitlines())
    st = json.loads(_run(procs, "status", "--json", "--redis-url", redis_url, "--namespace", ns))
    assert st["workers"][0]["name"] == WORKER and set(st["backlog"]) >= {"entries", "outputs_per_s", "seconds"}
    assert "backlog_seconds" in st


def test_inspect_at_80_columns_cuts_no_key(crowded: tuple[str, str, Procs], redis_url: str) -> None:
    ns, _pid, procs = crowded
    for tid, keys in ((GAP + "_1", [f"{GAP}_1_{i}" for i in range(3)]), (BAD + "_1", [f"{BAD}_1_0"])):
        out = _run(procs, "inspect", tid, "--redis-url", redis_url, "--namespace", ns)
        _fits(out)
        _whole(out, *keys)
        view = json.loads(_run(procs, "inspect", tid, "--json", "--redis-url", redis_url, "--namespace", ns))
        assert [o["key"] for o in view["outputs"]] == keys
    out = _run(procs, "inspect", BAD + "_1", "--redis-url", redis_url, "--namespace", ns)
    _whole(out, WORKER)
    wide = _run(procs, "inspect", BAD + "_1", "--wide", "--redis-url", redis_url, "--namespace", ns)
    assert any(f"{BAD}_1_0" in line and "error" in line and WORKER in line for line in wide.splitlines()), wide


def test_dead_letters_list_at_80_columns_cuts_no_key_or_reason(crowded: tuple[str, str, Procs], redis_url: str) -> None:
    ns, _pid, procs = crowded
    listed = json.loads(_run(procs, "dead-letters", "list", "--json", "--redis-url", redis_url, "--namespace", ns))
    assert listed["total"] == 2 and {d["kind"] for d in listed["dead_letters"]} == {"invalid", "scoring"}
    out = _run(procs, "dead-letters", "list", "--redis-url", redis_url, "--namespace", ns)
    _fits(out)
    for d in listed["dead_letters"]:
        _whole(out, d["ref"], d["key"], WORKER)
        _words(out, d["reason"])
    wide = _run(procs, "dead-letters", "list", "--wide", "--redis-url", redis_url, "--namespace", ns)
    for d in listed["dead_letters"]:
        assert any(d["ref"] in line and d["key"] in line and d["reason"] in line for line in wide.splitlines())
