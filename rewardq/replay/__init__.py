"""``rewardq replay``: a ledger's trajectories scored again by a worker in this process.

:mod:`rewardq.ledger.replay` rebuilds the trajectories from the ledger; :mod:`.run` runs the
worker (on an embedded Redis stand-in or a given Redis) and feeds them to it, and holds the
checks that refuse a run (a busy ``--namespace``, an ``--out`` of another configuration);
:mod:`.stops` turns SIGINT and SIGTERM into one clean stop; :mod:`.command` is the command line.
Kept apart from :mod:`rewardq.ops` because it needs the worker and the demo's stand-in, which the
operator commands do not.
"""
