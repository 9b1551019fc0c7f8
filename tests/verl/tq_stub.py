"""A stand-in for the ``transfer_queue`` package, enough for verl's V1 modules to import and put.

verl 0.9.1's ``verl.trainer.ppo.v1`` imports ``transfer_queue`` (its ``verl-core`` extra), which
the plain ``pip install verl==0.9.1`` does not bring. The stub records what verl's real
``AgentLoopWorkerTQ._agent_loop_postprocess`` stores, so the tests read it back.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def _make() -> types.ModuleType:
    mod = types.ModuleType("transfer_queue")
    mod.puts = []

    class KVBatchMeta:  # imported by verl's V1 trainer modules; unused here
        pass

    def init(*args: Any, **kwargs: Any) -> None:
        return None

    async def async_kv_put(**kwargs: Any) -> None:
        return None

    async def async_kv_batch_put(**kwargs: Any) -> None:
        mod.puts.append(kwargs)

    mod.KVBatchMeta = KVBatchMeta
    mod.init = init
    mod.async_kv_put = async_kv_put
    mod.async_kv_batch_put = async_kv_batch_put
    return mod


#: One stub for the whole run: verl's modules keep the ``transfer_queue`` they imported first.
STUB = _make()


def install(monkeypatch) -> list[dict[str, Any]]:
    """Put the stub in ``sys.modules`` (for this test); returns the list this test's puts land in."""
    STUB.puts = []
    monkeypatch.setitem(sys.modules, "transfer_queue", STUB)
    return STUB.puts
