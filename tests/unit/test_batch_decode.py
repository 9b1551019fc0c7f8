"""Batched decoding off the event loop (rewardq.reward.execution.decoding): one decode_batch per loop turn,
exactly the texts one decode per sequence gives, and a bad sequence fails only its own caller."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

from rewardq.reward.execution import host as host_module
from rewardq.reward.execution.decoding import BatchDecoder
from rewardq.reward.managers.naive import NaiveRewardManager
from rewardq.reward.tokenizer import load_demo_tokenizer
from rewardq.reward.tokenizer_backends import batch_decoder
from tests.support import records

TOK = load_demo_tokenizer()


def sequences(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, TOK.vocab_size, int(rng.integers(0, 400))).astype(np.int32) for _ in range(n)]


def test_the_demo_tokenizers_batch_path_gives_what_decode_gives() -> None:
    native = batch_decoder(TOK)
    assert native is not None
    seqs = sequences(40)
    for skip in (True, False):
        want = [TOK.decode(s, skip_special_tokens=skip) for s in seqs]
        assert native([s.tolist() for s in seqs], skip) == want
    assert batch_decoder(object()) is None  # anything else decodes inline


async def test_one_loop_turn_is_one_call_in_another_thread() -> None:
    seen_threads: set[str] = set()
    native = batch_decoder(TOK)
    assert native is not None

    def recording(seqs: list[list[int]], skip: bool) -> list[str]:
        seen_threads.add(threading.current_thread().name)
        return native(seqs, skip)

    decoder = BatchDecoder(recording)
    seqs = sequences(30, seed=1)
    inputs = [torch.from_numpy(s.astype(np.int64)) if i % 2 else s for i, s in enumerate(seqs)]
    got = await asyncio.gather(*(decoder.decode(x) for x in inputs))
    assert got == [TOK.decode(s) for s in seqs]
    assert decoder.calls == 1 and seen_threads and threading.current_thread().name not in seen_threads
    # a larger burst is split into batches of at most max_batch
    small = BatchDecoder(native, max_batch=8)
    assert await asyncio.gather(*(small.decode(s) for s in seqs)) == [TOK.decode(s) for s in seqs]
    assert small.calls == 4
    decoder.close()
    small.close()


async def test_a_bad_sequence_fails_only_its_caller_and_a_cancelled_caller_harms_nobody() -> None:
    native = batch_decoder(TOK)
    assert native is not None
    decoder = BatchDecoder(native)
    seqs = sequences(6, seed=2)
    bad = np.array([1, -5], dtype=np.int64)  # not a token id: the tokenizer refuses it
    tasks = [asyncio.ensure_future(decoder.decode(s)) for s in seqs[:3]]
    doomed = asyncio.ensure_future(decoder.decode(bad))
    gone = asyncio.ensure_future(decoder.decode(seqs[3]))
    tasks += [asyncio.ensure_future(decoder.decode(s)) for s in seqs[4:]]
    await asyncio.sleep(0)
    gone.cancel()
    done = await asyncio.gather(*tasks)
    assert done == [TOK.decode(s) for s in seqs[:3] + seqs[4:]]
    with pytest.raises((OverflowError, TypeError, ValueError)):
        await doomed
    assert gone.cancelled()
    decoder.close()


async def test_the_naive_manager_decodes_through_the_batch_path_with_the_same_rewards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the demo tokenizer is byte-level: its responses go through the table (test_byte_level.py) unless
    # longer than INLINE_MAX_IDS; here every one is, so all go to the decode thread
    monkeypatch.setattr(host_module, "INLINE_MAX_IDS", -1)
    sample = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"}, "extra_info": {}}
    manager = NaiveRewardManager(TOK)
    answers = ["#### 72", "#### 71", "no answer", "so #### 72"]
    batches = [records.trajectory_batch("step one", a, sample=sample, eos=True) for a in answers]
    got = await asyncio.gather(*(manager.run_single(b) for b in batches))
    assert [g["reward_score"] for g in got] == [1.0, 0.0, 0.0, 1.0]
    decoder = manager.host.decoder
    assert isinstance(decoder, BatchDecoder) and decoder.calls == 1
    await manager.close_scoring()
    assert manager.host.decoder is None
