"""Adapters that put rewardq inside other frameworks' training loops (verl, and Ray for the fleet).

:mod:`rewardq.integrations.verl`: verl's trainers score on the rewardq fleet.
:mod:`rewardq.integrations.ray`: the fleet as Ray actors on the trainer's cluster.
"""
