"""The worker: read entries, assemble trajectories, build each batch, score it, write rewards back, acknowledge.

* :mod:`.compose`     the one place a worker is put together (``prepare_worker``, ``open_worker``,
  ``run_worker``): the CLI, the benchmarks and the tests all start workers through it;
* :mod:`.worker`      the loop, a short sequence of named steps (:class:`~rewardq.consumers.worker.Worker`),
  handed its parts (:mod:`.parts`);
* :mod:`.scoring_round`   one trajectory from its scoring slot to its commit (or its dead letter);
* :mod:`.reader`, :mod:`.intake`, :mod:`.assembly`   read entries and store outputs until a trajectory is whole;
* :mod:`.batch`       the trajectory's ``TensorDict`` (a pure function of its records);
* :mod:`.scorer`      runs the manager under the score timeout and checks what it returns;
* :mod:`.commits`, :mod:`.failures`, :mod:`.quarantine`   write results, error results and dead letters;
* :mod:`.resources`   what the worker opens and closes: the broker, the metrics endpoint (:mod:`.metrics`), the manager.

Only :mod:`rewardq.queue` imports redis-py (the worker's Redis steps are its broker's); the manager
comes from :mod:`rewardq.reward`.
"""
