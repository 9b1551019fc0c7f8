"""Where scoring functions run: inline, in threads or in scorer processes, loaded by name, killed on timeout.

The machinery behind :meth:`rewardq.reward.base.RewardManager.call_score_fn`, which the worker
starts (``prepare_scoring``) and stops (``close_scoring``) around a manager's life:

* :mod:`~rewardq.reward.execution.host`: one manager's router and response decoder;
* :mod:`~rewardq.reward.execution.isolation`: which function runs where (:class:`ScoreFnRouter`);
* :mod:`~rewardq.reward.execution.process_pool`, :mod:`~rewardq.reward.execution.scorer_slot`,
  :mod:`~rewardq.reward.execution.scorer_process`: the scorer processes;
* :mod:`~rewardq.reward.execution.threads`: threads for what no process can load by name;
* :mod:`~rewardq.reward.execution.loader`: ``--reward-fn`` specs and files, loaded and checked;
* :mod:`~rewardq.reward.execution.decoding`: responses decoded in batches, off the event loop;
* :mod:`~rewardq.reward.execution.escapes`: what ``sys.exit()`` and signals become;
* :mod:`~rewardq.reward.execution.settings`: :class:`ScoringSettings`.
"""
