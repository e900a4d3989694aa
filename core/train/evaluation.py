"""A fixed evaluation that tells whether the model learns the captions, not only the images.

A small fixed set of cached items, with noise and timesteps fixed once, is scored twice:
with each image's own caption (`loss`) and with captions rotated across the set
(`loss_shuffled`). Training that uses the text drives `loss` below `loss_shuffled`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from core.data.collate import collate
from core.train.batches import to_device

EVAL_SEED = 1234


@dataclasses.dataclass
class EvalSet:
    batches: list[dict[str, Any]]  # collated, own captions
    shuffled: list[dict[str, Any]]  # the same, with another item's caption embeddings
    noise: list[Any]
    timesteps: list[Any]


def _pick_items(datasets: list[Any], count: int) -> list[dict[str, Any]]:
    """`count` items spread evenly over each dataset (neighbours in file order often share
    a caption), taken round-robin over the datasets."""
    spreads = []
    for ds in datasets:
        n = len(ds)
        spreads.append([i * n // count for i in range(min(count, n))] if n else [])
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


def build_eval_set(family: Any, components: Any, datasets: list[Any], count: int,
                   batch_size: int) -> EvalSet | None:
    import torch

    items = _pick_items(datasets, count)
    if len(items) < 2:
        return None
    by_bucket: dict[tuple, list[dict[str, Any]]] = {}
    for item in items:
        by_bucket.setdefault(tuple(item["latents"].shape), []).append(item)
    generator = torch.Generator().manual_seed(EVAL_SEED)
    out = EvalSet([], [], [], [])
    rotated = {id(it): r for it, r in zip(items, _rotate_text(items), strict=True)}
    for group in by_bucket.values():
        for start in range(0, len(group), batch_size):
            chunk = group[start:start + batch_size]
            batch = collate(chunk)
            out.batches.append(batch)
            out.shuffled.append(collate([rotated[id(it)] for it in chunk]))
            latents = batch["latents"]
            out.noise.append(torch.randn(latents.shape, generator=generator))
            num_t = getattr(components.noise_scheduler.config, "num_train_timesteps", 1000)
            out.timesteps.append(torch.linspace(0.1, 0.9, len(chunk)) * num_t)
    return out


def evaluate(family: Any, components: Any, eval_set: EvalSet, device: Any,
             dtype: Any) -> dict[str, float]:
    """Mean loss with own and with rotated captions, at the fixed noise and timesteps."""
    import torch

    totals = {"loss": 0.0, "loss_shuffled": 0.0}
    count = 0
    with torch.no_grad():
        for batch, shuffled, noise, t in zip(eval_set.batches, eval_set.shuffled,
                                             eval_set.noise, eval_set.timesteps, strict=True):
            for key, data in (("loss", batch), ("loss_shuffled", shuffled)):
                data = to_device(data, device, dtype)
                sample = family.noise_and_target(components, data["latents"],
                                                 timesteps=_timesteps(components, t, device),
                                                 noise=noise.to(device, dtype))
                prediction = family.predict(components, sample, data, data)
                loss = family.loss(components, prediction.float(), sample)
                totals[key] += float(loss) * len(noise)
            count += len(noise)
    return {k: v / max(count, 1) for k, v in totals.items()}


def _timesteps(components: Any, fraction_times_t: Any, device: Any) -> Any:
    """Integer timesteps for DDPM families; flow families take the same values and map
    them to sigmas themselves."""
    return fraction_times_t.round().long().to(device)
