"""One tiny offline Qwen3 text side, shared by the tiny Z-Image and the tiny FLUX.2-klein:
a Qwen2 tokenizer with Qwen3's chat template, and a Qwen3 model of any depth.

Tokenizer: the real class both pipelines load (transformers' Qwen2Tokenizer; transformers
5 names the same class Qwen2TokenizerFast) built from a byte-level BPE vocabulary with no
merges: the 256 GPT-2 byte symbols (so every string tokenizes, one token a byte), then
Qwen's special tokens (`<|endoftext|>`, Qwen's pad; `<|im_start|>`, `<|im_end|>`,
`<think>`, `</think>`). Ids stay below 262, inside the real 151936-entry vocabulary, so
random:z_image and random:flux2 use it with the real encoder's size.

Chat template: Qwen3's, reduced to what both pipelines ask of it (text messages,
`add_generation_prompt`, `enable_thinking`); for those inputs it renders what Qwen3's own
renders: `<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n`, plus the empty
think block `<think>\\n\\n</think>\\n\\n` when enable_thinking is False.

Encoder: Z-Image's model_index.json names `Qwen3Model` (it takes `hidden_states[-2]`, so
two layers are enough); FLUX.2-klein's names `Qwen3ForCausalLM` (it stacks hidden states
9, 18 and 27, so it needs 28 layers). `tiny_qwen3` builds either, grouped-query attention
as the real 4B (2 heads, 1 kv head).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.tiny.clip import byte_symbols

PAD_TOKEN = "<|endoftext|>"
SPECIALS = [PAD_TOKEN, "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
MODEL_MAX_LENGTH = 131072  # the real tokenizer_config.json's

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
    """The 256 byte symbols, then the special tokens: 261 entries."""
    vocab = {s: i for i, s in enumerate(byte_symbols())}
    for token in SPECIALS:
        vocab[token] = len(vocab)
    return vocab


def qwen_tokenizer(out_dir: Path) -> Any:
    """Write the tiny Qwen tokenizer (with the chat template) to `out_dir` and load it back
    from there, as the pipeline's from_pretrained will."""
    from tokenizers import AddedToken
    from transformers import Qwen2TokenizerFast

    tok = Qwen2TokenizerFast(vocab=qwen_vocab(), merges=[], model_max_length=MODEL_MAX_LENGTH,
                             errors="replace")
    tok.add_special_tokens({"additional_special_tokens": [
        AddedToken(t, special=True) for t in SPECIALS[1:]]})
    tok.chat_template = CHAT_TEMPLATE
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return Qwen2TokenizerFast.from_pretrained(str(out_dir), local_files_only=True)


def tiny_qwen3(vocab_size: int, hidden: int, layers: int, seed: int, *,
               causal_lm: bool) -> Any:
    """A Qwen3Model (or Qwen3ForCausalLM when `causal_lm`) `layers` deep and `hidden` wide,
    random weights from `seed`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

    vocab = qwen_vocab()
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
        head_dim=hidden // 2, max_position_embeddings=1024, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, tie_word_embeddings=True, pad_token_id=vocab[PAD_TOKEN],
        eos_token_id=vocab["<|im_end|>"], bos_token_id=None, use_cache=False)
    torch.manual_seed(seed)
    return (Qwen3ForCausalLM if causal_lm else Qwen3Model)(config).eval()
