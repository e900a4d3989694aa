"""The fixed eval set: every picked image scored once, in batches no larger than training's.

Batches of 8 made the eval the run's memory peak on a GPU: a forward without gradients
over 8 images at 1024 px holds more than a training step over 1 with checkpointing
(Flux: 4.45 GiB of activations against 2.33), and the check's estimate counts the step.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from core.train.evaluation import build_eval_set


class Items:
    """A dataset of cached items: `count` 8x8 latents (two sizes: two buckets)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def load(self, index: int) -> dict[str, object]:
        side = 8 if index % 3 else 6
        return {"latents": torch.randn(4, side, side), "prompt_embeds": torch.randn(5, 16),
                "prompt_mask": torch.ones(5, dtype=torch.bool), "path": f"img{index}.png",
                "caption": f"caption {index}"}


COMPONENTS = SimpleNamespace(noise_scheduler=SimpleNamespace(
    config=SimpleNamespace(num_train_timesteps=1000)))


@pytest.mark.parametrize("batch_size", [1, 2, 3, 16])
def test_the_eval_scores_every_picked_image_once_in_training_sized_batches(batch_size):
    eval_set = build_eval_set(None, COMPONENTS, [Items(12)], count=8, batch_size=batch_size)

    sizes = [len(batch["paths"]) for batch in eval_set.batches]
    assert max(sizes) <= batch_size
    paths = [p for batch in eval_set.batches for p in batch["paths"]]
    assert sorted(paths) == sorted(f"img{i}.png" for i in (0, 1, 3, 4, 6, 7, 9, 10))
    assert [len(b["paths"]) for b in eval_set.shuffled] == sizes
    assert [len(noise) for noise in eval_set.noise] == sizes
    for batch, shuffled in zip(eval_set.batches, eval_set.shuffled, strict=True):
        assert batch["latents"].shape == shuffled["latents"].shape
        assert all(a != b for a, b in zip(batch["captions"], shuffled["captions"], strict=True))
