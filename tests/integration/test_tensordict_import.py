"""A worker imports tensordict without torch's compiler, and Dynamo still learns every mark later.

``rewardq.reward.tensordict_import`` records the ``torch.compile`` marks tensordict makes while it
is imported instead of importing all of ``torch._dynamo`` for them (~1.2 s of CPU per worker
start), and hands them to Dynamo once something imports it. Each case runs in a fresh interpreter:
what is imported is the process's state.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from rewardq.producers.client import RewardClient
from tests.conftest import _delete_namespace
from tests.support.cli_procs import REPO, START_WAIT
from tests.support.proc_worker import WorkerProcess
from tests.support.records import text_output

# one xdist worker runs them all: the module fixture `ordinary` (an interpreter importing all of Dynamo) runs once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tensordict-import")]

# What Dynamo knows of each function tensordict marked, by the function's qualified name.
DYNAMO_VIEW = """
import json, torch._dynamo
from torch._dynamo import trace_rules
view = {}
for name, fn in marks:
    key = f"{name} {getattr(fn, '__module__', None)}.{fn.__qualname__}"
    if name == "allow_in_graph":
        rule = trace_rules.lookup_callable(fn)
        view[key] = [getattr(rule, "__name__", repr(rule)), id(fn) in trace_rules._allowed_callable_ids]
    else:
        view[key] = getattr(fn, "_dynamo_marked_constant", False)
print(json.dumps(view, sort_keys=True))
"""

# the marks an ordinary import makes, recorded by wrapping Dynamo's own functions first
ORDINARY = """
import torch._dynamo as dynamo
marks = []
for name in ("allow_in_graph", "assume_constant_result"):
    def wrap(fn, _name=name, _real=getattr(dynamo, name)):
        marks.append((_name, fn))
        return _real(fn)
    setattr(dynamo, name, wrap)
import tensordict
"""

DEFERRED = """
import sys
from rewardq.reward.tensordict_import import import_tensordict
marks = import_tensordict()
assert "tensordict" in sys.modules
assert "torch._dynamo" not in sys.modules and "sympy" not in sys.modules, "Dynamo was imported"
from tensordict import TensorDict
import torch
td = TensorDict({"x": torch.arange(6).reshape(3, 2)}, batch_size=[3])
assert td[1]["x"].tolist() == [2, 3] and "torch._dynamo" not in sys.modules
"""


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def ordinary() -> dict[str, object]:
    """What Dynamo knows of tensordict's marks after an ordinary import (one interpreter, shared)."""
    view = json.loads(_run(ORDINARY + DYNAMO_VIEW))
    assert isinstance(view, dict)
    return view


def test_dynamo_imported_later_knows_every_mark_an_ordinary_import_gives(ordinary: dict[str, object]) -> None:
    deferred = json.loads(_run(DEFERRED + DYNAMO_VIEW))
    assert ordinary, "tensordict made no marks: this test no longer measures anything"
    assert deferred == ordinary
    assert any(key.startswith("assume_constant_result") and flag for key, flag in deferred.items())


def test_a_probe_for_dynamo_before_its_import_loses_no_mark(ordinary: dict[str, object]) -> None:
    probe = "import importlib.util\nassert importlib.util.find_spec('torch._dynamo') is not None\n"
    assert json.loads(_run(DEFERRED + probe + probe + DYNAMO_VIEW)) == ordinary


def test_a_submodule_of_dynamo_imported_first_hands_the_marks_over(ordinary: dict[str, object]) -> None:
    first = "import torch._dynamo._trace_wrapped_higher_order_op\n"
    assert json.loads(_run(DEFERRED + first + DYNAMO_VIEW)) == ordinary


def test_torch_compile_after_the_import_compiles_tensordict_code() -> None:
    out = _run(
        DEFERRED
        + """
def double(td):
    return td.apply(lambda t: t * 2)
compiled = torch.compile(double, backend="eager")
print(compiled(td)["x"].tolist())
"""
    )
    assert json.loads(out.strip().splitlines()[-1]) == [[0, 2], [4, 6], [8, 10]]


def test_a_second_call_and_an_import_after_dynamo_are_ordinary() -> None:
    out = _run(
        """
import sys, torch._dynamo
from rewardq.reward.tensordict_import import import_tensordict
first, second = import_tensordict(), import_tensordict()
print(len(first), len(second), any(type(f).__name__ == "MarkWhenImported" for f in sys.meta_path))
"""
    )
    assert out.split() == ["0", "0", "False"]


def test_a_worker_scores_without_ever_importing_dynamo(redis_url: str, tmp_path: Path) -> None:
    # Given a worker whose reward function runs in its own process and reports what is imported there
    module = tmp_path / "what_is_imported.py"
    module.write_text(
        "import sys\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    here = sys.modules\n"
        "    return {'score': 1.0, 'dynamo': 'torch._dynamo' in here, 'tensordict': 'tensordict' in here}\n"
    )
    ns = f"tdimp-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        redis_url,
        ns,
        cli=True,
        log_dir=tmp_path,
        reward_fn=f"{module}:compute_score",
        reward_fn_placement="inline",
        shutdown_grace=3,
    )
    client = RewardClient.from_url(redis_url, namespace=ns)
    try:
        assert worker.wait_for_log(f"worker {worker.name} started", START_WAIT), worker.log()
        # When it scores trajectories (one batch of several outputs each)
        sample = {"data_source": "custom", "reward_model": {"ground_truth": "1"}, "extra_info": {}}
        keys = [
            key for i in range(3) for key in client.put_trajectory(f"u-{i}", "0", [text_output("1", "p")] * 3, sample)
        ]
        results = client.wait_rewards(keys, timeout=60)
        # Then every output is scored in the worker's own process, where tensordict is and Dynamo never was
        for key in keys:
            r = results[key]
            assert (r.status, r.reward_score) == ("ok", 1.0), (key, r.error)
            assert r.reward_extra_info == {"score": 1.0, "dynamo": False, "tensordict": True}, key
    finally:
        client.close()
        worker.terminate(30)
        _delete_namespace(redis_url, ns)
