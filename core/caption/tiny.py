"""A tiny random BLIP captioner, built offline: `captioning.model = "tiny:blip"`.

It lets the Caption area (and `--stage caption`) be tried on a fresh machine with no
network: the demo preset uses it, the tests too. Its captions are random words from a
small vocabulary; for real captions use a real model (BLIP, Florence-2, ...).

`BlipForConditionalGeneration` from a small `BlipConfig`, with a `BlipProcessor` over a
BERT tokenizer whose vocab.txt is written here (BLIP uses a BERT tokenizer), and a
`BlipImageProcessor` at 32 px. It is saved as a folder that `AutoProcessor` and
`AutoModelForImageTextToText` load with `local_files_only=True`, like a real BLIP; the
workspace keeps it in models/tiny-blip, built once.

A random model is as likely to emit a special token as a word, and special tokens are
dropped when decoding, so the head's bias keeps it on words: every caption is non-empty.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from core.files import atomic_path, keep_first
from core.models.empty import MODEL_BUILD_LOCK

TINY_CAPTIONER = "tiny:blip"
DONE = ".built"  # written last: a folder without it is an interrupted build

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"]
WORDS = ["a", "photo", "of", "dog", "cat", "red", "blue", "circle", "square", "on",
         "the", "grass", "small", "big", "green", "picture"]
IMAGE_SIZE = 32


def build_tiny_blip(out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny BLIP folder to `out_dir` (created); returns it."""
    import torch
    from transformers import (
        BertTokenizer,
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        BlipProcessor,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = SPECIALS + WORDS
    vocab_file = out_dir / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    ids = {token: i for i, token in enumerate(vocab)}
    tokenizer = BertTokenizer(vocab=str(vocab_file), model_max_length=64,
                              bos_token="[DEC]")
    images = BlipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    BlipProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(out_dir)

    text = {"vocab_size": len(vocab), "hidden_size": 32, "encoder_hidden_size": 32,
            "intermediate_size": 64, "projection_dim": 32, "num_hidden_layers": 2,
            "num_attention_heads": 2, "max_position_embeddings": 64,
            "bos_token_id": ids["[DEC]"], "eos_token_id": ids["[SEP]"],
            "pad_token_id": ids["[PAD]"], "sep_token_id": ids["[SEP]"]}
    vision = {"hidden_size": 32, "intermediate_size": 64, "projection_dim": 32,
              "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": IMAGE_SIZE,
              "patch_size": 8}
    torch.manual_seed(seed)
    with MODEL_BUILD_LOCK:  # not while another thread builds on the meta device
        model = BlipForConditionalGeneration(BlipConfig(text_config=text, vision_config=vision,
                                                        projection_dim=32,
                                                        image_text_hidden_size=32))
    with torch.no_grad():  # words only (see the module docstring)
        bias = model.text_decoder.cls.predictions.bias
        bias[: len(SPECIALS)] = -1e4
    model.save_pretrained(out_dir)
    return out_dir


def is_tiny_captioner(value: str) -> bool:
    return value.strip() == TINY_CAPTIONER


def tiny_captioner_dir(workspace: Path) -> Path:
    return Path(workspace) / "models" / "tiny-blip"


def materialize_tiny_captioner(workspace: Path) -> Path:
    """The workspace's tiny BLIP folder, built (seconds, offline) if missing: into a
    temporary folder, renamed into place when complete."""
    final = tiny_captioner_dir(workspace)
    if (final / DONE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # keep_first: another process's complete build, finished meanwhile, stays
    with atomic_path(final, unique=(".tiny-blip.", ".tmp"), folder=True,
                     swap=keep_first) as tmp:
        build_tiny_blip(tmp)
        (tmp / DONE).write_text("tiny BLIP captioner\n", encoding="utf-8")
        if final.exists() and not (final / DONE).is_file():
            shutil.rmtree(final, ignore_errors=True)  # an interrupted build
    return final
