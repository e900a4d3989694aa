"""A tiny offline Qwen3 text side for the tiny Z-Image: the Qwen2Tokenizer with the chat
template ZImagePipeline relies on, and a two-layer Qwen3Model.

Tokenizer: a byte-level BPE with no merges (the 256 GPT-2 byte symbols are the whole
vocabulary, so every string tokenizes, one token a byte) plus Qwen's special tokens:
`<|endoftext|>` (id 0; Qwen's pad/eos/unk), `<|im_start|>`, `<|im_end|>`, `<think>` and
`</think>`. It is the real transformers `Qwen2Tokenizer` class (Qwen's pre-tokenizer
regex, NFC normaliser, byte-level decoder), built from `vocab`/`merges` without a
download and saved with `save_pretrained`, as the real Z-Image's `tokenizer/` folder is.

Chat template: ZImagePipeline._encode_prompt calls `apply_chat_template([{"role": "user",
"content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=True)`.
`CHAT_TEMPLATE` is Qwen3's template reduced to what that call renders (no system prompt,
tools or multi-turn reasoning): "<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>
assistant\\n", and, with enable_thinking=False, Qwen3's empty think block after it.

Encoder: `Qwen3Model` (what the real model_index.json names) with two layers, because the
pipeline takes `hidden_states[-2]`, the second-to-last layer's output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
MODEL_MAX_LENGTH = 131072  # the real tokenizer_config.json's


def qwen_vocab() -> dict[str, int]:
    """<|endoftext|> then the 256 byte symbols: 257 entries (specials are added after)."""
    from core.models.tiny.clip import byte_symbols

    vocab = {PAD_TOKEN: 0}
    for symbol in byte_symbols():
        vocab[symbol] = len(vocab)
    return vocab


def qwen_tokenizer(out_dir: Path) -> Any:
    """Write the tiny Qwen2Tokenizer to `out_dir` and load it back from there."""
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer(vocab=qwen_vocab(), merges=[], additional_special_tokens=SPECIAL_TOKENS,
                         chat_template=CHAT_TEMPLATE, model_max_length=MODEL_MAX_LENGTH)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return Qwen2Tokenizer.from_pretrained(str(out_dir), local_files_only=True)


def tiny_qwen3_encoder(vocab_size: int, hidden: int, seed: int) -> Any:
    """A two-layer Qwen3Model (grouped-query attention as the real 4B: 2 heads, 1 kv head)
    with random weights drawn from `seed`."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=hidden // 2, max_position_embeddings=1024, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, tie_word_embeddings=True, pad_token_id=0,
        eos_token_id=0, bos_token_id=None, use_cache=False)
    torch.manual_seed(seed)
    return Qwen3Model(config).eval()
