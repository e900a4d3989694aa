"""Tiny random Qwen-Image-Edit (`tiny:qwen_image_edit`): a QwenImageEditPipeline folder
with tiny:qwen_image's transformer shape, a calibrated tiny causal VAE, a one-layer
Qwen2.5-VL whose vision tower runs on the control image, the tiny Qwen tokenizer built
for the edit template (its system part is 64 tokens, as the real tokenizer makes of it:
the pipeline drops that many hidden states) with the vision tokens, and a Qwen2VLProcessor
over it; Qwen-Image's scheduler config. `build_pipeline` with QwenImageEditPlusPipeline
(and zero_cond_t, as Qwen-Image-Edit-2511's transformer config sets) gives
tiny:qwen_image_edit_plus (tiny_plus/)."""

from __future__ import annotations

from pathlib import Path

from core.models.families.qwen_image.tiny import DIM, SCHEDULER
from core.models.families.qwen_image_edit.processor import new_processor
from core.models.tiny.causal_vae import Z_DIM, calibrate_causal_vae, tiny_causal_vae
from core.models.tiny.qwen import (
    CHAT_TEMPLATE,
    VL_IMAGE_PROCESSOR,
    qwen_edit_tokenizer,
    tiny_qwen_vl,
)

EDIT_PIPELINE = "QwenImageEditPipeline"
# 1: processor/ carries preprocessor_config.json and video_preprocessor_config.json, as
# the real folders do (core/models/tiny/materialize.py rebuilds older folders).
TINY_REVISION = 1


def build_pipeline(out_dir: Path, seed: int, pipeline: str = EDIT_PIPELINE,
                   zero_cond_t: bool = False) -> None:
    """Write a tiny random `pipeline` (QwenImageEditPipeline or QwenImageEditPlusPipeline)
    as a diffusers folder; the parts are drawn from seed .. seed + 2 as tiny:qwen_image's."""
    import diffusers
    import torch

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    # tiny:qwen_image's transformer (qwen_image/tiny.py); the real edit models keep
    # Qwen-Image's architecture, 2511 adds zero_cond_t (timestep 0 for the references).
    transformer = diffusers.QwenImageTransformer2DModel(
        patch_size=2, in_channels=4 * Z_DIM, out_channels=Z_DIM, num_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=DIM,
        guidance_embeds=False, axes_dims_rope=(4, 6, 6), zero_cond_t=zero_cond_t)
    vae = tiny_causal_vae("AutoencoderKLQwenImage", seed + 1)
    calibrate_causal_vae(vae, seed)
    tokenizer = qwen_edit_tokenizer(out_dir / "tokenizer")
    pipe = getattr(diffusers, pipeline)(
        transformer=transformer, vae=vae,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        text_encoder=tiny_qwen_vl(tokenizer, DIM, seed + 2), tokenizer=tokenizer,
        processor=new_processor(tokenizer, VL_IMAGE_PROCESSOR, CHAT_TEMPLATE))
    pipe.save_pretrained(str(out_dir), safe_serialization=True)


def build(out_dir: Path, seed: int = 0) -> None:
    """Write tiny:qwen_image_edit (QwenImageEditPipeline) as a diffusers folder."""
    build_pipeline(out_dir, seed)
