"""What each reward manager costs per trajectory: ``python -m benchmarks.managers``.

Every manager scores the same realistic trajectory (4 outputs, ~500-token prompts, 1,000–4,000
token responses, a GSM8K sample whose final response ends in ``#### 72``) built with the
demo tokenizer, through ``run_single`` on a ready ``TensorDict`` batch (batch building is
measured separately). ``limited`` uses the fleet limiter on the local Redis with limits far
above the request rate (so what is measured is its Redis round trips); ``remote`` scores in
its process pool; ``disrm`` talks to a loopback HTTP server that answers like vLLM. The
ratio column compares with ``naive`` measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from rewardq.consumers.batch import build_batch
from rewardq.queue.codec import OutputRecord, decode_output, encode_output
from rewardq.reward.base import ManagerContext
from rewardq.reward.factory import build_manager
from rewardq.reward.tokenizer import load_tokenizer

REDIS_URL = "redis://127.0.0.1:6379/0"
#: The whole-trajectory example manager (tests/support/seqpo_simt), named as a checkout names it.
SEQPO_SIMT = "tests.support.seqpo_simt.manager:SeqPOSiMTManager"


def trajectory(tok: Any, n: int = 4, seed: int = 0) -> list[OutputRecord]:
    rng = np.random.default_rng(seed)
    words = "the farmer sells eggs at the market for two dollars each and buys feed".split()
    recs = []
    for i in range(n):
        text = " ".join(rng.choice(words, int(rng.integers(900, 3600))))
        if i == n - 1:
            text += " so the answer is #### 72"
        out = {"prompt_ids": tok.encode(" ".join(rng.choice(words, 450))), "response_ids": tok.encode(text)}
        sample = {
            "data_source": "openai/gsm8k",
            "reward_model": {"ground_truth": "72"},
            "extra_info": {"source": "the farmer buys feed", "index": seed},
            "raw_prompt": [{"role": "user", "content": "How much does the farmer earn?"}],
        }
        recs.append(decode_output(encode_output("u", "s", i, out, sample, final=i == n - 1)))
    return recs


class _VllmLike(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"data": [{"index": 0, "probs": [0.2, 0.8]}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


async def _time(manager: Any, batch: Any, n: int) -> list[float]:
    await manager.setup()
    try:
        await manager.run_single(batch)  # warm-up
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await manager.run_single(batch)
            times.append(time.perf_counter() - t0)
        return times
    finally:
        await manager.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200, help="trajectories per manager")
    args = ap.parse_args(argv)
    tok = load_tokenizer("builtin:demo")
    recs = trajectory(tok)
    t0 = time.perf_counter()
    for _ in range(args.n):
        batch = build_batch(recs)
    build_us = (time.perf_counter() - t0) / args.n * 1e6

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _VllmLike)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    ns = f"bench-mgr-{uuid.uuid4().hex[:6]}"
    ctx = ManagerContext(redis_url=REDIS_URL, namespace=ns, worker_name="bench")
    simt_tok = tok
    from tests.support.seqpo_simt.data import make_simt_trajectories

    simt = make_simt_trajectories(1, seed=1, tokenizer=simt_tok)[0]
    simt_batch = build_batch(
        [
            decode_output(encode_output("s", "s", i, o, simt["sample"], final=i == len(simt["outputs"]) - 1))
            for i, o in enumerate(simt["outputs"])
        ]
    )
    cases: list[tuple[str, Callable[[], Any], Any]] = [
        ("naive", lambda: build_manager("naive", tokenizer=tok, context=ctx), batch),
        (
            "dapo",
            lambda: build_manager(
                "dapo",
                tokenizer=tok,
                context=ctx,
                options={
                    "overlong_buffer": {"enable": True, "len": 512, "penalty_factor": 1.0, "log": True},
                    "max_resp_len": 4096,
                },
            ),
            batch,
        ),
        ("gdpo", lambda: build_manager("gdpo", tokenizer=tok, context=ctx, options={"experiment_name": "b"}), batch),
        (
            "limited (Redis limiter)",
            lambda: build_manager(
                "limited",
                tokenizer=tok,
                context=ctx,
                options={"max_rpm": 10**9, "max_tpm": 10**12, "max_concurrent": 64},
            ),
            batch,
        ),
        (
            "remote (gsm8k, 2 procs)",
            lambda: build_manager("remote", tokenizer=tok, context=ctx, options={"num_workers": 2}),
            batch,
        ),
        (
            "remote (math-verify)",
            lambda: build_manager(
                "remote", tokenizer=tok, context=ctx, options={"num_workers": 2, "scorer": "math_verify"}
            ),
            batch,
        ),
        (
            "disrm (loopback vLLM)",
            lambda: build_manager(
                "disrm",
                tokenizer=tok,
                context=ctx,
                options={
                    "base_url": f"http://127.0.0.1:{httpd.server_address[1]}",
                    "model": "rm",
                    "tokenizer": "builtin:demo",
                },
            ),
            batch,
        ),
        ("seqpo_simt (whole trajectory)", lambda: build_manager(SEQPO_SIMT, tokenizer=tok, context=ctx), simt_batch),
    ]
    rows = []
    try:
        for name, make, b in cases:
            times = asyncio.run(_time(make(), b, args.n))
            rows.append((name, statistics.median(times) * 1e6, sorted(times)[int(0.99 * (len(times) - 1))] * 1e6))
    finally:  # the rate limiter's and the judge cache's keys, whatever happened
        httpd.shutdown()
        import redis

        r = redis.Redis.from_url(REDIS_URL)
        for k in r.scan_iter(match=f"{ns}:*"):
            r.delete(k)
        r.close()
    base = rows[0][1]
    print(
        f"batch build (4 outputs, {sum(x.response_ids.shape[0] for x in recs)} response tokens): "
        f"{build_us:.0f} µs per trajectory"
    )
    print(f"{'manager':32s} {'p50 µs':>10s} {'p99 µs':>10s} {'vs naive':>9s}")
    for name, p50, p99 in rows:
        print(f"{name:32s} {p50:10.0f} {p99:10.0f} {p50 / base:8.2f}x")


if __name__ == "__main__":
    main()
