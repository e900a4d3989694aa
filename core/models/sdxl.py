"""Stable Diffusion XL: two CLIP text encoders (penultimate hidden states concatenated),
the second one's pooled projection, and size/crop ids ("micro-conditioning").

Per item, `extra` may carry "original_size" (h, w), "crop_top_left" (top, left) and
"target_size" (h, w) in pixels, as the cache/collate records them; missing ones default
to the latents' pixel size and (0, 0), which is what inference uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models import common
from core.models.base import Components, NoiseSample
from core.models.sd15 import StableDiffusionFamily, tiny_clip_config
from core.models.tokenizers import build_clip_tokenizer


def time_ids(original_size: Any, crop_top_left: Any, target_size: Any) -> Any:
    """[B, 6] float tensor (orig_h, orig_w, crop_top, crop_left, target_h, target_w)."""
    import torch

    parts = [torch.as_tensor(x, dtype=torch.float32).reshape(-1, 2)
             for x in (original_size, crop_top_left, target_size)]
    b = max(p.shape[0] for p in parts)
    return torch.cat([p.expand(b, 2) for p in parts], dim=1)


class StableDiffusionXLFamily(StableDiffusionFamily):
    name = "sdxl"
    prediction = "epsilon"
    text_encoder_count = 2
    pipeline_class_name = "StableDiffusionXLPipeline"
    default_resolution = 1024
    vae_scaling_factor = 0.13025

    # ------------------------------------------------------------ tiny model

    def tiny_scheduler(self) -> Any:
        from diffusers import EulerDiscreteScheduler

        return EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012,
                                      beta_schedule="scaled_linear", num_train_timesteps=1000,
                                      steps_offset=1, timestep_spacing="leading",
                                      prediction_type=self.prediction)

    def tiny_unet_extra(self) -> dict[str, Any]:
        # cross_attention_dim = 32 + 32 (both encoders' hidden sizes, concatenated);
        # the add embedding takes 6 time ids x 8 plus the 32-wide pooled projection.
        return {"cross_attention_dim": 64, "use_linear_projection": True,
                "attention_head_dim": (2, 4), "addition_embed_type": "text_time",
                "addition_time_embed_dim": 8, "projection_class_embeddings_input_dim": 80}

    def tiny_components(self, out_dir: Path, seed: int) -> dict[str, Any]:
        import torch
        from transformers import CLIPTextModelWithProjection, CLIPTokenizer

        parts = super().tiny_components(out_dir, seed)
        torch.manual_seed(seed + 3)
        parts["text_encoder_2"] = CLIPTextModelWithProjection(
            tiny_clip_config(hidden_act="gelu", projection_dim=32))
        build_clip_tokenizer(out_dir / "tokenizer_2", pad_token="!")
        parts["tokenizer_2"] = CLIPTokenizer.from_pretrained(str(out_dir / "tokenizer_2"),
                                                             local_files_only=True)
        for key in ("safety_checker", "requires_safety_checker"):
            parts.pop(key)
        parts["add_watermarker"] = False
        return parts

    # ------------------------------------------------------------ loading

    def _load_pretrained(self, path: str, kind: common.SourceKind, dtype: Any) -> Components:
        from transformers import CLIPTextModelWithProjection, CLIPTokenizer

        c = super()._load_pretrained(path, kind, dtype)
        load = common.load_component
        c.text_encoders.append(load(CLIPTextModelWithProjection, path, kind, "text_encoder_2",
                                    dtype))
        c.tokenizers.append(load(CLIPTokenizer, path, kind, "tokenizer_2"))
        return c

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str,
                                  scheduler: Any) -> Components:
        c = super()._components_from_pipeline(pipe, source, fp, scheduler)
        c.text_encoders.append(pipe.text_encoder_2)
        c.tokenizers.append(pipe.tokenizer_2)
        return c

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """prompt_embeds [77, D1+D2] (penultimate layers), pooled_prompt_embeds [P],
        prompt_mask [77] from the first tokenizer (both split text the same way)."""
        import torch

        hidden, mask, pooled = [], None, None
        for enc, tokenizer in zip(c.text_encoders, c.tokenizers, strict=True):
            tok = self._tokenize(tokenizer, prompts)
            mask = tok.attention_mask.bool() if mask is None else mask
            with torch.no_grad():
                out = enc(tok.input_ids.to(enc.device), output_hidden_states=True)
            hidden.append(out.hidden_states[-2])
            pooled = out[0]  # the last encoder's text_embeds (projection)
        embeds = torch.cat([h.to(hidden[-1].dtype) for h in hidden], dim=-1)
        return [{"prompt_embeds": embeds[i], "pooled_prompt_embeds": pooled[i],
                 "prompt_mask": mask[i]} for i in range(len(prompts))]

    # ------------------------------------------------------------ training

    def _unet_kwargs(self, c: Components, sample: NoiseSample, text: dict[str, Any],
                     extra: dict[str, Any] | None) -> dict[str, Any]:
        extra = extra or {}
        if "time_ids" in extra:
            ids = extra["time_ids"]
        else:
            h, w = (s * self._vae_scale(c) for s in sample.noisy.shape[-2:])
            ids = time_ids(extra.get("original_size", (h, w)),
                           extra.get("crop_top_left", (0, 0)),
                           extra.get("target_size", (h, w)))
        dtype = common.unwrap(c.denoiser).dtype
        b = sample.noisy.shape[0]
        ids = ids.to(sample.noisy.device, dtype).expand(b, 6)
        pooled = text["pooled_prompt_embeds"].to(sample.noisy.device, dtype)
        return {"added_cond_kwargs": {"text_embeds": pooled, "time_ids": ids}}

    @staticmethod
    def _vae_scale(c: Components) -> int:
        return 2 ** (len(c.vae.config.block_out_channels) - 1)

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        from diffusers import StableDiffusionXLPipeline

        pipe = StableDiffusionXLPipeline(
            vae=c.vae, text_encoder=c.text_encoders[0], text_encoder_2=c.text_encoders[1],
            tokenizer=c.tokenizers[0], tokenizer_2=c.tokenizers[1],
            unet=common.unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            add_watermarker=False)
        pipe.set_progress_bar_config(disable=True)
        return pipe


FAMILY = StableDiffusionXLFamily()
