"""A tiny offline CLIP text side (tokenizer + encoder config) for the tiny models: no
download, deterministic, real classes.

A byte-level BPE vocabulary (the 256 GPT-2 byte symbols, their end-of-word `</w>` forms
and the two specials) covers every string, so a real `CLIPTokenizer` built from it
tokenizes any prompt without merges. A model may add whole `words` (the demo's base
does: "green" as one token, as in a real CLIP vocabulary, instead of five letters a tiny
encoder must compose); merges that build each word are appended, so every other string
still tokenizes, into letters and the words' prefixes. It is saved with `save_pretrained`
so the tiny diffusers folder reloads it with `from_pretrained(dir, local_files_only=True)`,
exactly like a real model's tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins GPT-2/CLIP use for raw bytes, in byte order."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    table = dict(zip(keep, chars, strict=True))
    return [chr(table[b]) for b in range(256)]


def clip_vocab(words: tuple[str, ...] = ()) -> dict[str, int]:
    """Byte symbols, their `</w>` forms, then BOS and EOS (514 entries), then what the
    merges for `words` produce."""
    symbols = byte_symbols()
    vocab: dict[str, int] = {}
    for s in symbols:
        vocab[s] = len(vocab)
    for s in symbols:
        vocab[s + "</w>"] = len(vocab)
    vocab[BOS_TOKEN] = len(vocab)
    vocab[EOS_TOKEN] = len(vocab)
    for left, right in word_merges(words):
        vocab.setdefault(left + right, len(vocab))
    return vocab


def _bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """BPE as CLIP applies it: merge the lowest-ranked adjacent pair until none is left."""
    parts = [*word[:-1], word[-1] + "</w>"]
    while len(parts) > 1:
        adjacent = zip(parts, parts[1:], strict=False)
        pairs = [(ranks[p], i) for i, p in enumerate(adjacent) if p in ranks]
        if not pairs:
            break
        _, i = min(pairs)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def word_merges(words: tuple[str, ...]) -> list[tuple[str, str]]:
    """Merges that make each word one token. Each new merge ranks after all earlier ones,
    so it never changes how an earlier word splits."""
    merges: list[tuple[str, str]] = []
    ranks: dict[tuple[str, str], int] = {}
    for word in words:
        while len(parts := _bpe(word, ranks)) > 1:
            ranks[(parts[0], parts[1])] = len(merges)
            merges.append((parts[0], parts[1]))
    return merges


def build_clip_tokenizer(out_dir: Path, model_max_length: int = 77,
                         pad_token: str = EOS_TOKEN, words: tuple[str, ...] = ()) -> None:
    """Write a CLIP tokenizer to `out_dir` (tokenizer folder of a diffusers model).

    `pad_token` is EOS for SD1.5-style tokenizers; SD2/SDXL's second tokenizer pads with
    "!" in the real models, which callers may pass here.
    """
    from transformers import CLIPTokenizer

    vocab = clip_vocab(words)
    # Without `words`, no merges: every word splits into byte symbols.
    merges = word_merges(words)
    tok = CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        model_max_length=model_max_length,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=pad_token,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))


def clip_tokenizer(out_dir: Path, pad_token: str = EOS_TOKEN,
                   words: tuple[str, ...] = ()) -> Any:
    """Write a CLIP tokenizer to `out_dir` and load it back, as a pipeline's tokenizer."""
    from transformers import CLIPTokenizer

    build_clip_tokenizer(out_dir, pad_token=pad_token, words=words)
    return CLIPTokenizer.from_pretrained(str(out_dir), local_files_only=True)


def tiny_clip_config(hidden_size: int = 32, hidden_act: str = "quick_gelu",
                     projection_dim: int = 32, layers: int = 3,
                     words: tuple[str, ...] = ()) -> Any:
    """A CLIPTextConfig matching the byte-level tokenizer's vocabulary and specials."""
    from transformers import CLIPTextConfig

    vocab = clip_vocab(words)
    return CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=77,
        hidden_act=hidden_act, projection_dim=projection_dim,
        bos_token_id=vocab[BOS_TOKEN], eos_token_id=vocab[EOS_TOKEN],
        pad_token_id=vocab[EOS_TOKEN],
    )
