"""The tiny Stable Diffusion UNet and the parts every tiny SD-UNet model has (sd15, sd2 and
sdxl's tiny builds change the scheduler, the UNet's extra settings and the text side).

Each part is drawn after its own `torch.manual_seed(seed + k)`, so a build is the same
bytes every time and adding a part never changes the others.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.models.tiny.clip import EOS_TOKEN, clip_tokenizer, tiny_clip_config
from core.models.tiny.vae import calibrate_tiny_vae, tiny_vae

SD_VAE_SCALING = 0.18215  # the real SD1.5/SD2 VAE's, before calibration


def tiny_unet(**extra: Any) -> Any:
    """The SD UNet at its smallest; `extra` overrides or adds UNet2DConditionModel args."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        **{"cross_attention_dim": 32, **extra},
    )


def unet_parts(out_dir: Path, seed: int, scheduler: Callable[[], Any], *,
               unet_extra: dict[str, Any] | None = None, vae_scaling: float = SD_VAE_SCALING,
               clip_act: str = "quick_gelu", pad_token: str = EOS_TOKEN,
               words: tuple[str, ...] = ()) -> dict[str, Any]:
    """The pipeline arguments every SD-UNet tiny model has: unet, vae, text_encoder,
    tokenizer (written to out_dir/tokenizer first; `words` become single tokens) and
    scheduler."""
    import torch
    from transformers import CLIPTextModel

    torch.manual_seed(seed)
    unet = tiny_unet(**(unet_extra or {}))
    torch.manual_seed(seed + 1)
    vae = tiny_vae(4, vae_scaling)
    calibrate_tiny_vae(vae, seed)
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(tiny_clip_config(hidden_act=clip_act, words=words))
    tokenizer = clip_tokenizer(Path(out_dir) / "tokenizer", pad_token=pad_token, words=words)
    return {"vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer, "unet": unet,
            "scheduler": scheduler()}
