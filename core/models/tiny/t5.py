"""A tiny offline T5 (tokenizer + encoder) for the SD3, Flux, Chroma and Wan tiny models.

Real SD3/Flux use T5-XXL's SentencePiece tokenizer; here a Unigram vocabulary of
single characters (with and without the "▁" word-start marker) covers every ASCII prompt
without merges, and anything else maps to <unk>. Both parts are real transformers
classes saved with `save_pretrained`, so the diffusers folder reloads them exactly like a
real model's `tokenizer_3`/`text_encoder_3` (SD3) or `tokenizer_2`/`text_encoder_2` (Flux).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

# T5's fixed special ids: pad 0 (also the decoder start), eos 1, unk 2.
SPECIALS = ["<pad>", "</s>", "<unk>"]
WORD_START = "▁"
CHARS = string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation


def t5_vocab() -> list[tuple[str, float]]:
    """(piece, log-probability) pairs. Word-start pieces score higher than bare characters
    so "▁r" wins over "▁" + "r", keeping one token per character."""
    pieces = [(s, 0.0) for s in SPECIALS] + [(WORD_START, -6.0)]
    pieces += [(WORD_START + c, -4.0) for c in CHARS]
    pieces += [(c, -5.0) for c in CHARS]
    return pieces


def build_t5_tokenizer(out_dir: Path, model_max_length: int = 512) -> int:
    """Write a T5 tokenizer to `out_dir`; returns its vocabulary size."""
    from transformers import T5Tokenizer

    tok = T5Tokenizer(vocab=t5_vocab(), extra_ids=0, model_max_length=model_max_length)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return len(tok)


def t5_tokenizer(out_dir: Path) -> tuple[Any, int]:
    """Write a T5 tokenizer to `out_dir` and load it back as the fast class the pipelines
    use; returns it and its vocabulary size (for the encoder)."""
    from transformers import T5TokenizerFast

    vocab_size = build_t5_tokenizer(out_dir)
    return T5TokenizerFast.from_pretrained(str(out_dir), local_files_only=True), vocab_size


def tiny_t5_encoder(vocab_size: int, d_model: int, seed: int, umt5: bool = False) -> Any:
    """A one-layer T5EncoderModel with random weights drawn from `seed`; with `umt5`, a
    UMT5EncoderModel (Wan's text encoder: T5 v1.1 with per-layer relative position
    biases) of the same sizes."""
    import torch
    import transformers

    kind = "UMT5" if umt5 else "T5"
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=8,
        d_ff=2 * d_model,
        num_layers=1,
        num_heads=max(1, d_model // 16),
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        dropout_rate=0.0,
        feed_forward_proj="gated-gelu",  # T5 v1.1, as in T5-XXL
        is_encoder_decoder=False,
        use_cache=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(seed)
    return getattr(transformers, f"{kind}EncoderModel")(config).eval()
