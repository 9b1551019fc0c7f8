"""The bounded reader of what crosses back from the local sandbox, and the cgroup discovery's
parsing. No processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rewardq.errors import CodeSandboxError
from rewardq.reward.codeexec.cgroups import CgroupHost, JobLimits, _mounts, _own_paths, _under
from rewardq.reward.codeexec.local import run_outcomes
from rewardq.reward.codeexec.report import MAX_RECORD_BYTES, MalformedRecord, clean_text, parse_record, parse_report
from rewardq.reward.codeexec.sandbox import RunSpec


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


@pytest.mark.parametrize(
    "record",
    [
        {"case": 0, "out": "16\n"},
        {"case": 3, "value": json.dumps([1, [2, {"t": [3]}]])},  # nesting inside a string is fine
        {"case": 1, "error": "ValueError: \ud800"},
        {"load_error": "SyntaxError: x"},
        {"done": True},
        {"loaded": True},
        {"case": 2, "overflow": True},
    ],
)
def test_records_the_runner_writes_are_read_back(record: dict[str, Any]) -> None:
    assert parse_record(_line(record)) == record


@pytest.mark.parametrize(
    "line",
    [
        b"[" * 200000,
        b"{" * 200000,
        b'{"case": 0, "out": ["x"]}',
        b'{"case": 0, "out": {"a": 1}}',
        b'{"sandbox_error": "forged"}',
        b'{"case": true, "out": "x"}',
        b'{"case": 0, "out": 5}',
        b'{"done": false}',
        '{"case": 0, "out": "\u00e9"}'.encode(),
        b'{"case": 0, "out": "\xff"}',
        b"not json",
        b"{}",
        b'"a string"',
        b'{"case": 0, "out": "x"} {"case": 1}',
        b'{"case": 0, "out": "' + b"x" * MAX_RECORD_BYTES + b'"}',
        b'{"case": 1e400, "out": "x"}',
    ],
)
def test_anything_else_is_a_malformed_record_and_nothing_else(line: Any) -> None:
    with pytest.raises(MalformedRecord):
        parse_record(line)


def test_clean_text_is_valid_utf8_and_bounded() -> None:
    assert clean_text("ValueError: \ud800") == "ValueError: \ufffd"
    assert clean_text("a\x00b") == "a\ufffdb"
    assert clean_text(b"\xff\xfe ok") == "\ufffd\ufffd ok"
    long = clean_text("x" * 10_000, 100)
    assert len(long) == 100 and long.endswith("…")
    clean_text("\udfff" * 5000).encode("utf-8")  # never raises


def _status(**kw: Any) -> bytes:
    st: dict[str, Any] = {
        "exit": 0,
        "signal": None,
        "timed_out": False,
        "overflow": False,
        "seconds": 0.1,
        "sandbox_error": None,
    }
    return b"S " + json.dumps({**st, **kw}).encode()


def test_a_forged_record_fails_the_run_as_the_programs_own_failure() -> None:
    out = b"\n".join([b"R " + _line({"loaded": True}), b"R " + b"[" * 200000, b"R " + _line({"done": True}), _status()])
    [run] = parse_report(out, b"", 0, 1)
    assert run.malformed and run.records == [{"loaded": True}, {"done": True}]
    outcomes = run_outcomes(run, RunSpec([0, 1], 5, 6.0), ["16\n", "25\n"], False, 1024)
    assert [(o.code, o.status) for o in outcomes] == [(-1, "malformed_report")] * 2


def test_supervisor_lines_that_do_not_parse_are_a_broken_sandbox() -> None:
    with pytest.raises(CodeSandboxError, match="unreadable status"):
        parse_report(b"S [[[", b"", 0, 1)
    with pytest.raises(CodeSandboxError, match="could not isolate a program: no\ufffd"):
        parse_report(_status(sandbox_error="no\udc80"), b"", 0, 1)
    with pytest.raises(CodeSandboxError, match="after 0 of 1 runs: boom\ufffd"):
        parse_report(b"", b"boom\xff", 1, 1)


def test_cgroup_discovery_reads_mountinfo_and_proc_cgroup() -> None:
    mountinfo = (
        "35 25 0:30 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu\n"
        "36 25 0:31 /process_api /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "37 25 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        "38 25 0:33 / /proc rw - proc proc rw\n"
    )
    mounts = _mounts(mountinfo)
    assert [(m[1], m[2]) for m in mounts] == [
        ("/sys/fs/cgroup/cpu", "cgroup"),
        ("/sys/fs/cgroup/memory", "cgroup"),
        ("/sys/fs/cgroup/unified", "cgroup2"),
    ]
    own = _own_paths("4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/user.slice\n9:name=systemd:/\n")
    assert own == {"memory": "/process_api/abc", "cpu": "/", "cpuacct": "/", "": "/user.slice", "systemd": "/"}
    assert _under("/sys/fs/cgroup/memory", "/process_api", "/process_api/abc") == "/sys/fs/cgroup/memory/abc"
    assert _under("/sys/fs/cgroup", "/", "/") == "/sys/fs/cgroup"


def _fake_host(tmp_path: Path, *, v2_controllers: str, v1: bool) -> str:
    """A /proc of our own describing cgroup mounts that are plain folders under ``tmp_path``."""
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    lines, cgroup = [], []
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text(v2_controllers)
    (unified / "cgroup.subtree_control").write_text("")
    lines.append(f"37 25 0:32 / {unified} rw,relatime - cgroup2 cgroup2 rw")
    cgroup.append("0::/")
    if v1:
        for i, c in enumerate(("cpu", "cpuacct", "memory", "pids")):
            d = tmp_path / c
            d.mkdir()
            lines.append(f"{40 + i} 25 0:{40 + i} / {d} rw,relatime - cgroup cgroup rw,{c}")
            cgroup.append(f"{i + 1}:{c}:/")
    (proc / "mountinfo").write_text("\n".join(lines) + "\n")
    (proc / "cgroup").write_text("\n".join(cgroup) + "\n")
    return str(tmp_path / "proc")


def test_a_v2_host_gets_one_cgroup_per_job_with_every_limit(tmp_path: Path) -> None:
    host = CgroupHost.detect(jobs=4, proc_root=_fake_host(tmp_path, v2_controllers="cpu memory pids io", v1=False))
    parent = Path(host.parents["unified"])
    assert host.version == 2 and parent.parent == tmp_path / "unified"
    assert (tmp_path / "unified" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (parent / "cpu.weight").read_text() == "400"  # the jobs together weigh as 4 processes
    job = host.create(JobLimits(memory_bytes=1088 << 20, pids=34))
    d = Path(job.dirs[0])
    assert {f: (d / f).read_text() for f in ("cpu.max", "cpu.weight", "memory.max", "memory.swap.max", "pids.max")} == {
        "cpu.max": "100000 100000",
        "cpu.weight": "100",
        "memory.max": str(1088 << 20),
        "memory.swap.max": "0",
        "pids.max": "34",
    }
    assert job.harness_fields() == {"procs": [str(d / "cgroup.procs")], "cpu_usage": str(d / "cpu.stat")}


def test_a_v1_host_limits_each_hierarchy_and_counts_cpu_with_cpuacct(tmp_path: Path) -> None:
    host = CgroupHost.detect(jobs=2, proc_root=_fake_host(tmp_path, v2_controllers="", v1=True))
    assert host.version == 1 and set(host.parents) == {"cpu", "cpuacct", "memory", "pids", "unified"}
    assert (Path(host.parents["cpu"]) / "cpu.shares").read_text() == "2048"
    job = host.create(JobLimits(memory_bytes=1 << 30, pids=34, cpus=1.0))
    by = {Path(d).parent.parent.name: Path(d) for d in job.dirs}
    assert (by["cpu"] / "cpu.cfs_quota_us").read_text() == "100000"
    assert (by["memory"] / "memory.limit_in_bytes").read_text() == str(1 << 30)
    assert (by["memory"] / "memory.swappiness").read_text() == "0"  # no memsw file: swap not accounted
    assert (by["pids"] / "pids.max").read_text() == "34"
    assert job.cpu_usage == str(by["cpuacct"] / "cpuacct.usage")


def test_no_usable_cgroup_is_a_refusal_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(CodeSandboxError, match="no cgroup with the cpu, memory, pids controller"):
        CgroupHost.detect(proc_root=_fake_host(tmp_path, v2_controllers="io", v1=False))
