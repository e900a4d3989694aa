"""Wan 2.2's two experts as the shared code sees them (`family.experts`, an ExpertSpec of
core/models/capabilities.py): each expert's swappable blocks, the idle expert parked in
host memory (model.offload_inactive_expert) and how many experts a run trains, for the
memory estimate. No torch at import: the functions import the experts' module when they
are called on a loaded model."""

from __future__ import annotations

from typing import Any

from core.models.capabilities import ExpertSpec
from core.models.families.wan.expert_checks import BOTH
from core.models.modules import unwrap


def experts_in(denoiser: Any) -> Any:
    """The unwrapped denoiser when it is a two-expert model (WanExperts), else None."""
    from core.models.families.wan.experts import WanExperts

    model = unwrap(denoiser)
    return model if isinstance(model, WanExperts) else None


def stacks(denoiser: Any) -> list[list[Any]] | None:
    """One stack per expert of a two-expert model (each swaps its own blocks); None for
    one transformer, whose `block_lists` apply."""
    model = experts_in(denoiser)
    if model is None:
        return None
    return [list(expert.blocks) for expert in model.experts().values()]


def parked(denoiser: Any) -> list[Any]:
    """A two-expert model's low-noise expert waits on the host to start with."""
    model = experts_in(denoiser)
    return [] if model is None else [model.transformer_2]


def start_parking(denoiser: Any, device: Any, held_elsewhere: set[int]) -> None:
    """Each step brings in the experts its batch uses (WanExperts.forward) and puts the
    other back in host memory; a pipeline's call of one expert does the same."""
    model = experts_in(denoiser)
    if model is not None:
        model.take_turns(device, held_elsewhere)


def trained(cfg: Any, loaded: int) -> int:
    """Both experts with model.experts = "both", else the one it names."""
    return loaded if cfg.model.experts == BOTH else 1


EXPERTS = ExpertSpec(stacks=stacks, parked=parked, start_parking=start_parking,
                     trained=trained)
