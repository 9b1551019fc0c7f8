"""The worker reads its tokenizer's vocabulary size once, into its decoder (rewardq.consumers.compose):
tokenizers 0.22, in verl 0.9.1's environment, counts a 128k vocabulary in ~120 ms per call."""

from __future__ import annotations

import pytest

from rewardq.config import WorkerConfig
from rewardq.consumers.compose import record_decoder
from rewardq.consumers.parts import WorkerParts
from rewardq.errors import RecordError
from rewardq.queue.codec import encode_output


class CountingTokenizer:
    def __init__(self) -> None:
        self.asked = 0

    @property
    def vocab_size(self) -> int:
        self.asked += 1
        return 129_280


def test_the_vocabulary_size_is_read_once_per_worker() -> None:
    tok = CountingTokenizer()
    decode = record_decoder(WorkerConfig(), tok, None)
    parts = object.__new__(WorkerParts)  # only the decoder matters here
    object.__setattr__(parts, "decoder", decode)
    assert [parts.vocab_size for _ in range(5)] == [129_280] * 5
    assert tok.asked == 1
    # the decoder bounds a record's ids by it
    ok = encode_output("u", "s", 0, {"prompt_ids": [1], "response_ids": [129_279]}, {}, final=True)
    assert decode(ok).response_ids.tolist() == [129_279]
    past = encode_output("u", "s", 0, {"prompt_ids": [1], "response_ids": [129_280]}, {}, final=True)
    with pytest.raises(RecordError):
        decode(past)
    assert tok.asked == 1
    # no tokenizer: ids are not bounded
    assert record_decoder(WorkerConfig(), None, None).vocab_size is None
