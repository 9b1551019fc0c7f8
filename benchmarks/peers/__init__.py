"""The same workload through Celery, RQ, arq and Dramatiq, one job per trajectory.

Every peer gets the trajectory as one job (:meth:`benchmarks.workload.Trajectory.job_payload`:
token ids as raw int32/uint8 bytes, in the framework's own serializer) and runs the same
task body (:mod:`benchmarks.peers.tasks`): decode the final response with the demo tokenizer,
GSM8K strict regex, then one pipelined ``HSET`` of the score on every output key plus an
``INCR`` of a completion counter. Each module holds the framework's app/settings, which the
worker subprocess imports, and a :class:`~benchmarks.peers.base.Peer` that drives it.
"""
