"""The Redis layer: connections, the keyspace, the wire codec, the worker's steps and their Lua, one retry policy.

**The layer rule** (docs/architecture.md; ``tests/unit/test_layers.py`` checks every part):

* Layers point one way. This package imports nothing of rewardq's above it, only the foundation
  modules every layer may use (``FOUNDATION`` in the test: :mod:`rewardq.errors`, :mod:`rewardq.backoff`).
* Only this package imports redis-py. Code above it sends commands through a client it is given,
  typed by :mod:`.clients` and opened by :mod:`.connection`; how a client connects, retries and
  fails is this package's.
* A feature that keeps state in Redis lives in one folder, in the lowest layer that uses it: its
  policy, its Lua script (a ``.lua`` file beside the code, loaded with
  :func:`.scripts.feature_source`) and the functions that send its commands. Nothing outside that
  folder sends them. Rate limits are :mod:`rewardq.reward.ratelimit`, the judge (its answer cache
  included) :mod:`rewardq.reward.judge`, dead letters as an operator handles them
  :mod:`rewardq.ops.deadletters`. Their keys are named in :mod:`.keys`, the one map of the keyspace.

What is left here is the pipeline itself, which every feature rides on. Each module answers one
question about its keys:

* :mod:`.keys` every key; :mod:`.codec` records on the wire; :mod:`.scripts` and ``lua/`` the
  pipeline's server-side steps; :mod:`.states` the states they record;
* :mod:`.broker` the worker's steps on Redis (read, claim, store, commit, fail, release); failing
  a trajectory writes its dead letter in the same script (``lua/fail.lua``, ``add_dead`` in
  ``lua/common.lua``), so that write is the broker's;
* :mod:`.results`, :mod:`.images` rewards and images; :mod:`.reads` the pipeline's state read
  back (shards, workers, waiting and finished trajectories); :mod:`.namespace` a namespace's keys
  as a whole;
* :mod:`.connection` and :mod:`.retry`: clients, the redis-py failures other layers name, and the
  one retry policy; :mod:`.access` the commands a worker's user must be allowed.
"""
