"""The commands the demo prints for a kept namespace, by kind of server (run for real in
tests/integration/test_demo_hints.py)."""

from __future__ import annotations

from rewardq.demo.hints import kept_hints


def test_a_single_redis_keeps_its_url_and_deletes_with_one_del() -> None:
    h = kept_hints("redis://127.0.0.1:6379/3", "ns", ["u_s_0"])
    assert h.look[0] == "redis-cli -u redis://127.0.0.1:6379/3 --scan --pattern 'ns:*' | head"
    assert h.look[2] == "redis-cli -u redis://127.0.0.1:6379/3 HGETALL 'ns:{s0}:reward:u_s_0'"
    assert h.delete.endswith("| xargs -r redis-cli -u redis://127.0.0.1:6379/3 DEL")


def test_a_cluster_gets_the_plain_scheme_follows_moved_scans_every_primary_and_unlinks_one_by_one() -> None:
    h = kept_hints("rediss+cluster://rq:secret@10.0.0.5:7000", "ns", ["u_s_0"])
    text = "\n".join([*h.look, h.delete])
    assert "secret" not in text and "+cluster" not in text.replace("--redis-url rediss+cluster", "")
    assert "redis-cli -c -u rediss://rq:***@10.0.0.5:7000 XREVRANGE 'ns:{s0}:done' + - COUNT 3" in h.look
    assert h.look[0].startswith("for n in $(redis-cli -u rediss://rq:***@10.0.0.5:7000 CLUSTER NODES | awk ")
    assert '-h "${n%:*}" -p "${n##*:}" --scan' in h.look[0]
    assert h.delete.endswith("| xargs -r -n 1 redis-cli -c -u rediss://rq:***@10.0.0.5:7000 UNLINK")
    # rewardq's own commands take the cluster URL as it is
    assert "rewardq status --redis-url rediss+cluster://rq:***@10.0.0.5:7000 --namespace ns" in h.look


def test_a_plain_url_with_cluster_set_is_a_cluster() -> None:
    assert "UNLINK" in kept_hints("redis://h:7000", "ns", [], cluster=True).delete
