"""The hint an unknown ``--namespace`` gets: the intended name first, however many the server holds."""

from __future__ import annotations

from rewardq.ops.target import namespace_hint


def test_a_typo_names_the_intended_namespace_first_among_many() -> None:
    others = [f"t-{i:04d}-bench" for i in range(300)] + ["team-math-run7"]
    hint = namespace_hint("team-math-run7-typo", sorted(others), listed=20)
    assert hint.startswith("did you mean 'team-math-run7'? namespaces on this server: team-math-run7, ")
    assert hint.endswith(" and 281 more")
    assert hint.count(", ") == 19  # 20 names listed


def test_no_close_name_lists_what_is_there_and_an_empty_server_says_so() -> None:
    assert namespace_hint("prod", ["alpha", "beta"]) == "namespaces on this server: alpha, beta"
    assert namespace_hint("prod", []) == "this server has no rewardq namespace at all"
