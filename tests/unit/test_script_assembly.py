"""Each pipeline script carries only the ``common.lua`` definitions it uses (rewardq.queue.scripts).

Redis runs a script's whole body on every EVALSHA, so a definition a script carries costs every
call; one it misses would fail only when reached (a nil global). These tests read the assembled
text independently of how it was assembled.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from rewardq.queue import scripts

COMMON = (resources.files("rewardq.queue") / "lua" / "common.lua").read_text()
COMMON_NAMES = re.findall(r"^local (?:function )?([A-Za-z_]\w*)", COMMON, re.M)


def defined(src: str) -> set[str]:
    return set(re.findall(r"^local (?:function )?([A-Za-z_]\w*)", src, re.M))


def referenced(src: str) -> set[str]:
    code = "\n".join(line for line in src.split("\n") if not line.lstrip().startswith("--"))
    return set(re.findall(r"[A-Za-z_]\w*", code))


def test_common_cut_loses_nothing() -> None:
    header, defs = scripts.common_definitions()
    assert "\n".join([header, *(text for _, text in defs)]) == COMMON
    assert [name for name, _ in defs] == COMMON_NAMES


@pytest.mark.parametrize("name", scripts.NAMES)
def test_every_common_name_used_is_defined(name: str) -> None:
    src = scripts.source(name)
    missing = (referenced(src) & set(COMMON_NAMES)) - defined(src)
    assert not missing, f"{name} uses {sorted(missing)} without their definitions"


@pytest.mark.parametrize("name", scripts.NAMES)
def test_definitions_keep_their_order_and_the_script_comes_last(name: str) -> None:
    src = scripts.source(name, flagged=False)
    own = (resources.files("rewardq.queue") / "lua" / f"{scripts.FILES.get(name, name)}.lua").read_text()
    assert src.endswith("\n" + own)
    kept = re.findall(r"^local (?:function )?([A-Za-z_]\w*)", src[: -len(own)], re.M)
    assert kept == [n for n in COMMON_NAMES if n in kept]


def test_the_hot_scripts_carry_little() -> None:
    claim, commit = defined(scripts.source("claim")), defined(scripts.source("commit"))
    assert {"now_seconds", "each_chunk", "CHUNK"} <= claim
    assert not claim & {"refused_rights", "end_records", "finish_error", "add_dead", "take_lease"}
    assert {"refused_rights", "end_records", "ack_recorded"} <= commit
    assert not commit & {"finish_error", "add_dead", "write_error", "missing_text", "take_lease"}
    assert len(scripts.source("beat")) < len(COMMON)


def test_replies_kept_for_a_resend_outlive_the_retry_deadline() -> None:
    """``expire`` keeps its reply (for a call sent again after its reply was lost) longer than the
    retry policy sends a call again (rewardq.queue.retry.DEADLINE), and ``fail`` keeps it in the
    trajectory hash (which outlives both) through KEPT_REPLIES later calls."""
    from rewardq.queue import retry

    kept = re.search(r"local REPLY_KEEP_MS = (\d+)", scripts.source("expire"))
    assert kept is not None and int(kept.group(1)) > retry.DEADLINE * 1000
    assert "local KEPT_REPLIES = 8" in scripts.source("fail")
    assert "KEPT_REPLIES" not in scripts.source("commit")  # only the scripts that use it carry it
