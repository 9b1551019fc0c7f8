"""Tokenizer fingerprints: what they identify, and the worker-side check of the record field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
from tokenizers import Tokenizer as RawTokenizer

from rewardq.errors import RecordError, TokenizerMismatch
from rewardq.queue.checks import tokenizer_mismatch
from rewardq.queue.codec import decode_output, encode_output
from rewardq.reward import tokenizer_fingerprint as fp
from rewardq.reward.tokenizer import DEMO_PATH, Tokenizer, load_tokenizer
from rewardq.reward.tokenizer_fingerprint import tokenizer_fingerprint
from tests.support.checks import must

OUT = {"prompt_ids": [5, 6], "response_ids": [7, 8, 9]}


@pytest.fixture(scope="module")
def demo() -> Tokenizer:
    return load_tokenizer("builtin:demo")


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The demo vocabulary with two tokens swapped: same size, other text for two ids."""
    data = json.loads(DEMO_PATH.read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(json.dumps(data))
    return load_tokenizer(str(path))


def test_the_fingerprint_names_the_vocabulary(demo: Tokenizer) -> None:
    text = must(tokenizer_fingerprint(demo))
    sha, vocab, name = text.split(" ", 2)
    assert sha.startswith("sha256=") and len(sha) == len("sha256=") + 16
    assert vocab == f"vocab={demo.vocab_size}" and name == "name=builtin:demo"


def test_the_same_vocabulary_has_the_same_fingerprint_wherever_it_was_loaded_from(
    demo: Tokenizer, tmp_path: Path
) -> None:
    copy = tmp_path / "tokenizer.json"
    copy.write_text(DEMO_PATH.read_text())
    again = load_tokenizer(str(copy))
    raw = RawTokenizer.from_file(str(DEMO_PATH))
    prints = [must(tokenizer_fingerprint(t)) for t in (demo, again)] + [
        must(tokenizer_fingerprint(raw))  # type: ignore[arg-type]  # the tokenizers library's own object, as verl may hold
    ]
    assert len({p.split(" name=")[0] for p in prints}) == 1
    assert tokenizer_mismatch(prints[0], prints[1]) is None  # names differ, vocabularies do not


def test_another_vocabulary_of_the_same_size_differs(demo: Tokenizer, other: Tokenizer) -> None:
    a, b = must(tokenizer_fingerprint(demo)), must(tokenizer_fingerprint(other))
    assert other.vocab_size == demo.vocab_size and a.split(" ")[0] != b.split(" ")[0]
    message = tokenizer_mismatch(b, a)
    assert message is not None and a in message and b in message and "--tokenizer" in message


def test_computed_once_per_tokenizer(demo: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = fp._vocabulary

    def counting(tok: Any) -> Any:
        calls.append(tok)
        return real(tok)

    monkeypatch.setattr(fp, "_vocabulary", counting)
    monkeypatch.setattr(fp, "_cache", {})
    first = tokenizer_fingerprint(demo)
    assert all(tokenizer_fingerprint(demo) == first for _ in range(100))
    assert len(calls) == 1


def test_objects_without_a_vocabulary_are_not_fingerprinted() -> None:
    assert tokenizer_fingerprint(None) is None
    assert tokenizer_fingerprint(object()) is None  # type: ignore[arg-type]  # a tokenizer of no known kind


def test_the_record_field_is_optional_and_checked(demo: Tokenizer, other: Tokenizer) -> None:
    plain = encode_output("u", "s", 0, OUT, {}, final=True)
    assert "tokenizer" not in msgpack.unpackb(plain, raw=False, ext_hook=lambda c, d: None)  # unchanged bytes
    mine = tokenizer_fingerprint(demo)
    marked = encode_output("u", "s", 0, OUT, {}, final=True, tokenizer=mine)
    assert decode_output(marked).tokenizer == mine
    assert decode_output(marked, tokenizer=mine, vocab_size=demo.vocab_size).response_ids.tolist() == [7, 8, 9]
    assert decode_output(plain, tokenizer=mine).tokenizer is None  # a producer that does not know: not checked
    with pytest.raises(TokenizerMismatch, match="wrong tokenizer") as info:
        decode_output(marked, tokenizer=tokenizer_fingerprint(other))
    assert info.value.field == "tokenizer"


def test_a_mismatch_is_named_before_ids_are_found_out_of_range(demo: Tokenizer, other: Tokenizer) -> None:
    big = {"prompt_ids": [5], "response_ids": [100_000]}  # out of range for the demo vocabulary
    data = encode_output("u", "s", 0, big, {}, final=True, tokenizer=tokenizer_fingerprint(other))
    with pytest.raises(TokenizerMismatch):
        decode_output(data, vocab_size=demo.vocab_size, tokenizer=tokenizer_fingerprint(demo))


@pytest.mark.parametrize("bad", ["", "two\nlines", "x" * 600, 7])
def test_malformed_fingerprints_are_refused_on_both_sides(bad: int | str) -> None:
    with pytest.raises(RecordError, match="tokenizer"):
        encode_output("u", "s", 0, OUT, {}, final=True, tokenizer=bad)  # type: ignore[arg-type]  # 7 is one bad value
    record = msgpack.unpackb(encode_output("u", "s", 0, OUT, {}, final=True), raw=False)  # ids stay ExtType
    record["tokenizer"] = bad
    with pytest.raises(RecordError, match="tokenizer") as info:
        decode_output(msgpack.packb(record, use_bin_type=True))
    assert not isinstance(info.value, TokenizerMismatch)
