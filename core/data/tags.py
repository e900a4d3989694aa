"""What caption a training sample sees: tag shuffling and caption dropout.

Both are drawn per sample from a `random.Random` seeded by the run's seed, the micro-step
and the sample's slot in the global batch (`sample_rng`): a resumed run replays the same
choices (the sampler restores the micro-step), and every process draws its own samples'
choices without talking to the others. Pure python, no torch.
"""

from __future__ import annotations

import random
import re


def sample_rng(seed: int, micro_step: int, slot: int) -> random.Random:
    """The generator for one sample. A string seed is hashed with SHA-512 by `random`,
    independent of PYTHONHASHSEED, so every process and every resume agree."""
    return random.Random(f"caption:{seed}:{micro_step}:{slot}")


def flip_draw(seed: int, micro_step: int, slot: int) -> bool:
    """Whether a sample of a datasets.N.flip dataset trains on its mirror image: half the
    time, drawn as `sample_rng` draws captions, so a resume replays it."""
    return random.Random(f"flip:{seed}:{micro_step}:{slot}").random() < 0.5


_SIDES = re.compile(r"\b(left|right)\b", re.IGNORECASE)


def mirrored_captions(captions: list[str]) -> int:
    """How many captions name a side (left, right), which a mirror image swaps."""
    return sum(1 for caption in captions if _SIDES.search(caption))


def split_tags(caption: str) -> list[str]:
    """Comma-separated tags, stripped, empty ones left out."""
    return [tag.strip() for tag in caption.split(",") if tag.strip()]


def shuffle_tags(caption: str, keep_tokens: int, rng: random.Random) -> str:
    """The caption's tags in a new order, the first `keep_tokens` left in place (a trigger
    word, say), joined with ", " as kohya's trainer does."""
    tags = split_tags(caption)
    head, tail = tags[:keep_tokens], tags[keep_tokens:]
    rng.shuffle(tail)
    return ", ".join(head + tail)


def sample_caption(caption: str, rng: random.Random, dropout: float, shuffle: bool,
                   keep_tokens: int) -> str:
    """The caption one sample trains on: "" with probability `dropout`, else the
    caption, its tags shuffled when `shuffle`. The dropout draw comes first and always
    happens, so turning shuffling on or off does not change which samples drop."""
    drop = rng.random() < dropout
    if drop:
        return ""
    return shuffle_tags(caption, keep_tokens, rng) if shuffle else caption
