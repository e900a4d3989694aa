"""A fixed evaluation that tells whether the model learns the captions, not only the images.

A small fixed set of cached items, with noise and timesteps fixed once, is scored twice:
with each image's own caption (`loss`) and with captions rotated across the set
(`loss_shuffled`). Training that uses the text drives `loss` below `loss_shuffled`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from core.data.collate import collate
from core.train.batches import to_device

if TYPE_CHECKING:
    from core.models.base import Components, ModelFamily

EVAL_SEED = 1234


EVAL_FRACTIONS = (0.2, 0.4, 0.6, 0.8)  # of the schedule; every item is scored at each


@dataclasses.dataclass
class EvalSet:
    batches: list[dict[str, Any]]  # collated, own captions
    shuffled: list[dict[str, Any]]  # the same, with another item's caption embeddings
    noise: list[Any]
    timesteps: list[int]  # shared by every batch


def _pick_items(datasets: list[Any], count: int) -> list[dict[str, Any]]:
    """`count` items spread evenly over each dataset (neighbours in file order often share
    a caption), taken round-robin over the datasets."""
    spreads = []
    for ds in datasets:
        n = len(ds)
        take = min(count, n)  # a dataset smaller than `count` gives each item once
        spreads.append([i * n // take for i in range(take)])
    picked = []
    for rank in range(count):
        for ds, indices in zip(datasets, spreads, strict=True):
            if rank < len(indices) and len(picked) < count:
                picked.append(ds.load(indices[rank]))
    return picked


def _rotate_text(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each item gets the text of the next item whose caption differs from its own."""
    text_keys = ("prompt_embeds", "prompt_mask", "pooled_prompt_embeds", "caption")
    out = []
    for i, item in enumerate(items):
        others = [items[(i + k) % len(items)] for k in range(1, len(items))]
        other = next((o for o in others if o["caption"] != item["caption"]), others[0])
        out.append({**item, **{k: other[k] for k in text_keys if k in other}})
    return out


def build_eval_set(family: ModelFamily, components: Components, datasets: list[Any], count: int,
                   batch_size: int, fill_text: Callable[[list[dict[str, Any]]],
                                                        list[dict[str, Any]]] | None = None
                   ) -> EvalSet | None:
    """The eval set, in batches of at most `batch_size` items (the training batch): a
    forward without gradients at that batch holds less than the training step, so the
    eval never needs more GPU memory than training does. Batches of 8 did: on Flux at
    1024 px, 4.45 GiB of activations against the training step's 2.33 (bench/activations.py's
    fake tensors), memory the check's estimate does not count.
    fill_text: gives items without cached text (encoded at train time) their own
    caption's embeddings."""
    import torch

    items = _pick_items(datasets, count)
    if fill_text is not None:
        items = fill_text(items)
    if len(items) < 2:
        return None
    by_bucket: dict[tuple, list[dict[str, Any]]] = {}
    for item in items:
        by_bucket.setdefault(tuple(item["latents"].shape), []).append(item)
    generator = torch.Generator().manual_seed(EVAL_SEED)
    num_t = getattr(components.noise_scheduler.config, "num_train_timesteps", 1000)
    out = EvalSet([], [], [], [round(f * num_t) for f in EVAL_FRACTIONS])
    rotated = {id(it): r for it, r in zip(items, _rotate_text(items), strict=True)}
    for group in by_bucket.values():
        for start in range(0, len(group), batch_size):
            chunk = group[start:start + batch_size]
            batch = collate(chunk)
            out.batches.append(batch)
            out.shuffled.append(collate([rotated[id(it)] for it in chunk]))
            out.noise.append(torch.randn(batch["latents"].shape, generator=generator))
    return out


def _loss_at(family: ModelFamily, components: Components, data: dict[str, Any], noise: Any, t: int,
             device: Any) -> float:
    import torch

    timesteps = torch.full((len(noise),), t, dtype=torch.long, device=device)
    sample = family.noise_and_target(components, data["latents"], timesteps=timesteps,
                                     noise=noise.to(device, data["latents"].dtype))
    prediction = family.predict(components, sample, data)
    return float(family.loss(components, prediction.float(), sample))


def evaluate(family: ModelFamily, components: Components, eval_set: EvalSet, device: Any,
             dtype: Any, text: Callable[[list[str]], dict[str, Any]] | None = None
             ) -> dict[str, Any]:
    """Mean loss with own and with rotated captions at fixed noise and timesteps, overall
    and per timestep (`by_t`: {t: [loss, loss_shuffled]}), weighted by batch size.
    text: captions -> batch text keys, to re-encode every batch's captions with the text
    encoders as they are now (a text-encoder LoRA trains them)."""
    import torch

    by_t = {t: [0.0, 0.0] for t in eval_set.timesteps}
    count = 0
    with torch.no_grad():
        for batch, shuffled, noise in zip(eval_set.batches, eval_set.shuffled, eval_set.noise,
                                          strict=True):
            if text is not None:
                batch = {**batch, **text(batch["captions"])}
                shuffled = {**shuffled, **text(shuffled["captions"])}
            own, other = to_device(batch, device, dtype), to_device(shuffled, device, dtype)
            for t in eval_set.timesteps:
                by_t[t][0] += _loss_at(family, components, own, noise, t, device) * len(noise)
                by_t[t][1] += _loss_at(family, components, other, noise, t, device) * len(noise)
            count += len(noise)
    by_t = {t: [v / count for v in pair] for t, pair in by_t.items()}
    return {"loss": sum(p[0] for p in by_t.values()) / len(by_t),
            "loss_shuffled": sum(p[1] for p in by_t.values()) / len(by_t),
            "by_t": {str(t): [round(a, 6), round(b, 6)] for t, (a, b) in by_t.items()}}
