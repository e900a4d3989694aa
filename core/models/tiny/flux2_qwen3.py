"""A tiny offline Qwen3 text side (tokenizer + causal LM) for the tiny FLUX.2-klein.

Tokenizer: the real class the pipeline loads (transformers' Qwen2Tokenizer, which
`Qwen2TokenizerFast` names in transformers 5) built from a byte-level BPE vocabulary:
the 256 GPT-2 byte symbols (so every string tokenizes without merges) and Qwen's special
tokens, with Qwen3's chat template cut down to what Flux2KleinPipeline asks of it (text
messages, `add_generation_prompt`, `enable_thinking=False`). It renders exactly what
Qwen3's own template renders for those inputs:
`<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n`.
Ids stay below 262, inside the real 151936-entry vocabulary (random:flux2 uses it too).

Encoder: a Qwen3ForCausalLM with `QWEN_LAYERS` layers, so the hidden states the
pipeline stacks by default (9, 18, 27) exist and are intermediate layers, as in the real
36-layer Qwen3-4B/8B; hidden size 16 keeps it tiny.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.clip import byte_symbols

PAD_TOKEN = "<|endoftext|>"  # Qwen's pad (and eos of the base tokenizer)
SPECIALS = [PAD_TOKEN, "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
QWEN_LAYERS = 28
QWEN_HIDDEN = 16

# Qwen3's chat template, reduced to text messages; same output for what the pipeline asks.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def qwen_vocab() -> dict[str, int]:
    """The 256 byte symbols, then the special tokens."""
    vocab = {s: i for i, s in enumerate(byte_symbols())}
    for token in SPECIALS:
        vocab[token] = len(vocab)
    return vocab


def build_qwen_tokenizer(out_dir: Path, model_max_length: int = 131072) -> int:
    """Write a Qwen2/3 tokenizer (with the chat template) to `out_dir`; returns its size."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer(vocab=qwen_vocab(), merges=[], model_max_length=model_max_length,
                         errors="replace")
    tok.add_special_tokens({"additional_special_tokens": [
        AddedToken(t, special=True) for t in SPECIALS[1:]]})
    tok.chat_template = CHAT_TEMPLATE
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return len(tok)


def qwen_tokenizer(out_dir: Path) -> tuple[Any, int]:
    """Write the tokenizer to `out_dir` and load it back as the pipeline's class."""
    from transformers import Qwen2TokenizerFast

    size = build_qwen_tokenizer(out_dir)
    return Qwen2TokenizerFast.from_pretrained(str(out_dir), local_files_only=True), size


def tiny_qwen3(vocab_size: int, seed: int) -> Any:
    """A Qwen3ForCausalLM of QWEN_LAYERS layers, hidden QWEN_HIDDEN, random from `seed`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=QWEN_HIDDEN, intermediate_size=2 * QWEN_HIDDEN,
        num_hidden_layers=QWEN_LAYERS, num_attention_heads=2, num_key_value_heads=1,
        head_dim=8, max_position_embeddings=1024, tie_word_embeddings=True,
        pad_token_id=qwen_vocab()[PAD_TOKEN], eos_token_id=qwen_vocab()["<|im_end|>"],
        use_cache=False)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).eval()
