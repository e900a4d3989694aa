"""train.token_routing's rules: the families that can route (ModelFamily.routing) and the
settings routing cannot serve, each refusal naming the key (core/models/routing.py does
the routing; the range 0 <= x < 1 is the field's own check)."""

from __future__ import annotations

from core.config.schema import Config
from core.models.registry import family_or_defaults
from core.problems import Problem, error

KEY = "train.token_routing"


def routing_problems(cfg: Config) -> list[Problem]:
    fraction = cfg.train.token_routing
    if not 0 < fraction < 1:  # off, or out of range (refused by the field's check)
        return []
    if family_or_defaults(cfg.model.family).routing is None:
        return [error(KEY, f"{fraction:g}: {cfg.model.family} declares no token routing "
                           "(only transformer families whose blocks can route tokens "
                           "around them do; UNet families never); set it to 0")]
    if cfg.launch.distributed == "fsdp":
        # Sharded blocks gather their weights in hooks of their own around each call,
        # which routing has not been tried under: refused rather than unproven.
        return [error(KEY, f"{fraction:g} with launch.distributed = \"fsdp\": routing "
                           "is not supported with sharded blocks; set it to 0 or use ddp")]
    return []
