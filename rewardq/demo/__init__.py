"""The self-contained demo: realistic rollout data, an embedded Redis stand-in, and the end-to-end run.

* :mod:`.data`      ``make_trajectories`` (GSM8K + MATH, multi-turn, tool calls, expected rewards)
                    and the JSONL file format for recorded rollouts;
* :mod:`.embedded`  fakeredis served over TCP, so worker processes can connect to it;
* :mod:`.run`       ``rewardq demo``: workers + producers + summary.
"""
