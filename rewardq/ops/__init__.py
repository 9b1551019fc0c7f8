"""Bodies of the ``rewardq`` commands (``rewardq/cli.py`` is only the door).

* :mod:`.worker`     ``rewardq worker``: flags -> :class:`~rewardq.config.WorkerConfig`, run one worker;
* :mod:`.supervisor` ``rewardq worker --processes N``: keep N worker processes alive;
* :mod:`.produce`    ``rewardq produce``: replay a JSONL file of recorded trajectories;
* :mod:`.waiting`    wait for rewards with a progress bar;
* :mod:`.summary`    the end-of-run table (rewards by data source, throughput, latency);
* :mod:`.health`     ``rewardq health``: is a worker on this host alive (container health checks);
* :mod:`.common`     Redis reachability check and namespace clean-up.
"""
