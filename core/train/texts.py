"""The text side of a training batch: the caption each sample trains on, and its
embeddings from the cache or from the text encoders at train time.

- Caption dropout (`train.caption_dropout`): a dropped sample trains on "". Cached
  datasets take the empty caption's cache entry (planned once, see core/cache/plan.py).
- Tag shuffling (`datasets.N.shuffle_tags`, `keep_tokens`) and a text-encoder LoRA
  (`train.text_encoder_lora`): the captions are encoded now, by the encoders that stay
  on the training device; with the LoRA, with gradients.

Which samples drop and how tags shuffle is drawn per sample from the seed, the
micro-step and the sample's slot in the global batch (core/data/tags.py), so a resume
replays it and processes never need to agree on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from core.config import Config
from core.data.tags import sample_caption, sample_rng

if TYPE_CHECKING:
    from core.models.base import Components, ModelFamily

# What encode_prompts returns, which an item's cached text entry also holds.
TEXT_KEYS = ("prompt_embeds", "prompt_mask", "pooled_prompt_embeds")


@dataclasses.dataclass
class TrainTexts:
    family: ModelFamily
    seed: int
    dropout: float
    shuffle: list[tuple[bool, int]]  # per dataset: (shuffle_tags, keep_tokens)
    at_train_time: list[bool]  # per dataset: encoded now rather than read from the cache
    empty: dict[str, Any] | None  # the cached empty caption's entry
    grad: bool  # a text-encoder LoRA trains: encode with gradients
    process_index: int

    @property
    def encoders_needed(self) -> bool:
        """Whether the text encoders must stay on the training device."""
        return any(self.at_train_time)

    def captions(self, dataset_index: int, captions: list[str], micro_step: int) -> list[str]:
        """The caption each sample of a micro-batch trains on."""
        shuffle, keep = self.shuffle[dataset_index]
        first = self.process_index * len(captions)  # slot in the global batch
        return [sample_caption(caption, sample_rng(self.seed, micro_step, first + j),
                               self.dropout, shuffle, keep)
                for j, caption in enumerate(captions)]

    def apply(self, components: Components, dataset_index: int, items: list[dict[str, Any]],
              micro_step: int) -> list[dict[str, Any]]:
        """The items with the caption and the text embeddings they train on."""
        if not self.dropout and not self.at_train_time[dataset_index]:
            return items  # the cached text, untouched: the common path stays as it was
        chosen = self.captions(dataset_index, [it["caption"] for it in items], micro_step)
        if self.at_train_time[dataset_index]:
            encoded = encode(self.family, components, chosen, self.grad)
        else:
            encoded = [self._cached_empty() if c == "" else _text_of(it)
                       for c, it in zip(chosen, items, strict=True)]
        return [{**it, **text, "caption": caption}
                for it, text, caption in zip(items, encoded, chosen, strict=True)]

    def unconditioned(self, components: Components, dataset_index: int,
                      items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The items with the empty caption's text (train.guidance_target_scale's
        unconditional prediction): the cached entry, or "" encoded now where the dataset
        encodes at train time."""
        if self.at_train_time[dataset_index]:
            empty = encode(self.family, components, [""])[0]
        else:
            empty = self._cached_empty()
        return [{**it, **empty, "caption": ""} for it in items]

    def _cached_empty(self) -> dict[str, Any]:
        if self.empty is None:  # the plan caches "" whenever dropout or the scale is on
            raise RuntimeError("the empty caption's cache entry is missing")
        return self.empty

    def fill(self, components: Components, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Items without cached text get their own caption encoded (eval: no dropout,
        no shuffling, no gradients)."""
        missing = [i for i, it in enumerate(items) if "prompt_embeds" not in it]
        if not missing:
            return items
        encoded = encode(self.family, components, [items[i]["caption"] for i in missing])
        out = list(items)
        for i, text in zip(missing, encoded, strict=True):
            out[i] = {**items[i], **text}
        return out


def _text_of(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item[k] for k in TEXT_KEYS if k in item}


def encode(family: ModelFamily, components: Components, captions: list[str],
           grad: bool = False) -> list[dict[str, Any]]:
    """Per-caption text dicts; the mask goes to the CPU, where collate builds the batch's
    mask (the embeddings stay where they are, with their graph when `grad`)."""
    out = family.encode_prompts(components, captions, grad=True) if grad else \
        family.encode_prompts(components, captions)
    if not grad:
        out = [{k: v.detach() for k, v in item.items()} for item in out]
    return [{**item, "prompt_mask": item["prompt_mask"].cpu()} for item in out]


def batch_encoder(family: ModelFamily, components: Components
                  ) -> Callable[[list[str]], dict[str, Any]]:
    """captions -> the batch's text keys (stacked), for re-encoding eval batches with
    the text encoders as trained so far."""
    import torch

    def run(captions: list[str]) -> dict[str, Any]:
        items = encode(family, components, captions)
        return {k: torch.stack([it[k] for it in items]) for k in TEXT_KEYS if k in items[0]}

    return run


def make_train_texts(cfg: Config, family: ModelFamily, at_train_time: list[bool],
                     empty: dict[str, Any] | None, process_index: int) -> TrainTexts:
    return TrainTexts(family=family, seed=cfg.train.seed, dropout=cfg.train.caption_dropout,
                      shuffle=[(ds.shuffle_tags, ds.keep_tokens) for ds in cfg.datasets],
                      at_train_time=at_train_time, empty=empty,
                      grad=cfg.train.text_encoder_lora, process_index=process_index)
