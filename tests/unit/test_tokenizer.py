"""The tokenizer loader and the bundled demo tokenizer."""

from __future__ import annotations

import json
import random
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rewardq.errors import ConfigError
from rewardq.reward import tokenizer as tokmod
from rewardq.reward.chat_template import render_chatml
from rewardq.reward.tokenizer import DEMO_PATH, Tokenizer, load_tokenizer
from rewardq.reward.tokenizer_backends import FastTokenizer, TransformersTokenizer
from tools.make_demo_tokenizer import SPECIAL_TOKENS, build_json

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def demo() -> FastTokenizer:
    tok = load_tokenizer("builtin:demo")
    assert isinstance(tok, FastTokenizer)
    return tok


@pytest.fixture
def hf_folder(tmp_path: Path, demo: FastTokenizer) -> Path:
    """A Hugging Face style folder: tokenizer.json + tokenizer_config.json with a jinja template."""
    folder = tmp_path / "my-model"
    folder.mkdir()
    demo.backend.save(str(folder / "tokenizer.json"))
    config = {
        "eos_token": {"content": "<|endoftext|>", "special": True},
        "bos_token": "<|im_start|>",
        "pad_token": None,
        "chat_template": (
            "{{ bos_token }}{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n"
            "{% endfor %}{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
        ),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


# --------------------------------------------------------------------------------------
# the demo tokenizer
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", [None, "", "  "])
def test_there_is_no_default_tokenizer(given: str | None) -> None:
    with pytest.raises(ConfigError, match="no tokenizer given") as info:
        load_tokenizer(given)
    message = str(info.value)
    assert "--tokenizer" in message and "REWARDQ_TOKENIZER" in message and "actor_rollout_ref.model.path" in message


def test_demo_is_asked_for_by_name_and_has_a_sensible_vocabulary(demo: FastTokenizer) -> None:
    assert isinstance(demo, FastTokenizer)
    assert isinstance(demo, Tokenizer)
    assert 2000 <= demo.vocab_size <= 4000
    assert [demo.backend.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert demo.eos_token == "<|im_end|>" and demo.eos_token_id == 2
    assert demo.bos_token is None and demo.bos_token_id is None
    assert demo.pad_token_id == 0  # the batch pad id is a special token
    assert DEMO_PATH.stat().st_size < 300_000


def test_demo_asset_is_reproducible_from_its_generator() -> None:
    assert build_json() == DEMO_PATH.read_text(encoding="utf-8")


ROUND_TRIP = [
    "",
    "Natalia sold 48 clips in April. #### 72",
    r"So $x = \frac{-b \pm \sqrt{b^2-4ac}}{2a}$ and \boxed{\dfrac{1}{2}}.",
    "Answer: 1,000,000.25",
    "  leading and trailing spaces, tabs\t and\r\nnewlines\n\n",
    "Ünïcödé: café, naïve, 東京, 한국어, Ελληνικά, русский, עברית, العربية",
    "emoji 🎉🧮👩🏽‍🔬 and combining e\u0301 and zero\u200bwidth",
    "<think>plan</think><answer> Paris </answer>",
    "\x00\x01 control \x7f chars and a lone surrogate-free \U0010ffff",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_demo_round_trip(demo: FastTokenizer, text: str) -> None:
    ids = demo.encode(text)
    assert all(isinstance(i, int) for i in ids)
    assert demo.decode(ids) == text


def test_demo_round_trip_random_unicode(demo: FastTokenizer) -> None:
    rng = random.Random(7)
    alphabet = [
        chr(c)
        for c in list(range(32, 127))
        + list(range(0xA0, 0x2FF))
        + list(range(0x4E00, 0x4E80))
        + list(range(0x1F600, 0x1F650))
    ] + ["\n", "\t", " "]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80)))
        assert demo.decode(demo.encode(text)) == text


def test_demo_is_compact_on_its_domain(demo: FastTokenizer) -> None:
    text = "Natalia sold 48 clips in April, and then she sold half as many clips in May."
    assert len(demo.encode(text)) < len(text) / 2.5


def test_decode_accepts_lists_arrays_and_tensors(demo: FastTokenizer) -> None:
    ids = demo.encode("#### 72")
    expected = "#### 72"
    assert demo.decode(ids) == expected
    assert demo.decode(tuple(ids)) == expected
    assert demo.decode(np.array(ids, dtype=np.int32)) == expected
    assert demo.decode(torch.tensor(ids, dtype=torch.int64)) == expected
    assert demo.decode(torch.tensor(ids[0])) == demo.decode([ids[0]])
    with pytest.raises(ValueError, match="batch_decode"):
        demo.decode([ids, ids])
    assert demo.batch_decode([ids, torch.tensor(ids)]) == [expected, expected]


def test_skip_special_tokens(demo: FastTokenizer) -> None:
    text = "<|im_start|>assistant\nAnswer: 4<|im_end|><|endoftext|>"
    ids = demo.encode(text)
    assert ids[0] == 1 and ids[-2:] == [2, 0]  # special strings become their ids
    assert demo.decode(ids) == "assistant\nAnswer: 4"
    assert demo.decode(ids, skip_special_tokens=False) == text


def test_demo_chat_template_is_chatml(demo: FastTokenizer) -> None:
    text = demo.apply_chat_template(CHAT, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert demo.apply_chat_template(CHAT) == text[: -len("<|im_start|>assistant\n")]
    assert demo.apply_chat_template(CHAT, tokenize=True) == demo.encode(str(demo.apply_chat_template(CHAT)))
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}
    ]
    assert render_chatml(parts) == "<|im_start|>user\nab<|im_end|>\n"


# --------------------------------------------------------------------------------------
# files and folders
# --------------------------------------------------------------------------------------


def test_tokenizer_json_file(tmp_path: Path, demo: FastTokenizer) -> None:
    path = tmp_path / "tokenizer.json"
    demo.backend.save(str(path))
    tok = load_tokenizer(str(path))
    assert isinstance(tok, FastTokenizer)
    assert tok.encode("Answer: 42") == demo.encode("Answer: 42")
    assert tok.vocab_size == demo.vocab_size
    assert tok.eos_token is None  # no tokenizer_config.json beside it
    assert tok.apply_chat_template(CHAT[1:]) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"


def test_folder_with_tokenizers_backend_uses_config_and_jinja_template(hf_folder: Path) -> None:
    tok = load_tokenizer(str(hf_folder), backend="tokenizers")
    assert isinstance(tok, FastTokenizer)
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    assert tok.bos_token == "<|im_start|>" and tok.pad_token is None
    assert tok.apply_chat_template(CHAT, add_generation_prompt=True) == (
        "<|im_start|>[SYSTEM] Be brief.\n[USER] What is 2+2?\n[ASSISTANT] "
    )
    # the file inside the folder picks up the same side files
    assert load_tokenizer(str(hf_folder / "tokenizer.json")).eos_token == "<|endoftext|>"


def test_auto_backend_without_transformers_reads_the_folder(hf_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokmod, "_transformers_available", lambda: False)
    tok = load_tokenizer(hf_folder)  # a PathLike works too
    assert isinstance(tok, FastTokenizer) and tok.eos_token == "<|endoftext|>"


def test_template_list_and_jinja_file(hf_folder: Path) -> None:
    config = json.loads((hf_folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEF"}]
    (hf_folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(str(hf_folder), backend="tokenizers").apply_chat_template(CHAT) == "DEF"
    (hf_folder / "chat_template.jinja").write_text("{{ messages | length }} messages")
    assert load_tokenizer(str(hf_folder), backend="tokenizers").apply_chat_template(CHAT) == "2 messages"


def test_template_raise_exception_and_tojson(hf_folder: Path) -> None:
    config = json.loads((hf_folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}{{ messages | tojson }}"
    )
    (hf_folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(str(hf_folder), backend="tokenizers")
    with pytest.raises(ValueError, match="user first"):
        tok.apply_chat_template(CHAT)
    rendered = tok.apply_chat_template(CHAT[1:])
    assert isinstance(rendered, str) and json.loads(rendered) == CHAT[1:]


def test_without_jinja2_falls_back_to_chatml(
    hf_folder: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "jinja2", None)
    monkeypatch.setitem(sys.modules, "jinja2.ext", None)
    monkeypatch.setitem(sys.modules, "jinja2.sandbox", None)
    tok = load_tokenizer(str(hf_folder), backend="tokenizers")
    assert tok.apply_chat_template(CHAT[1:]) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    assert "jinja2 is not installed" in caplog.text


# --------------------------------------------------------------------------------------
# transformers delegation (a stand-in module: transformers is an optional dependency)
# --------------------------------------------------------------------------------------


class _FakeHF:
    eos_token, bos_token, pad_token = "</s>", "<s>", "<pad>"
    eos_token_id, bos_token_id, pad_token_id = 2, 1, 0

    def __init__(self, path: str) -> None:
        self.path = path
        self.calls: list[tuple[str, object, bool]] = []

    def __len__(self) -> int:
        return 32001

    def decode(self, ids: object, skip_special_tokens: bool = True) -> str:
        self.calls.append(("decode", ids, skip_special_tokens))
        return f"decoded {ids}"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [7, 8] if not add_special_tokens else [1, 7, 8]

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tokenize: bool = True, add_generation_prompt: bool = False, **kw: Any
    ) -> str:
        return f"chat {len(messages)} {tokenize} {add_generation_prompt}"


@pytest.fixture
def fake_transformers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    loaded: list[str] = []

    class AutoTokenizer:
        @staticmethod
        def from_pretrained(path: str, local_files_only: bool = False) -> _FakeHF:
            assert local_files_only, "a worker never asks the network for a tokenizer"
            if "missing" in str(path):
                raise OSError(f"{path} is not a local folder and is not a valid model identifier")
            loaded.append(path)
            return _FakeHF(path)

    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoTokenizer=AutoTokenizer))
    return loaded


def test_folder_uses_transformers_when_installed(hf_folder: Path, fake_transformers: list[str]) -> None:
    tok = load_tokenizer(str(hf_folder))
    assert isinstance(tok, TransformersTokenizer) and fake_transformers == [str(hf_folder)]
    assert tok.vocab_size == 32001 and tok.eos_token == "</s>" and tok.bos_token_id == 1
    assert tok.decode(torch.tensor([5, 6])) == "decoded [5, 6]"
    assert isinstance(tok.backend, _FakeHF) and tok.backend.calls == [("decode", [5, 6], True)]
    assert tok.encode("x") == [7, 8]
    assert tok.apply_chat_template(CHAT, add_generation_prompt=True) == "chat 2 False True"
    # backend="tokenizers" never touches transformers
    assert isinstance(load_tokenizer(str(hf_folder), backend="tokenizers"), FastTokenizer)


def test_hub_id_goes_to_transformers_once_found_in_the_cache(
    fake_transformers: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local cache is looked at first (offline); only a cached id reaches transformers (which is
    told to stay offline too). Without a cache entry it fails before transformers is asked."""
    looked: list[str] = []

    def cached(name: str, origin: str | None) -> Path:
        looked.append(name)
        if "missing" in name:
            raise ConfigError(tokmod._hub_help(name, origin))
        return tmp_path

    monkeypatch.setattr(tokmod, "_hub_cached", cached)
    tok = load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct")
    assert isinstance(tok, TransformersTokenizer) and tok.name == "Qwen/Qwen2.5-0.5B-Instruct"
    assert fake_transformers == [str(tmp_path)]  # the cached folder, never the id: no Hub call at all
    with pytest.raises(ConfigError, match="missing/model.*not in the local Hugging Face cache") as info:
        load_tokenizer("missing/model", origin="actor_rollout_ref.model.path in run.yaml")
    message = str(info.value)
    assert "hf download missing/model" in message and "huggingface-cli download missing/model" in message
    assert "HF_HUB_OFFLINE" in message and "--tokenizer" in message
    assert "actor_rollout_ref.model.path in run.yaml" in message
    assert fake_transformers == [str(tmp_path)] and "missing/model" in looked


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------


def test_missing_path_names_it_and_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokmod, "_transformers_available", lambda: False)
    missing = tmp_path / "no-such-tokenizer"
    with pytest.raises(ConfigError) as info:
        load_tokenizer(str(missing))
    message = str(info.value)
    assert str(missing) in message and "does not exist" in message and "--tokenizer" in message
    with pytest.raises(ConfigError, match="~/models/deepseek-llm-7b-chat.*model.path in t.yaml.*--tokenizer"):
        load_tokenizer("~/models/deepseek-llm-7b-chat", origin="model.path in t.yaml")


def test_folder_without_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has no tokenizer.json"):
        load_tokenizer(str(tmp_path), backend="tokenizers")


def test_corrupt_files(tmp_path: Path, hf_folder: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json"):
        load_tokenizer(str(bad))
    (hf_folder / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_tokenizer(str(hf_folder), backend="tokenizers")


def test_bad_builtin_and_backend_names() -> None:
    with pytest.raises(ConfigError, match="builtin:demo"):
        load_tokenizer("builtin:qwen")
    with pytest.raises(ConfigError, match="backend"):
        load_tokenizer(None, backend="sentencepiece")


def test_transformers_backend_required_but_missing(hf_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokmod, "_transformers_available", lambda: False)
    with pytest.raises(ConfigError, match="pip install transformers"):
        load_tokenizer(str(hf_folder), backend="transformers")
