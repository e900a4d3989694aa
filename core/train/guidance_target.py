"""train.guidance_target_scale (issue 52 item 3): CFG-augmented targets for a
CFG-distilled base, as diffusion-pipe's notes on MiniMax-H3 describe them.

A CFG-distilled model's output D is a guided prediction, u + s·(c − u), with u the
unconditional and c the conditional prediction of the model it was distilled from.
Fitting D to the ordinary target (the noise, or the flow velocity) teaches it to stop
guiding: its samples wash out after a few hundred steps. Here the output is read back to
its un-guided part, (D + (s − 1)·u) / s, and that is what the ordinary target fits, with
u the frozen base's prediction for the empty caption on the same noisy input (one extra
no-grad forward with the adapter switched off, as output preservation does; a full
fine-tune has no adapter, so u is the model's own, as in diffusion-pipe). Equivalently,
D's own target is u + s·(target − u), the guided prediction, at 1/s² the loss.

A preserved dataset (datasets.N.preserve) keeps its target, the base's output, which is
already a guided prediction: its batches are not read back."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from core.data.collate import collate
from core.train.batches import to_device
from core.train.preserve import adapter_layers, adapters_off

if TYPE_CHECKING:
    from core.models.base import NoiseSample
    from core.train.setup import Setup


def unguided(prediction: Any, unconditional: Any, scale: float) -> Any:
    """The un-guided part of a prediction guided at `scale` by `unconditional`."""
    return (prediction + (scale - 1.0) * unconditional) / scale


def unconditional_prediction(setup: Setup, sample: NoiseSample, dataset_index: int,
                             items: list[dict[str, Any]]) -> Any:
    """The base's prediction on `sample` with every item's text the empty caption's (the
    adapter off where there is one; no graph kept)."""
    import torch

    comps, acc = setup.components, setup.accelerator
    empty = setup.texts.unconditioned(comps, dataset_index, items)
    batch = to_device(collate(empty), acc.device, setup.weight_dtype)
    off = adapters_off(comps.denoiser) if adapter_layers(comps.denoiser) \
        else contextlib.nullcontext()
    with torch.no_grad(), off, acc.autocast():
        return setup.family.predict(comps, sample, batch).detach().float()
