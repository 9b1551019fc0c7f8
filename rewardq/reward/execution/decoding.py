"""Decoding the responses of many trajectories together, off the event loop.

A worker scores the trajectories of one read batch side by side, each in its own task, and
each built-in manager decodes its final response first. :class:`BatchDecoder` collects every
``decode`` asked for in one event-loop turn and hands them to the tokenizer's ``decode_batch``
in one call, in a thread of its own: the ``tokenizers`` library decodes a batch in Rust
threads with the GIL released, so the event loop keeps reading, storing and committing
meanwhile, and a second core does the decoding. A tokenizer without such a path (a
transformers tokenizer that post-processes its decode, or any other object) decodes inline.
:class:`rewardq.reward.execution.host.ManagerHost` decides which path a manager's tokenizer
takes; a byte-level BPE tokenizer's responses go through a table in the event loop instead,
and only those longer than its ``INLINE_MAX_IDS`` come here.

If a batch fails (an id the vocabulary does not have), each of its sequences is decoded on
its own, so only the trajectory with the bad ids gets the error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rewardq.reward.tokenizer_backends import as_id_list

#: The most sequences one ``decode_batch`` call takes (a larger read batch is split).
MAX_BATCH = 64

DecodeBatch = Callable[[list[list[int]], bool], list[str]]


class BatchDecoder:
    """Batches ``decode`` calls made in one event-loop turn (see the module docstring).

    Args:
        decode_batch: ``(sequences, skip_special_tokens) -> texts``, equal to decoding each
            sequence on its own, and safe to call from a thread.
        max_batch: most sequences per call.
    """

    def __init__(self, decode_batch: DecodeBatch, max_batch: int = MAX_BATCH) -> None:
        self._decode_batch = decode_batch
        self.max_batch = max_batch
        self._pending: list[tuple[Any, bool, asyncio.Future[str]]] = []
        self._executor: ThreadPoolExecutor | None = None
        self.calls = 0  # decode_batch calls made (tests and profiling)

    async def decode(self, ids: object, skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (a tensor, array or list), decoded with the others of this loop turn."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()
        self._pending.append((ids, skip_special_tokens, fut))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif len(self._pending) == 1:
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rewardq-decode")
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._executor, self._decode_all, [(ids, skip) for ids, skip, _ in batch])
        work.add_done_callback(lambda done: self._deliver(batch, done))

    def _decode_all(self, items: list[tuple[object, bool]]) -> list[str | BaseException]:
        """In the decode thread: one ``decode_batch`` per ``skip_special_tokens`` value."""
        self.calls += 1
        out: list[str | BaseException] = [""] * len(items)
        for skip in {s for _, s in items}:
            where = [i for i, (_, s) in enumerate(items) if s == skip]
            seqs: list[list[int]] = []
            try:
                seqs = [as_id_list(items[i][0]) for i in where]
                texts: list[str | BaseException] = list(self._decode_batch(seqs, skip))
            except Exception:  # noqa: BLE001 - one bad sequence: decode each alone, so only it fails
                texts = [self._one(items[i][0], skip) for i in where]
            for i, text in zip(where, texts):
                out[i] = text
        return out

    def _one(self, ids: object, skip: bool) -> str | BaseException:
        try:
            return self._decode_batch([as_id_list(ids)], skip)[0]
        except Exception as exc:  # noqa: BLE001 - handed to the caller that asked for this one
            return exc

    @staticmethod
    def _deliver(
        batch: list[tuple[Any, bool, asyncio.Future[str]]], done: asyncio.Future[list[str | BaseException]]
    ) -> None:
        failure = None if done.cancelled() else done.exception()
        texts = [] if failure is not None or done.cancelled() else done.result()
        for k, (_, _, fut) in enumerate(batch):
            if fut.done():  # its caller gave up (a scoring timeout)
                continue
            if done.cancelled():
                fut.cancel()
                continue
            value = failure if failure is not None else texts[k]
            if isinstance(value, BaseException):
                fut.set_exception(value)
            else:
                fut.set_result(value)

    def close(self) -> None:
        """Stop the decode thread (calls already handed over finish first). Idempotent."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=False)
            self._executor = None
