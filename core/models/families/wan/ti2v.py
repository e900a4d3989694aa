"""Wan 2.2 TI2V-5B (Wan-AI/Wan2.2-TI2V-5B-Diffusers) trained as text-to-video, exactly as
WanPipeline samples it (diffusers 0.42, pipeline_wan.py).

What differs from Wan 2.1 T2V, all read from the loaded folder, none from a config key:
- model_index.json sets `expand_timesteps` (the pipeline's switch, and how a TI2V model is
  recognised here). WanPipeline then gives the transformer one timestep per video token:
  `mask[0][0][:, ::2, ::2] * t`, flattened, [B, F' * h/2 * w/2] (the mask is ones over
  the latent grid, strided at the transformer's 1x2x2 patch), instead of one per sample.
  `token_timesteps` builds the same tensor from each sample's own t = sigma * 1000, at the
  transformer's configured patch size.
- the VAE is Wan 2.2's (z_dim 48, residual blocks, 2x2 pixel patches: 16x in space, 4x in
  time) with its own 48 latents_mean/latents_std; encode_causal_latents already reads
  z_dim and the statistics from the VAE's config, so latents are (z - mean) / std as the
  pipeline un-normalises them, [B, 48, F', H/16, W/16].
- the transformer takes and gives 48 channels.
The sigma draw, the noisy mix and the loss (MSE against noise - latents) are the family's.

Not here: the image-conditioned TI2V mode (WanImageToVideoPipeline with expand_timesteps:
the first latent frame is the image's clean latents with timestep 0 on its tokens). A
TI2V-5B folder names WanPipeline, and no config key selects image conditioning, so
image-to-video training of TI2V-5B is left out; a folder naming WanImageToVideoPipeline
with expand_timesteps is refused, as is a two-expert folder with it (no published model
has both, and WanExperts routes one timestep per sample).

Why a Components subclass: the flag must reach `predict` and the validation pipeline, and
Components carries no per-model extras; like i2v.WanI2VComponents, the subclass survives
dataclasses.replace (the validation's text-less copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.models.base import Components

EXPAND_TIMESTEPS = "expand_timesteps"  # WanPipeline's config key (model_index.json)


@dataclass
class WanTI2VComponents(Components):
    """A loaded Wan 2.2 TI2V-5B-shaped model: its pipeline sets expand_timesteps."""

    expand_timesteps: bool = True


def is_ti2v(c: Components) -> bool:
    return isinstance(c, WanTI2VComponents)


def expands_timesteps(pipe: Any, source: str) -> bool:
    """Whether the loaded pipeline gives per-token timesteps (its config's
    expand_timesteps); refuses the combinations this family does not train with them
    (see the module docstring)."""
    from diffusers import WanImageToVideoPipeline

    from core.models import loading

    if not pipe.config.get(EXPAND_TIMESTEPS, False):
        return False
    if isinstance(pipe, WanImageToVideoPipeline):
        raise loading.ModelLoadError(source, "is a Wan 2.2 TI2V image-to-video folder "
                                     "(WanImageToVideoPipeline with expand_timesteps), "
                                     "which this version does not train: TI2V-5B trains as "
                                     "text-to-video from its own folder "
                                     "(Wan-AI/Wan2.2-TI2V-5B-Diffusers, a WanPipeline)")
    if getattr(pipe, "transformer_2", None) is not None:
        raise loading.ModelLoadError(source, "is a two-expert Wan folder with per-token "
                                     "timesteps (expand_timesteps), which no published "
                                     "model is and this version does not train; use "
                                     "Wan-AI/Wan2.2-TI2V-5B-Diffusers or a Wan 2.2 A14B "
                                     "folder")
    return True


def ti2v_components(c: Components) -> WanTI2VComponents:
    """`c` as WanTI2VComponents (every field kept)."""
    fields = {k: getattr(c, k) for k in c.__dataclass_fields__}
    return WanTI2VComponents(**fields)


def token_timesteps(timesteps: Any, latents: Any, patch_size: Any) -> Any:
    """Per-token timesteps [B, seq_len] of latents [B, C, F', h, w] at per-sample
    `timesteps` [B], as WanPipeline.__call__ builds them with expand_timesteps: a float32
    mask of ones over the latent grid, strided at the patch's spatial sides (the pipeline
    writes `[:, ::2, ::2]` for Wan's 1x2x2 patch; every frame is a token row, as there),
    times t, flattened in the transformer's token order (frame, row, column). The
    pipeline gives all samples one t; here each row is its own sample's."""
    import torch

    b, _, frames, h, w = latents.shape
    ph, pw = (int(p) for p in list(patch_size)[-2:])
    mask = torch.ones(frames, h, w, dtype=torch.float32, device=latents.device)
    grid = mask[:, ::ph, ::pw].flatten()  # [seq_len]
    t = torch.as_tensor(timesteps, device=latents.device).reshape(-1).float()
    t = t.expand(b) if t.numel() == 1 else t
    return t[:, None] * grid[None, :]
