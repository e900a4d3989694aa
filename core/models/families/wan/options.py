"""Wan's own config keys, merged into the schema by core/config/family_options.py: the
form shows them for model.family = "wan" only, and the check refuses them set on another
family. Data only (no torch): the schema imports this while core.config is built."""

from __future__ import annotations

from dataclasses import dataclass

from core.fields import _f

EXPERT_CHOICES = ("both", "high_noise", "low_noise")


@dataclass
class WanModelOptions:
    experts: str = _f("both", label="Experts to train", choices=EXPERT_CHOICES,
                      advanced=True,
                      help="Two-expert models (Wan 2.2 A14B: a high-noise transformer "
                           "above the model's boundary_ratio, a low-noise one below): both "
                           "trains a LoRA on each, every sample going to the expert of its "
                           "noise level; high_noise or low_noise trains that expert alone, "
                           "its noise levels drawn only from its range (the usual draw, "
                           "renormalised inside it). One-transformer models take only both.")
    offload_inactive_expert: str = _f(
        "auto", label="Offload the idle expert", choices=("auto", "on", "off"), advanced=True,
        help="Two-expert models (Wan 2.2 A14B): the expert a step does not use waits in "
             "host memory and is copied in when a step needs it, so one expert's weights "
             "are on the GPU, not both. auto: on when model.blocks_to_swap is above 0.")


OPTIONS = {"model": WanModelOptions}
