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


def test_command_hints_name_the_pipeline_they_were_printed_for() -> None:
    """Hints carry --namespace, --redis-url, --cluster and --group unless defaults; never a password."""
    from rewardq.ops.target import Pipeline
    from rewardq.queue.keys import Keyspace

    def hint(url: str, namespace: str = "rewardq", group: str = "rewardq-workers", cluster: bool = False) -> str:
        return Pipeline(None, Keyspace(namespace, 1, group), url, cluster=cluster).command("dead-letters", "list")  # type: ignore[arg-type]

    assert hint("redis://127.0.0.1:6379/0") == "rewardq dead-letters list"
    assert hint("redis://127.0.0.1:6379/0", "ns-a") == "rewardq dead-letters list --namespace ns-a"
    assert hint("redis://db:6380/2", "ns-a", "g2") == (
        "rewardq dead-letters list --redis-url redis://db:6380/2 --namespace ns-a --group g2"
    )
    assert (
        hint("redis://:***@db:6380/0", "ns-a", cluster=True) == "rewardq dead-letters list --cluster --namespace ns-a"
    )


def test_a_long_command_is_broken_with_shell_line_continuations() -> None:
    import shlex

    from rewardq.ops.layout import command_lines

    command = "rewardq dead-letters retry 0:1796545181676-0 --redis-url redis://127.0.0.1:6379/6 --namespace 'a b'"
    text = command_lines("after a fix", command, 60)
    assert all(len(line) <= 60 for line in text.splitlines()) and text.count(" \\\n") >= 1, text
    label, _, printed = text.partition(": ")
    assert label == "after a fix" and shlex.split(printed.replace(" \\\n", " ")) == shlex.split(command)
    assert command_lines("x", "rewardq status", 80) == "x: rewardq status"
