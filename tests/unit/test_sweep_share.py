"""Which awaited trajectories one sweep asks about (``rewardq.producers.reading.sweep_share``)."""

from rewardq.producers.reading import sweep_share


def test_few_trajectories_are_all_asked_about_every_time() -> None:
    assert sweep_share(["a", "b", "c"], 7, 3) == (["a", "b", "c"], 0)


def test_more_than_the_limit_are_taken_in_turn_and_every_one_comes_round() -> None:
    tids = [f"t{i}" for i in range(10)]
    seen: list[str] = []
    start = 0
    for _ in range(4):
        share, start = sweep_share(tids, start, 4)
        assert len(share) == 4 and len(set(share)) == 4
        seen += share
    assert set(seen) == set(tids)
    assert sweep_share(tids, 8, 4)[0] == ["t8", "t9", "t0", "t1"]  # wraps round
