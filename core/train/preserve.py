"""Output preservation (datasets.N.preserve = "base", issue 52 item 4): a preserved
dataset's target is the frozen base's own prediction on the same noisy input, computed by
one extra no-grad forward with the denoiser's adapter layers switched off, then on again
for the trained forward. kohya's diff_output_preservation, ai-toolkit's DOP, OneTrainer's
prior prediction: a LoRA then leaves prompts without its trigger as the base made them.

The switch is peft's own per layer (the flag BaseTunerLayer.disable_adapters reads), so
it covers every adapter kind (lora, dora, lokr, loha) and every wrapper around the
denoiser (accelerate's, Wan's two experts); the forward is the model's ordinary one, so
swapped blocks (model.blocks_to_swap) stream in for it as for the trained forward. Token
routing (train.token_routing) draws routes only in forwards with gradients, so the base
forward runs every token through every block and leaves the trained forward's draw as it
would be without it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.models.base import NoiseSample
    from core.train.setup import Setup


def adapter_layers(model: Any) -> list[Any]:
    """The peft adapter layers in `model` (of every kind)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextlib.contextmanager
def adapters_off(model: Any) -> Iterator[None]:
    """`model` with its adapter layers switched off, each restored to its own state after."""
    layers = adapter_layers(model)
    if not layers:
        raise ValueError("datasets.N.preserve needs an adapter to switch off; the denoiser "
                         "has none (train.method = \"full\"?)")
    # The flag peft's layers read in forward (BaseTunerLayer.disable_adapters), set
    # directly: enable_adapters() would also reset requires_grad on every adapter weight
    # each step, which DDP's hooks and the frozen parts of a run should not see.
    was_off = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, off in zip(layers, was_off, strict=True):
            layer._disable_adapters = off


def base_prediction(setup: Setup, sample: NoiseSample, batch: dict[str, Any]) -> Any:
    """The frozen base's prediction on `sample` (the adapter off, no graph kept)."""
    import torch

    comps, acc = setup.components, setup.accelerator
    with torch.no_grad(), adapters_off(comps.denoiser), acc.autocast():
        return setup.family.predict(comps, sample, batch).detach().float()
