"""A Hub id as the tokenizer, where transformers is installed (verl's environment), with offline mode
not set and no network reach: read from the local Hugging Face cache without one network attempt,
and refused at once when it is not cached (transformers alone retried the Hub for ~55 s).

Each case runs in its own process (``HF_HOME`` is read when huggingface_hub is imported) whose every
HTTP(S) request goes to a :class:`~tests.support.no_network.NetworkTrap`, which counts it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.cli_procs import REPO, Procs
from tests.support.hf_cache import fake_hub_cache
from tests.support.no_network import NetworkTrap
from tests.verl.harness import demo_hf_folder

LOAD = (
    "import sys\n"
    "from rewardq.reward.tokenizer import load_tokenizer\n"
    "t = load_tokenizer(sys.argv[1])\n"
    "print(type(t).__name__, t.name, t.vocab_size, t.decode(t.encode('So #### 72')))\n"
)


def _load(name: str, home: Path, trap: NetworkTrap) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HOME": str(home), **trap.env}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    return subprocess.run([sys.executable, "-c", LOAD, name], env=env, capture_output=True, text=True, timeout=300)


def test_a_cached_hub_id_loads_through_transformers_without_the_network(tmp_path: Path) -> None:
    folder = demo_hf_folder(tmp_path / "policy")
    files = {f.name: f.read_bytes() for f in folder.iterdir()}
    files["config.json"] = json.dumps({"model_type": "qwen2"}).encode()  # what transformers maps a tokenizer by
    home = tmp_path / "hf"
    fake_hub_cache(home, "acme/policy-7b", files)
    with NetworkTrap() as trap:
        done = _load("acme/policy-7b", home, trap)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[:2] == ["TransformersTokenizer", "acme/policy-7b"], done.stdout
    assert done.stdout.rstrip().endswith("So #### 72")
    assert trap.connections == 0  # not even huggingface_hub's user-agent look-up


def test_an_uncached_hub_id_fails_at_once_naming_offline_mode_and_how_to_fill_the_cache(
    procs: Procs, tmp_path: Path
) -> None:
    with NetworkTrap() as trap:
        t0 = time.monotonic()
        done = _load("Qwen/Qwen2.5-7B-Instruct", tmp_path / "empty-hf", trap)
        took = time.monotonic() - t0
        rc, worker = procs.run(
            ["worker", "--redis-url", "redis://127.0.0.1:1/0", "--tokenizer", "Qwen/Qwen2.5-7B-Instruct"],
            env={"HF_HOME": str(tmp_path / "empty-hf"), **trap.env},
            timeout=120,
        )
    print(f"\n[hub-offline] an uncached Hub id refused in {took:.1f}s (process start and imports included)")
    assert done.returncode != 0
    for err in (done.stderr, worker.stderr()):
        assert "not in the local Hugging Face cache" in err and "HF_HUB_OFFLINE" in err, err[-2000:]
        assert "hf download Qwen/Qwen2.5-7B-Instruct" in err and "huggingface-cli download" in err
        assert "Retrying" not in err
    assert rc == 2 and "importing torch" not in worker.stderr()
    assert trap.connections == 0
