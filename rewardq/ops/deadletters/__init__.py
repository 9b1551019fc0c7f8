"""Dead letters as an operator handles them: ``rewardq dead-letters list|show|retry|purge``.

* :mod:`.stream`     the dead-letter streams read, retried and purged (the Redis commands);
* :mod:`.commands`   the commands' bodies: options, tables, the words a retry is reported in.

A dead letter is written by the worker as one step with failing its trajectory
(:meth:`rewardq.queue.endings.Endings.fail`, ``queue/lua/fail.lua`` and ``deadletter.lua``):
that write is the broker's, atomic with the trajectory's keys; which failures dead-letter is
:mod:`rewardq.consumers.failures`'s.
"""
