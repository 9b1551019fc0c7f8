"""Bodies of the ``rewardq`` commands (``rewardq/cli.py`` is only the door).

* :mod:`.worker`     ``rewardq worker``: flags -> :class:`~rewardq.config.WorkerConfig`, run one worker;
* :mod:`.supervisor` ``rewardq worker --processes N``: keep N worker processes alive;
* :mod:`.produce`    ``rewardq produce``: replay a JSONL file of recorded trajectories;
* :mod:`.waiting`    wait for rewards with a progress bar;
* :mod:`.summary`    the end-of-run table (rewards by data source, throughput, latency);
* :mod:`.status`     ``rewardq status``: streams, workers, trajectories waiting for outputs, diagnosis;
* :mod:`.top`        ``rewardq top``: a live full-screen view (rates, backlog and drain time, workers);
* :mod:`.inspect`    ``rewardq inspect``: one key or trajectory, decoded, with its rewards and timings;
* :mod:`.deadletters` ``rewardq dead-letters list|show|retry|purge``: the commands and the Redis
  commands they send, in one folder;
* :mod:`.health`     ``rewardq health``: Redis, group and a fresh heartbeat (container health checks);
* :mod:`.overview`   the whole pipeline in one dict (what ``status`` shows and ``--json`` prints);
* :mod:`.target`     which pipeline an operator command looks at: its options, opening it (namespace must exist);
* :mod:`.connect`    whether Redis answers: one probe, or a wait with backoff;
* :mod:`.layout`     how the commands print: tables that never cut a name, durations and times.

The views read the pipeline through :mod:`rewardq.queue` (:mod:`rewardq.queue.reads`,
:mod:`rewardq.queue.namespace`) and a feature through its folder (:mod:`.deadletters`,
:mod:`rewardq.reward.judge.cache`'s totals, :mod:`rewardq.reward.judge.shared`); only
:mod:`rewardq.queue` imports redis-py.
"""
