"""Each family's default training timestep law, pinned: the draws a family's own
noise_and_target makes (no timesteps given) on its real model's scheduler config
(core/models/families/<family>/full_size/scheduler), compared as a distribution (a KS statistic over
5000 draws), not by a median that uniform and logit-normal share.

test_reference_loss.py checks that each sampling scheme matches the diffusers scripts when
a test sets it; this file checks which scheme a family uses when nothing sets it.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import ks_distance

from core.models.base import Components
from core.models.full_size import full_size_dir
from core.models.registry import FAMILY_NAMES, FLOW_FAMILIES, get_family

DRAWS = 5000
RIGHT = 0.03  # the right law stays under this (see conftest.ks_distance)
WRONG = 0.08  # the other law, or another shift, is at least this far

# family -> (law of u, the static shift the family trains with). The flow laws follow each
# model's training script: logit-normal (the SD3 paper, diffusers' SD3/Flux scripts as the
# project runs them), uniform for Z-Image and Qwen-Image (their scripts' weighting "none");
# SD3 and Z-Image shift statically (3.0, 6.0), the others shift dynamically at inference
# and train unshifted. The UNet families draw integer timesteps uniformly.
DEFAULT_LAWS = {
    "sd15": ("uniform", 1.0), "sd2": ("uniform", 1.0), "sdxl": ("uniform", 1.0),
    "sd3": ("logit_normal", 3.0), "flux": ("logit_normal", 1.0),
    "flux_kontext": ("logit_normal", 1.0),
    "flux2": ("logit_normal", 1.0), "chroma": ("logit_normal", 1.0),
    "z_image": ("uniform", 6.0), "qwen_image": ("uniform", 1.0),
    "qwen_image_edit": ("uniform", 1.0), "wan": ("uniform", 3.0),
    # Krea 2: its reference trainer draws sigmas uniformly from the unshifted table
    "krea2": ("uniform", 1.0),
    # ERNIE-Image: uniform under its scheduler's static shift, as its pipeline samples
    "ernie_image": ("uniform", 3.0),
    # FLUX.3: no training script; logit-normal at its pipeline's constant shift (6.93)
    "flux3": ("logit_normal", 6.93),
    # Qwen-Image 2.1: no reference trainer; the Qwen-Image trainer's draw, unshifted
    "qwen_image21": ("uniform", 1.0),
    # Anima: its reference trainer (diffusion-pipe) draws logit-normal, unshifted; the
    # scheduler's static shift 3 is the sampler's
    "anima": ("logit_normal", 1.0),
    "hunyuan_video15": ("uniform", 5.0),  # its scheduler's static shift, as Wan's
    # LTX-2 shifts by its video token count as its pipeline does: exp(mu) at the 2x2
    # latents drawn here (4 tokens), mu linear from 0.95 at 1024 tokens to 2.05 at 4096
    "ltx2": ("logit_normal", math.exp(0.95 + (2.05 - 0.95) * (4 - 1024) / (4096 - 1024))),
    # Ideogram 4's resolution-aware logit-normal (std 1.5, mean 0.5 * log(pixels / 512^2)):
    # a mean mu is a shift of exp(mu), here at the 32 x 32 pixels of 2x2 packed latents
    "ideogram4": ("logit_normal", (32 * 32 / 512 ** 2) ** 0.5, 1.5),
}
OTHER = {"uniform": "logit_normal", "logit_normal": "uniform"}


def test_every_family_has_its_law_pinned() -> None:
    assert set(DEFAULT_LAWS) == set(FAMILY_NAMES)


def scheduler_components(family: str) -> Components:
    """Components holding only the real model's noise scheduler (all a draw reads)."""
    import diffusers

    folder = full_size_dir(family) / "scheduler"
    config = json.loads((folder / "scheduler_config.json").read_text(encoding="utf-8"))
    scheduler = getattr(diffusers, config["_class_name"]).from_pretrained(str(folder))
    return Components(family=family, source=str(folder), fingerprint="", vae=None,
                      denoiser=None, text_encoders=[], tokenizers=[], noise_scheduler=scheduler)


def drawn_sigmas(family: str) -> torch.Tensor:
    """DRAWS training noise levels on a 0..1 scale, drawn by the family as the trainer
    draws them (noise_and_target without timesteps)."""
    fam = get_family(family)
    c = scheduler_components(family)
    sample = fam.noise_and_target(c, torch.zeros(DRAWS, 1, 2, 2),
                                  generator=torch.Generator().manual_seed(0))
    steps = int(c.noise_scheduler.config.num_train_timesteps)
    t = sample.timesteps.double()
    # UNet families draw integers 0..steps-1: the middle of each step's interval.
    return t / steps if family in FLOW_FAMILIES else (t + 0.5) / steps


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_default_timestep_law_is_the_familys(family: str) -> None:
    law, shift, *spread = DEFAULT_LAWS[family]
    std = spread[0] if spread else 1.0  # the logit-normal's std, where not 1
    sigmas = drawn_sigmas(family)
    assert ks_distance(sigmas, law, shift, std) < RIGHT, (law, shift)
    if spread:  # at a shift this far from 1 the two laws crowd near 0 alike: tell the std
        assert ks_distance(sigmas, law, shift) > WRONG
    else:
        assert ks_distance(sigmas, OTHER[law], shift) > WRONG
    if shift != 1.0:
        assert ks_distance(sigmas, law, 1.0, std) > WRONG  # the shift is applied
