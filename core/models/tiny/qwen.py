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
tiny vision config (QwenImagePipeline only runs the text path, but the class needs both;
the edit pipelines run the vision tower on their control images).

Qwen-Image-Edit (`qwen_edit_tokenizer`): the same builder with the edit pipelines'
template, whose system part is 64 tokens for the real tokenizer
(QwenImageEditPipeline.prompt_template_encode_start_idx), and Qwen2.5-VL's vision tokens
(<|vision_start|>, <|image_pad|>, <|vision_end|>, <|video_pad|>) as special tokens, so a
Qwen2VLProcessor (with VL_IMAGE_PROCESSOR's settings) expands <|image_pad|> to one token
per merged image patch and the encoder's vision tower fills them (`tiny_qwen_vl` gives
the config those token ids when the tokenizer has them).
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
# Qwen-Image-Edit's template (QwenImageEditPipeline / QwenImageEditPlusPipeline
# .prompt_template_encode), up to the user's part: what both edit pipelines drop.
EDIT_TEMPLATE_PREFIX = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
    "texture, objects, background), then explain how the user's text instruction should "
    "alter or modify the image. Generate a new image that meets the user's requirements "
    "while maintaining consistency with the original input where appropriate.<|im_end|>\n"
    "<|im_start|>user\n")
EDIT_TEMPLATE_DROP = 64  # the real tokenizer's count of EDIT_TEMPLATE_PREFIX
# Qwen2.5-VL's vision tokens (the real ids 151652, 151655, 151653, 151656).
VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD = (
    "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
# Qwen/Qwen2.5-VL-7B-Instruct's preprocessor_config.json (Qwen-Image-Edit's processor/).
VL_IMAGE_PROCESSOR = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
                      "temporal_patch_size": 2, "merge_size": 2,
                      "image_mean": [0.48145466, 0.4578275, 0.40821073],
                      "image_std": [0.26862954, 0.26130258, 0.27577711]}


def _pieces(text: str, specials: tuple[str, ...] = (IM_START, IM_END)) -> list[str]:
    """Byte-level pre-tokens of `text` (the `specials` removed), as Qwen2Tokenizer splits."""
    from transformers import Qwen2Tokenizer

    splitter = Qwen2Tokenizer(vocab={END_OF_TEXT: 0}, merges=[])._tokenizer.pre_tokenizer
    out = []
    for chunk in re.split("|".join(map(re.escape, specials)), text):
        out += [p for p, _ in splitter.pre_tokenize_str(chunk)]
    return out


def qwen_vocab(template: str = TEMPLATE_PREFIX + TEMPLATE_SUFFIX
               ) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges): byte symbols, then left-to-right merges building each word of
    `template` (" the" -> "Ġ"+"t", "Ġt"+"h", "Ġth"+"e"), each merge once; then
    `_whole_words` adds what a word still needs to be one token."""
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {symbol: i for i, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    merges: list[tuple[str, str]] = []
    words = _pieces(template, (IM_START, IM_END, *VISION_TOKENS))
    for word in words:
        for end in range(2, len(word) + 1):
            left, right = word[:end - 1], word[end - 1]
            if word[:end] not in vocab:
                vocab[word[:end]] = len(vocab)
                merges.append((left, right))
    _whole_words(words, vocab, merges)
    vocab[END_OF_TEXT] = len(vocab)
    return vocab, merges


def _whole_words(words: list[str], vocab: dict[str, int], merges: list[tuple[str, str]]
                 ) -> None:
    """BPE applies the lowest-ranked merge first, so a prefix merge of one word can split
    another mid-word (" consistency" meets "co" from "color" before "Ġ"+"c"): tokenize
    each word with the merges so far and append a merge of its first two pieces until it
    is one token. An appended merge ranks last, so it never changes a word already whole.
    Qwen-Image's template needs none (its build is unchanged); the edit template does."""
    from tokenizers.models import BPE

    for word in words:
        while True:
            pieces = [t.value for t in BPE(vocab=dict(vocab), merges=list(merges)).tokenize(word)]
            if len(pieces) == 1:
                break
            vocab.setdefault(pieces[0] + pieces[1], len(vocab))
            merges.append((pieces[0], pieces[1]))


def qwen_tokenizer(out_dir: Path, prefix: str = TEMPLATE_PREFIX,
                   suffix: str = TEMPLATE_SUFFIX, drop: int = TEMPLATE_DROP,
                   vision: bool = False) -> Any:
    """Write the tiny Qwen2Tokenizer to `out_dir` and load it back (as the pipeline's
    from_pretrained will); checks the template's dropped part (`prefix`) is `drop`
    tokens (Qwen-Image's 34 by default). `vision`: Qwen2.5-VL's vision tokens are special
    tokens too (after the others, so the default build's ids are unchanged)."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = qwen_vocab(prefix + suffix)
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, model_max_length=32768,
                         errors="replace")
    specials = (IM_START, IM_END, *(VISION_TOKENS if vision else ()))
    tok.add_special_tokens({"additional_special_tokens": [
        AddedToken(token, special=True) for token in specials]})
    tok.chat_template = CHAT_TEMPLATE
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    loaded = Qwen2Tokenizer.from_pretrained(str(out_dir), local_files_only=True)
    count = len(loaded(prefix).input_ids)
    if count != drop:  # a guard on this builder, not a user error
        raise RuntimeError(f"tiny Qwen tokenizer makes {count} tokens of the template's "
                           f"system part, the real one {drop}")
    return loaded


def qwen_edit_tokenizer(out_dir: Path) -> Any:
    """The tiny tokenizer of Qwen-Image-Edit: the edit template's words, its 64-token
    system part, and the vision tokens."""
    return qwen_tokenizer(out_dir, EDIT_TEMPLATE_PREFIX, TEMPLATE_SUFFIX, EDIT_TEMPLATE_DROP,
                          vision=True)


def tiny_qwen_vl(tokenizer: Any, hidden: int, seed: int, layers: int = 1) -> Any:
    """A Qwen2_5_VLForConditionalGeneration for `tokenizer`'s vocabulary and special ids,
    with a `hidden`-wide, `layers`-deep text model (head_dim 16; multimodal rope sections
    2/3/3, summing to half of it) and a one-block 16-wide vision tower, random weights
    from `seed`; the tokenizer's vision tokens, where it has them, as the config's ids."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    heads = max(1, hidden // HEAD_DIM)
    vocab_size = len(tokenizer)
    ids = {"bos_token_id": None, "eos_token_id": tokenizer.convert_tokens_to_ids(IM_END),
           "pad_token_id": tokenizer.pad_token_id}
    vocab = tokenizer.get_vocab()
    # A tokenizer with the vision tokens (qwen_edit_tokenizer): the encoder finds its
    # image placeholders by these ids (the config's defaults are the real vocabulary's).
    vision = {key: vocab[token] for key, token in (
        ("image_token_id", IMAGE_PAD), ("video_token_id", VIDEO_PAD),
        ("vision_start_token_id", VISION_START), ("vision_end_token_id", VISION_END))
        if token in vocab}
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
        **vision,
    )
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval()
