"""`rewardq replay`, `rewardq diff` and `rewardq report` on a ledger real workers wrote."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewardq import RewardClient
from rewardq.ledger.read import read_table
from tests.conftest import _delete_namespace
from tests.support.cli_procs import START_WAIT, Procs, wait_for, worker_argv
from tests.support.helpers import LEDGER_STOP_GRACE, open_test_worker, output, worker_config
from tests.support.ledger_facts import facts
from tests.support.ledger_frames import spooled
from tests.support.ledger_rewards import changed
from tests.support.ledger_workload import REWARDS, mixed_trajectories, push_all
from tests.support.sync_client import SyncClient

N = 80
#: The namespace the module's ledger was scored in (its results stay there until the module ends).
SCORED_IN: dict[str, str] = {}


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A ledger of N mixed trajectories scored by a real worker (GSM8K, MATH, custom, errors)."""
    folder = str(tmp_path_factory.mktemp("ledger") / "a")
    ns = f"test-replay-{id(folder)}"
    trajs = mixed_trajectories(N, seed=21)

    async def score() -> None:
        client = RewardClient.from_url(redis_url, namespace=ns)
        keys = push_all(client, trajs)
        w = await open_test_worker(
            worker_config(ns, redis_url, reward_fn=REWARDS, ledger=folder, shutdown_grace=LEDGER_STOP_GRACE)
        )
        task = asyncio.create_task(w.run())
        try:
            for _ in range(600):
                if all(v is not None for v in client.get_rewards(keys).values()):
                    break
                await asyncio.sleep(0.1)
        finally:
            w.request_stop("done")
            await task
            client.close()

    asyncio.run(score())
    SCORED_IN[folder] = ns
    yield folder, trajs
    _delete_namespace(redis_url, ns)


def run(procs: Procs, *args: str, timeout: float = 240) -> tuple[int, str, str]:
    code, p = procs.run(list(args), timeout=timeout, tag=args[0])
    return code, p.stdout(), p.stderr()


def replay(procs: Procs, source: str, out: str, *extra: str) -> dict[str, Any]:
    code, stdout, stderr = run(procs, "replay", source, "--out", out, "--tokenizer", "builtin:demo", "--json", *extra)
    assert code in (0, 1), stderr[-3000:]
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


def diff(procs: Procs, a: str, b: str) -> dict[str, Any]:
    code, stdout, stderr = run(procs, "diff", a, b, "--json")
    assert code == 0, stderr[-2000:]
    result: dict[str, Any] = json.loads(stdout)
    return result


def test_replay_with_the_same_configuration_changes_no_reward(
    procs: Procs, ledger: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    a, trajs = ledger
    out = str(tmp_path / "same")
    r = replay(procs, a, out, "--reward-fn", REWARDS)
    assert r["replayed"] == N and r["with_errors"] > 0 and not r["interrupted"]
    d = diff(procs, a, out)
    keys = sum(len(t["outputs"]) for t in trajs)
    assert (d["compared"], d["changed"], d["newly_failed"], d["newly_scored"]) == (keys, 0, 0, 0)
    assert d["only_before"] == d["only_after"] == 0
    for g in d["by_data_source"].values():
        assert g["changed"] == 0 and g["mean_before"] == g["mean_after"]
    assert not list(Path(out).rglob("*.lock")), "a clean end leaves no spool lock in --out"


def test_a_reward_function_differing_on_a_subset_changes_exactly_that_subset(
    procs: Procs, ledger: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    a, trajs = ledger
    out = str(tmp_path / "v2")
    replay(procs, a, out, "--reward-fn", f"{REWARDS}:compute_score_v2")
    d = diff(procs, a, out)
    expected: Counter[str] = Counter()
    for t in trajs:
        ds = t["sample"]["data_source"]
        if changed(ds, t["sample"]["extra_info"]):
            expected[ds] += len(t["outputs"])
    assert expected["custom/length"] and expected["openai/gsm8k"]
    assert d["changed"] == sum(expected.values()) and d["newly_failed"] == d["newly_scored"] == 0
    assert {ds: g["changed"] for ds, g in d["by_data_source"].items() if g["changed"]} == dict(expected)
    before, after = read_table(a).to_pylist(), {r["key"]: r for r in read_table(out).to_pylist()}
    for row in before:
        if row["status"] == "ok":
            moved = after[row["key"]]["reward_score"] != row["reward_score"]
            assert moved == changed(row["data_source"], json.loads(row["extra_info"])), row["key"]
    top = d["largest"][0]
    assert top["data_source"] and top["response"] and abs(top["after"] - top["before"]) > 0
    code, stdout, _ = run(procs, "diff", a, out)
    assert code == 0 and "changed" in stdout and "per data source" in stdout


def test_a_stopped_replay_resumes_where_it_stopped(
    procs: Procs, ledger: tuple[str, list[dict[str, Any]]], tmp_path: Path, redis_url: str, sync_redis: SyncClient
) -> None:
    a, trajs = ledger
    out = str(tmp_path / "resumed")
    first = replay(procs, a, out, "--reward-fn", REWARDS, "--limit", "15")
    assert first["replayed"] == 15
    # the rest, on a real Redis this time (a namespace of its own, deleted afterwards)
    second = replay(procs, a, out, "--reward-fn", REWARDS, "--redis-url", redis_url)
    assert (second["already_in_out"], second["replayed"]) == (15, N - 15)
    assert not list(sync_redis.scan_iter(match=second["namespace"] + ":*"))
    rows = read_table(out, dedup=False)
    assert rows.num_rows == len(set(rows["key"].to_pylist())) == sum(len(t["outputs"]) for t in trajs)
    # and a filter replays only what it selects
    only = replay(procs, a, str(tmp_path / "math"), "--reward-fn", REWARDS, "--where", "data_source=lighteval/MATH")
    assert only["replayed"] == sum(1 for t in trajs if t["sample"]["data_source"] == "lighteval/MATH")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_replay_reports_what_it_wrote_and_resumes(
    procs: Procs, ledger: tuple[str, list[dict[str, Any]]], tmp_path: Path, sig: signal.Signals
) -> None:
    a, trajs = ledger
    out = tmp_path / "interrupted"
    slow = ("--reward-fn", f"{REWARDS}:compute_score_slow", "--tokenizer", "builtin:demo", "--json")
    p = procs.start(["replay", a, "--out", str(out), *slow, "--window", "24"], tag="replay-stopped")
    # stopped once its worker spooled a trajectory: with a window of 24 and 0.2 s per score, most of
    # those in flight then are still being scored; the stopping worker finishes them into --out
    wait_for(lambda: any(f.stat().st_size for f in out.glob("_spool/*/*.wal")), 120, "a spooled trajectory", procs=[p])
    p.popen.send_signal(sig)
    assert p.wait(120) == 1, p.stderr()[-3000:]
    first = json.loads(p.stdout().strip().splitlines()[-1])
    written = {k.rsplit("_", 1)[0] for k in read_table(str(out), columns=["key"], dedup=False)["key"].to_pylist()}
    assert first["interrupted"] and 0 < first["replayed"] < N
    assert first["replayed"] == len(written)  # every trajectory it wrote, those in flight at the stop too
    second = replay(procs, a, str(out), *slow[:2])
    assert (second["already_in_out"], second["replayed"]) == (len(written), N - len(written))
    rows = read_table(str(out), dedup=False)
    assert rows.num_rows == len(set(rows["key"].to_pylist())) == sum(len(t["outputs"]) for t in trajs)


def test_the_report_is_one_page_that_opens_offline_with_the_ledgers_numbers(
    procs: Procs, ledger: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    import numpy as np
    from PIL import Image

    a, trajs = ledger
    page = tmp_path / "report.html"
    code, _, stderr = run(procs, "report", a, "-o", str(page))
    assert code == 0, stderr
    text = page.read_text()
    # self-contained: no link, script or stylesheet to fetch
    assert not re.search(r"""(?:src|href)=["'](?!data:)""", text) and "<script" not in text
    # every image decodes, and is a real picture (not blank)
    images = re.findall(r'<img id="([a-z-]+)"[^>]*src="data:image/png;base64,([^"]+)"', text)
    assert [name for name, _ in images] == [
        "reward-over-time",
        "failures-over-time",
        "latency",
        "length-vs-reward",
        "sources",
    ]
    for _, data in images:
        img = Image.open(io.BytesIO(base64.b64decode(data)))
        img.load()
        assert img.width > 500 and np.asarray(img.convert("L")).std() > 5
    # the numbers are the ledger's: per data source, trajectories, errors and mean reward
    finals = [r for r in read_table(a).to_pylist() if r["final"]]
    assert f'data-trajectories="{len(finals)}"' in text
    for ds in {r["data_source"] for r in finals}:
        mine = [r for r in finals if r["data_source"] == ds]
        ok = [r["reward_score"] for r in mine if r["status"] == "ok"]
        row = re.search(rf'<tr data-source="{re.escape(ds)}">(.*?)</tr>', text)
        assert row is not None, ds
        values = re.findall(r'data-value="([^"]*)"', row.group(1))
        assert int(values[0]) == len(mine) and int(values[1]) == len(mine) - len(ok)
        if ok:
            assert float(values[3]) == pytest.approx(sum(ok) / len(ok), abs=1e-12)
    # and headless Chromium opens it without a console error, network cut off
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("REWARDQ_REQUIRE_CHROMIUM"):  # .ci/run installs it: missing there is a failure
            pytest.fail("chromium is not installed (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={shot}",
            "--window-size=1200,3000",
            f"file://{page}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ERROR:CONSOLE" not in proc.stderr and "Uncaught" not in proc.stderr, proc.stderr[-2000:]
    assert Image.open(shot).size == (1200, 3000)


def test_a_row_no_record_can_be_made_of_costs_the_replay_only_its_trajectory(procs: Procs, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rewardq.ledger.flusher import write_segment
    from rewardq.ledger.store import LedgerStore
    from tests.support.ledger_facts import read_facts
    from tests.support.ledger_frames import ledger_rows, spooled

    # Given a ledger of trajectories a and bad, bad's mask cut short afterwards (a ledger edited by hand)
    source = tmp_path / "source"
    write_segment(LedgerStore(str(source)), spooled(tmp_path / "spool", [read_facts("a"), read_facts("bad")]))
    [file] = source.glob("date=*/hour=*/*.parquet")
    rows = ledger_rows(source).to_pylist()
    for row in rows:
        if row["uid"] == "bad":
            row["response_mask"] = b"\x01"
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(file)), file)
    # When it is replayed
    code, stdout, stderr = run(procs, "replay", str(source), "--out", str(tmp_path / "out"), "--tokenizer",
                               "builtin:demo", "--json")  # fmt: skip
    # Then a is scored, bad is refused with its reason in the log, and the exit code says so
    result = json.loads(stdout.strip().splitlines()[-1])
    assert (code, result["replayed"], result["refused"], result["interrupted"]) == (1, 1, 1, False), stderr[-3000:]
    assert "trajectory bad_s cannot be sent again" in stderr and "response_mask" in stderr
    assert sorted(read_table(str(tmp_path / "out"))["key"].to_pylist()) == ["a_s_0", "a_s_1"]


def test_only_flags_choose_a_replays_namespace_and_a_busy_one_is_refused(
    procs: Procs, ledger: tuple[str, list[dict[str, Any]]], tmp_path: Path, redis_url: str, sync_redis: SyncClient
) -> None:
    a, _ = ledger
    fleet = SCORED_IN[a]  # holds the results of every trajectory of the ledger
    base = ["replay", a, "--tokenizer", "builtin:demo", "--reward-fn", REWARDS, "--json", "--limit", "5"]
    # the environment's namespace, Redis and spool folder (a fleet's, holding a dead worker's
    # segment) are not the replay's: it neither runs there nor adopts that segment
    dead = spooled(tmp_path / "fleet-spool", [facts("dead")])
    env = {"REWARDQ_NAMESPACE": fleet, "REWARDQ_REDIS_URL": redis_url, "REWARDQ_LEDGER_SPOOL": str(dead.parent)}
    code, p = procs.run([*base, "--out", str(tmp_path / "env")], env=env, timeout=240, tag="env")
    result = json.loads(p.stdout().strip().splitlines()[-1])
    assert code in (0, 1) and result["replayed"] == 5 and result["namespace"] != fleet, p.stderr()[-2000:]
    keys = read_table(str(tmp_path / "env"))["key"].to_pylist()
    assert len({k.rsplit("_", 1)[0] for k in keys}) == 5 and "dead_s_0" not in keys and dead.exists()
    # a --namespace it is given is kept at its end, whatever its name
    kept = f"rewardq-replay-kept-{os.getpid()}"
    try:
        code, _, stderr = run(procs, *base, "--out", str(tmp_path / "kept"), "--redis-url", redis_url,
                              "--namespace", kept)  # fmt: skip
        assert code in (0, 1) and list(sync_redis.scan_iter(match=f"{kept}:*")), stderr[-2000:]
    finally:
        _delete_namespace(redis_url, kept)
    # a --namespace holding results of the keys to replay is refused before anything is sent
    before = sorted(sync_redis.scan_iter(match=f"{fleet}:*"))
    code, stdout, stderr = run(procs, *base, "--out", str(tmp_path / "ns"), "--redis-url", redis_url,
                               "--namespace", fleet)  # fmt: skip
    assert code == 2 and "already holds" in stderr and "results or trajectories of 5" in stderr, stderr[-2000:]
    assert not stdout
    assert sorted(sync_redis.scan_iter(match=f"{fleet}:*")) == before and not (tmp_path / "ns").exists()
    # and so is one live workers serve
    ns = f"test-replay-live-{os.getpid()}"
    worker = procs.start(worker_argv(redis_url, ns, "live-0"), tag="live")
    try:
        wait_for(lambda: sync_redis.exists(f"{ns}:worker:live-0"), START_WAIT, "the live worker", procs=[worker])
        given = ["--out", str(tmp_path / "live"), "--redis-url", redis_url, "--namespace", ns]
        code, _, stderr = run(procs, *base, *given)
        assert code == 2 and "live worker" in stderr and "live-0" in stderr, stderr[-2000:]
    finally:
        worker.terminate()
        _delete_namespace(redis_url, ns)


def test_a_replay_stopped_in_a_kept_namespace_resumes_there_and_no_other_replay_or_fleet_runs_there(
    procs: Procs, ledger: tuple[str, list[dict[str, Any]]], tmp_path: Path, redis_url: str, sync_redis: SyncClient
) -> None:
    a, trajs = ledger
    kept = f"test-replay-resume-{os.getpid()}"
    out = tmp_path / "kept"
    slow = ["--reward-fn", f"{REWARDS}:compute_score_slow", "--tokenizer", "builtin:demo", "--json"]
    given = ["--redis-url", redis_url, "--namespace", kept]
    try:
        # Given a replay in a kept namespace, stopped while its worker held trajectories it hands back
        p = procs.start(["replay", a, "--out", str(out), *slow, *given, "--window", "24", "--shutdown-grace", "0.1"],
                        tag="replay-kept")  # fmt: skip
        wait_for(
            lambda: any(f.stat().st_size for f in out.glob("_spool/*/*.wal")), 120, "a spooled trajectory", procs=[p]
        )
        p.popen.send_signal(signal.SIGINT)
        assert p.wait(120) == 1, p.stderr()[-3000:]
        first = json.loads(p.stdout().strip().splitlines()[-1])
        assert first["interrupted"] and first["replayed"] < N
        left = [k for k in sync_redis.scan_iter(match=f"{kept}:*:traj:*") if not sync_redis.hget(k, "status")]
        assert left, "the stopped replay left trajectories it did not finish in its namespace"
        # When it is run again in that namespace, it goes on there and finishes
        code, stdout, stderr = run(procs, "replay", a, "--out", str(out), *slow, *given)
        assert code in (0, 1), stderr[-3000:]
        second = json.loads(stdout.strip().splitlines()[-1])
        assert not second["interrupted"], stderr[-3000:]
        assert second["already_in_out"] + second["replayed"] == N
        rows = read_table(str(out))
        assert rows.num_rows == sum(len(t["outputs"]) for t in trajs)
        # but a replay into another --out is refused there, before anything is sent
        code, stdout, stderr = run(procs, "replay", a, "--out", str(tmp_path / "other"), *slow, *given)
        assert code == 2 and "another --out" in stderr and not stdout, stderr[-2000:]
        assert not (tmp_path / "other").exists()
    finally:
        _delete_namespace(redis_url, kept)


def test_a_fleets_namespace_with_its_workers_down_is_refused(
    procs: Procs, ledger: tuple[str, list[dict[str, Any]]], tmp_path: Path, redis_url: str, ns: str
) -> None:
    a, _ = ledger
    # Given a fleet's namespace whose workers are down (no heartbeat), with a trajectory in its stream
    fleet = RewardClient.from_url(redis_url, namespace=ns)
    try:
        [key] = fleet.put_trajectory("fleet", "s", [output(3, 3, seed=1)], {"data_source": "openai/gsm8k"})
        # When a replay is given that namespace
        code, stdout, stderr = run(procs, "replay", a, "--out", str(tmp_path / "out"), "--tokenizer", "builtin:demo",
                                   "--json", "--limit", "5", "--redis-url", redis_url, "--namespace", ns)  # fmt: skip
        # Then it is refused before anything is sent, and the fleet's trajectory is left to the fleet
        assert code == 2 and "already holds" in stderr and "stream entries" in stderr and not stdout, stderr[-2000:]
        assert fleet.get_rewards([key]) == {key: None} and not (tmp_path / "out").exists()
    finally:
        fleet.close()


def test_a_trajectory_past_the_timeout_ends_the_replay_with_a_summary_not_a_traceback(
    procs: Procs, ledger: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    a, _ = ledger
    out = tmp_path / "timeout"
    slow = ("--reward-fn", f"{REWARDS}:compute_score_slow", "--tokenizer", "builtin:demo", "--timeout", "0.05")
    code, stdout, stderr = run(procs, "replay", a, "--out", str(out), *slow, "--json", "--window", "4")
    assert code == 1 and "Traceback" not in stderr and "this is a bug" not in stderr, stderr[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["interrupted"] and "--timeout 0.05 s of being sent" in result["stopped_by"], result
    assert "other trajectories in flight" in result["stopped_by"], result
    written = {k.rsplit("_", 1)[0] for k in read_table(str(out), columns=["key"], dedup=False)["key"].to_pylist()}
    assert result["replayed"] == len(written) < N
    # and the text summary says why
    code, _, stderr = run(procs, "replay", a, "--out", str(tmp_path / "text"), *slow)
    assert code == 1 and "replay interrupted by trajectory" in stderr and "Traceback" not in stderr, stderr[-3000:]


def test_a_resume_under_another_configuration_or_into_the_source_is_refused(
    procs: Procs, ledger: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    a, _ = ledger
    out = str(tmp_path / "v1")
    assert replay(procs, a, out, "--reward-fn", REWARDS, "--limit", "5")["replayed"] == 5
    code, stdout, stderr = run(procs, "replay", a, "--out", out, "--tokenizer", "builtin:demo", "--json",
                               "--reward-fn", f"{REWARDS}:compute_score_v2")  # fmt: skip
    assert code == 2 and not stdout, stderr[-2000:]
    assert "another configuration" in stderr and "compute_score_v2" in stderr and "new --out" in stderr
    assert len(read_table(out)) == len(read_table(out, dedup=False))  # nothing of the second configuration
    assert replay(procs, a, out, "--reward-fn", REWARDS, "--limit", "5")["already_in_out"] == 5
    for inside in (a, os.path.join(a, "replay")):
        code, _, stderr = run(procs, "replay", a, "--out", inside, "--tokenizer", "builtin:demo")
        assert code == 2 and "--out" in stderr and "Traceback" not in stderr, stderr[-2000:]


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT]], ids=["SIGTERM", "SIGINTx2"])
def test_a_replay_on_a_redis_stopped_once_or_twice_deletes_its_namespace_and_says_so(
    procs: Procs,
    ledger: tuple[str, list[dict[str, Any]]],
    tmp_path: Path,
    redis_url: str,
    sync_redis: SyncClient,
    signals: list[signal.Signals],
) -> None:
    a, _ = ledger
    out = tmp_path / "stopped"
    p = procs.start(["replay", a, "--out", str(out), "--reward-fn", f"{REWARDS}:compute_score_slow", "--tokenizer",
                     "builtin:demo", "--json", "--redis-url", redis_url], tag="replay-stopped")  # fmt: skip
    wait_for(lambda: any(f.stat().st_size for f in out.glob("_spool/*/*.wal")), 120, "a spooled trajectory", procs=[p])
    for sig in signals:  # the second while the worker stops
        p.popen.send_signal(sig)
        time.sleep(0.2)
    assert p.wait(120) == 1, p.stderr()[-3000:]
    result = json.loads(p.stdout().strip().splitlines()[-1])
    assert result["interrupted"] and "Traceback" not in p.stderr(), p.stderr()[-3000:]
    assert not list(sync_redis.scan_iter(match=result["namespace"] + ":*"))
    assert result["replayed"] == len({k.rsplit("_", 1)[0] for k in read_table(str(out))["key"].to_pylist()})


async def test_trajectories_ended_by_incomplete_timeout_are_counted_not_replayed_and_reported(
    procs: Procs, ns: str, redis_url: str, tmp_path: Path
) -> None:
    # Given a ledger a real worker wrote: one scored trajectory, one whose final output never came,
    # one missing its middle output (both ended by incomplete_timeout, never scored)
    sample = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "7", "style": "rule"}}
    client = RewardClient.from_url(redis_url, namespace=ns)
    client.put_trajectory("done", "s", [output(3, 5, seed=1)], sample)
    client.put_output("nofinal", "s", 0, output(4, 4, seed=2), sample)
    client.put_output("gap", "s", 0, output(3, 3, seed=3), sample)
    client.put_output("gap", "s", 2, output(3, 3, seed=4), sample, final=True)
    ledger = str(tmp_path / "ledger")
    w = await open_test_worker(
        worker_config(ns, redis_url, ledger=ledger, incomplete_timeout=0.5, shutdown_grace=LEDGER_STOP_GRACE)
    )
    task = asyncio.create_task(w.run())
    try:
        keys = ["done_s_0", "nofinal_s_0", "gap_s_0", "gap_s_1", "gap_s_2"]
        await asyncio.to_thread(client.wait_rewards, keys, 30)
    finally:
        w.request_stop("test done")
        await task
        client.close()
    # When it is replayed with the configuration that made it and compared
    out = str(tmp_path / "same")
    r = await asyncio.to_thread(replay, procs, ledger, out)
    d = await asyncio.to_thread(diff, procs, ledger, out)
    # Then only the scored trajectory is replayed; the others are counted, and nothing changed
    assert (r["replayed"], r["incomplete"], r["unreadable"]) == (1, 1, 1)
    assert (d["compared"], d["changed"], d["newly_scored"], d["only_before"], d["only_after"]) == (1, 0, 0, 4, 0)
    # And the report counts all three trajectories and both failures
    page = tmp_path / "report.html"
    code, _, stderr = await asyncio.to_thread(run, procs, "report", ledger, "-o", str(page))
    assert code == 0, stderr
    assert 'data-trajectories="3" data-errors="2" data-unscored="2"' in page.read_text()
    # ... and leaves the two never scored out of the latency figures: only the scored one's is there
    from rewardq.ledger.report import load, per_source

    rows = load(ledger, None, None, None)
    (gsm8k,) = per_source(rows)
    assert gsm8k["latency_p99_ms"] == float(rows.latency_ms[rows.ok][0]) and int(rows.unscored.sum()) == 2
