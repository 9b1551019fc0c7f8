"""The worker reads its tokenizer's vocabulary size once (rewardq.consumers.parts): tokenizers 0.22, in
verl 0.9.1's environment, counts a 128k vocabulary in ~120 ms per call."""

from __future__ import annotations

from rewardq.consumers.parts import WorkerParts


class CountingTokenizer:
    def __init__(self) -> None:
        self.asked = 0

    @property
    def vocab_size(self) -> int:
        self.asked += 1
        return 129_280


def test_the_vocabulary_size_is_read_once_per_worker() -> None:
    tok = CountingTokenizer()
    parts = object.__new__(WorkerParts)  # only the tokenizer matters here
    object.__setattr__(parts, "tokenizer", tok)
    assert [parts.vocab_size for _ in range(5)] == [129_280] * 5
    assert tok.asked == 1
    other = object.__new__(WorkerParts)
    object.__setattr__(other, "tokenizer", None)
    assert other.vocab_size is None  # no tokenizer: ids are not bounded
