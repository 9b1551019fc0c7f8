"""Adapters that put rewardq inside other frameworks' training loops (:mod:`rewardq.integrations.verl`)."""
