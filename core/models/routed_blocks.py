"""The block list class train.token_routing gives the denoiser's stacks (core/models/
routing.py says how routing works). A module of its own because it subclasses torch's
ModuleList, and the routing module is imported with the families, before torch is; a
class at module level (not made in a function) keeps the denoiser copyable and
picklable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class RoutedBlocks(torch.nn.ModuleList):
    """A ModuleList whose iteration, while its router is armed, yields the routed
    range's blocks wrapped (TokenRouter.wrap); indexing, `modules()` and the state dict
    are a ModuleList's, so names, hooks and compiled blocks are untouched."""

    def __iter__(self) -> Iterator[Any]:
        blocks = list(super().__iter__())
        routing = self.__dict__.get("_routing")
        if routing is None or not routing[0].armed:
            return iter(blocks)
        router, stack, offset = routing
        return iter(router.wrap(stack, offset, blocks))
