"""The rewardq fleet on a Ray cluster: ``rewardq worker`` processes as Ray actors (docs/ray.md).

::

    from rewardq.integrations.ray import start_fleet

    fleet = start_fleet(workers=16, config="trainer.yaml", namespace="run-42")

:mod:`~rewardq.integrations.ray.fleet` starts, scales and stops the fleet (:class:`RayFleet`);
:mod:`~rewardq.integrations.ray.actor` is one actor's body; :mod:`~rewardq.integrations.ray.guardian`
the process between an actor and its worker (run as ``python -m``, without Ray);
:mod:`~rewardq.integrations.ray.autoscale` the policy that sizes the fleet by its backlog. The
public names are imported from their modules on first access, so the guardian and the autoscale
policy load without Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewardq._lazy import lazy_getattr

if TYPE_CHECKING:
    from rewardq.integrations.ray.actor import FleetError, FleetWorker
    from rewardq.integrations.ray.autoscale import Autoscale
    from rewardq.integrations.ray.fleet import RayFleet, start_fleet

_EXPORTS = {
    "Autoscale": "rewardq.integrations.ray.autoscale",
    "FleetError": "rewardq.integrations.ray.actor",
    "FleetWorker": "rewardq.integrations.ray.actor",
    "RayFleet": "rewardq.integrations.ray.fleet",
    "start_fleet": "rewardq.integrations.ray.fleet",
}

__all__ = ["Autoscale", "FleetError", "FleetWorker", "RayFleet", "start_fleet"]
__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
