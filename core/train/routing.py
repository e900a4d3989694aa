"""train.token_routing in the trainer: the router put on the denoiser's block lists once
the adapter is on, and armed for each micro-batch's forward and backward only
(core/models/routing.py does the routing; core/config/routing.py refuses what it
cannot serve)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from core.config import Config
from core.models.blocks import denoiser_stacks
from core.models.modules import unwrap
from core.train.errors import TrainingError

if TYPE_CHECKING:
    from core.models.base import ModelFamily
    from core.models.routing import TokenRouter


def start_routing(family: ModelFamily, denoiser: Any, cfg: Config,
                  reporter: Any) -> TokenRouter | None:
    """The router of train.token_routing over the denoiser's stacks, or None when off;
    a `token_routing` event and a log line say which blocks it routes around."""
    fraction = cfg.train.token_routing
    if not fraction:
        return None
    stacks = denoiser_stacks(family, denoiser)
    if family.routing is None or not stacks:  # the check refuses this first
        raise TrainingError(f"train.token_routing = {fraction:g}: {family.name} declares no "
                            "token routing; set train.token_routing = 0")
    from core.models.routing import install

    router = install(family.routing, unwrap(denoiser), stacks, fraction)
    spans = [[span.start, span.stop] for span in router.spans]
    reporter.event("token_routing", fraction=fraction, blocks=spans,
                   of=[len(stack) for stack in stacks])
    where = ", ".join(f"blocks {a}-{b - 1} of {len(s)}" for (a, b), s in zip(spans, stacks,
                                                                             strict=True))
    reporter.say(f"train.token_routing = {fraction:g}: that share of the image tokens goes "
                 f"around {where} in training steps (eval and validation route none)")
    return router


def routed_step(router: TokenRouter | None, denoiser: Any) -> Any:
    """The context a micro-batch's forward and backward run in: routing armed while the
    denoiser is in train mode (nothing without a router)."""
    if router is None:
        return contextlib.nullcontext()
    return router.step(unwrap(denoiser).training)
