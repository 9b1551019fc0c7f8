"""The built-in reward managers, registered under verl's names: naive, dapo, gdpo, rate_limited, remote, disrm, genrm.

Each is imported by :mod:`rewardq.reward.registry` when first named; they use only the manager
contract (:mod:`rewardq.reward.base`) and the helpers beside it.
"""
