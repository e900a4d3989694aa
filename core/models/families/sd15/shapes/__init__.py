"""`tiny:sd15-shapes`: the demo's base model. The tiny SD1.5 architecture with trained
weights: an autoencoder that reconstructs the synthetic shapes, a UNet and tiny CLIP
text encoder that draw circles and squares in red, green and blue (and know no
triangles, nor yellow).

weights.safetensors beside this file holds the three parts in fp16 (about 3.5 MB); it is
made by pretrain.py in this folder, whose settings and seeds are in the file's metadata
(`safetensors` `metadata()`). `build` assembles a diffusers folder from it, as the tiny
random builds do, so the trainer loads it like any model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WEIGHTS = Path(__file__).with_name("weights.safetensors")
PARTS = ("vae", "unet", "text_encoder")
# Whole-word tokens of the demo's captions, as a real CLIP vocabulary has them: spelled
# out letter by letter, a 3-layer encoder mixed "green" up with "red" (the letters they
# share) and the base drew green prompts red. Any other text still tokenizes.
WORDS = ("red", "green", "blue", "yellow", "circle", "square", "triangle", "on",
         "white", "black", "background")


def load_weights(path: Path = WEIGHTS) -> tuple[dict[str, dict], dict[str, str]]:
    """The committed state dicts by part, and the file's metadata."""
    from safetensors import safe_open

    state: dict[str, dict] = {}
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        for key in f.keys():
            part, name = key.split(".", 1)
            state.setdefault(part, {})[name] = f.get_tensor(key)
    return state, metadata


def zero_snr_scheduler() -> Any:
    """SD1.5's betas rescaled to zero terminal SNR, v-prediction, trailing timesteps
    (Lin et al. 2024, "Common Diffusion Noise Schedules and Sample Steps are Flawed").
    With SD's own schedule the last step keeps a trace of the image, so the base learned
    to read an image's colour off the starting noise and drew whatever colour the seed
    suggested; at zero SNR the prompt is all it has to go by."""
    from diffusers import DDIMScheduler

    return DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                         num_train_timesteps=1000, clip_sample=False, set_alpha_to_one=False,
                         steps_offset=1, prediction_type="v_prediction",
                         rescale_betas_zero_snr=True, timestep_spacing="trailing")


def build(out_dir: Path, seed: int = 0) -> None:
    """Write the trained tiny SD1.5 as a diffusers folder (fp32, as the random builds)."""
    import torch
    from diffusers import StableDiffusionPipeline

    from core.models.tiny.unet import SD_VAE_SCALING, unet_parts
    from core.models.tiny.vae import tiny_vae

    parts = unet_parts(out_dir, seed, zero_snr_scheduler, words=WORDS)
    state, metadata = load_weights(WEIGHTS)
    settings = json.loads(metadata["settings"])
    parts["vae"] = tiny_vae(4, SD_VAE_SCALING, norm_groups=settings["vae_norm_groups"])
    for part in PARTS:
        module = parts[part]
        weights = {k: v.to(torch.float32) for k, v in state[part].items()}
        module.load_state_dict(weights, strict=True)
    parts["vae"].register_to_config(scaling_factor=float(metadata["vae_scaling_factor"]))
    pipe = StableDiffusionPipeline(**parts, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(str(out_dir), safe_serialization=True)
