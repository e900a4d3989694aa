"""The loaded denoiser's repeated blocks, as the block swap, token routing and block
compilation take them (core/train/swapping.py, routing.py, compiling.py)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from core.models.modules import unwrap

if TYPE_CHECKING:
    from core.models.base import ModelFamily


def denoiser_stacks(family: ModelFamily, denoiser: Any) -> list[list[Any]]:
    """The denoiser's block stacks, one list of blocks (forward order) per transformer:
    one per expert where the family's experts give them (`experts.stacks`, a model with
    several denoisers), else the family's `block_lists` of the unwrapped denoiser. Empty
    when the family declares none (a UNet)."""
    if family.experts is not None:
        stacks = family.experts.stacks(denoiser)
        if stacks is not None:
            return stacks
    model = unwrap(denoiser)
    stack = [block for name in family.block_lists for block in blocks_at(model, name)]
    return [stack] if stack else []


def blocks_at(model: Any, name: str) -> Any:
    """The block list `name` of `block_lists` names in `model`: an attribute, or a dotted
    path through submodules (a ModuleDict's entry: FLUX.3's "mode_blocks.image")."""
    return functools.reduce(getattr, name.split("."), model)
