"""The only code that speaks Redis: the keyspace, the wire codec, the Lua scripts, and the reads other layers build on.

Nothing here knows a manager, a command or a producer's API; it imports only
:mod:`rewardq.errors`, :mod:`rewardq.defaults` and :mod:`rewardq.backoff`. Each module answers
one question about the pipeline's keys:

* :mod:`.keys` every key (one documented place); :mod:`.codec` records on the wire;
  :mod:`.scripts` and ``lua/`` the server-side steps; :mod:`.states` the states they record;
* :mod:`.broker` the worker's steps on Redis (read, claim, store, commit, fail, release);
* :mod:`.results`, :mod:`.images`, :mod:`.judge_cache` rewards, images and judge answers;
* :mod:`.reads` the pipeline's state read back (shards, workers, waiting and finished
  trajectories); :mod:`.deadletters` the dead-letter streams (list, retry, purge);
  :mod:`.namespace` a namespace's keys as a whole; :mod:`.limits` a rate limiter's hash;
* :mod:`.connection`, :mod:`.retry`, :mod:`.redis_errors`, :mod:`.aio` clients and their failures.

What other layers make of these reads stays with them: the operator views (``rewardq status``,
``inspect``, ``dead-letters``, down to the words a retry is reported in) are :mod:`rewardq.ops`'s,
and the rate limiter's waiting, leases and counters :mod:`rewardq.reward.ratelimit`'s: this package
holds the Redis side of each, and nothing above it.
"""
