"""A tiny offline Qwen2.5-VL text encoder and its byte-level BPE tokenizer (Qwen-Image).

The tokenizer is transformers' own `Qwen2Tokenizer` (Qwen's pre-tokenizer regex and
byte-level BPE, what the real Qwen/Qwen-Image `tokenizer/` loads as), built from a vocab
and merges made here: the 256 byte symbols, plus whole-word merges for every word of the
pipeline's prompt template, so the template's system part is exactly as many tokens as
the real tokenizer makes of it (34 = QwenImagePipeline.prompt_template_encode_start_idx:
the pipeline drops that many leading hidden states, so with any other count the tiny
model would keep or lose part of the template). Prompts' own words mostly stay single
bytes. The special tokens the template relies on (<|im_start|>, <|im_end|>, with
<|endoftext|> as pad/eos) are special added tokens, and the ChatML chat template is set.

The encoder is a real Qwen2_5_VLForConditionalGeneration with a tiny text config and a
tiny vision config (the pipeline only runs the text path, but the class needs both).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
# QwenImagePipeline.prompt_template_encode, up to the user's text: the part it drops.
TEMPLATE_PREFIX = ("<|im_start|>system\nDescribe the image by detailing the color, shape, "
                   "size, texture, quantity, text, spatial relationships of the objects and "
                   "background:<|im_end|>\n<|im_start|>user\n")
TEMPLATE_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
TEMPLATE_DROP = 34  # the real tokenizer's count of TEMPLATE_PREFIX
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' "
                 "+ message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
HEAD_DIM = 16


def _pieces(text: str) -> list[str]:
    """Byte-level pre-tokens of `text` (special tokens removed), as Qwen2Tokenizer splits."""
    from transformers import Qwen2Tokenizer

    splitter = Qwen2Tokenizer(vocab={END_OF_TEXT: 0}, merges=[])._tokenizer.pre_tokenizer
    out = []
    for chunk in re.split("|".join(map(re.escape, (IM_START, IM_END))), text):
        out += [p for p, _ in splitter.pre_tokenize_str(chunk)]
    return out


def qwen_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges): byte symbols, then left-to-right merges building each template
    word (" the" -> "Ġ"+"t", "Ġt"+"h", "Ġth"+"e"), each merge once."""
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {symbol: i for i, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    merges: list[tuple[str, str]] = []
    words = _pieces(TEMPLATE_PREFIX + TEMPLATE_SUFFIX)
    for word in words:
        for end in range(2, len(word) + 1):
            left, right = word[:end - 1], word[end - 1]
            if word[:end] not in vocab:
                vocab[word[:end]] = len(vocab)
                merges.append((left, right))
    vocab[END_OF_TEXT] = len(vocab)
    return vocab, merges


def qwen_tokenizer(out_dir: Path) -> Any:
    """Write the tiny Qwen2Tokenizer to `out_dir` and load it back (as the pipeline's
    from_pretrained will); checks the template's dropped part is 34 tokens."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = qwen_vocab()
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, model_max_length=32768,
                         errors="replace")
    tok.add_special_tokens({"additional_special_tokens": [
        AddedToken(IM_START, special=True), AddedToken(IM_END, special=True)]})
    tok.chat_template = CHAT_TEMPLATE
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    loaded = Qwen2Tokenizer.from_pretrained(str(out_dir), local_files_only=True)
    count = len(loaded(TEMPLATE_PREFIX).input_ids)
    if count != TEMPLATE_DROP:  # a guard on this builder, not a user error
        raise RuntimeError(f"tiny Qwen tokenizer makes {count} tokens of the template's "
                           f"system part, the real one {TEMPLATE_DROP}")
    return loaded


def tiny_qwen_vl(tokenizer: Any, hidden: int, seed: int, layers: int = 1) -> Any:
    """A Qwen2_5_VLForConditionalGeneration for `tokenizer`'s vocabulary and special ids,
    with a `hidden`-wide, `layers`-deep text model (head_dim 16; multimodal rope sections
    2/3/3, summing to half of it) and a one-block 16-wide vision tower, random weights
    from `seed`."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    heads = max(1, hidden // HEAD_DIM)
    vocab_size = len(tokenizer)
    ids = {"bos_token_id": None, "eos_token_id": tokenizer.convert_tokens_to_ids(IM_END),
           "pad_token_id": tokenizer.pad_token_id}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 2 * hidden,
            "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": heads, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "rope_scaling": {"type": "default", "rope_type": "default",
                             "mrope_section": [2, 3, 3]},
            "rope_theta": 1000000.0, **ids,
        },
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": hidden, "fullatt_block_indexes": [0]},
        vocab_size=vocab_size, hidden_size=hidden, tie_word_embeddings=False, **ids,
    )
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval()
