"""Stable Diffusion XL: two CLIP text encoders (penultimate hidden states concatenated),
the second one's pooled projection, and size/crop ids ("micro-conditioning").

Per item, the batch may carry "original_size" (h, w), "crop_top_left" (top, left) and
"target_size" (h, w) in pixels, as the cache/collate records them; missing ones default
to the latents' pixel size and (0, 0), which is what inference uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from core.models import loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import SingleFileSpec
from core.models.modules import unwrap
from core.models.stable_diffusion import StableDiffusionFamily


def time_ids(original_size: Any, crop_top_left: Any, target_size: Any) -> Any:
    """[B, 6] float tensor (orig_h, orig_w, crop_top, crop_left, target_h, target_w)."""
    import torch

    parts = [torch.as_tensor(x, dtype=torch.float32).reshape(-1, 2)
             for x in (original_size, crop_top_left, target_size)]
    b = max(p.shape[0] for p in parts)
    return torch.cat([p.expand(b, 2) for p in parts], dim=1)


class StableDiffusionXLFamily(StableDiffusionFamily):
    name = "sdxl"
    # Original-format single files and diffusers folders (core/models/loading.py).
    # before sd15/sd2: SDXL also has the SD UNet keys
    single_file = SingleFileSpec(markers=("conditioner.embedders.1",), rank=70,
                                 checkpoint_text_encoders=(
        ("text_encoder", "conditioner.embedders.0.transformer.", "clip"),
        ("text_encoder_2", "conditioner.embedders.1.model.", "open_clip")))
    pipeline_prefix = "StableDiffusionXL"
    prediction = "epsilon"
    # the shared scheduler; OpenCLIP's tokenizer pads with "!"
    random = dataclasses.replace(StableDiffusionFamily.random,
                                 bang_padded_tokenizers=("tokenizer_2",))
    text_encoder_count = 2
    pipeline_class_name = "StableDiffusionXLPipeline"

    # ------------------------------------------------------------ loading

    def _load_pretrained(self, path: str, kind: loading.SourceKind, dtype: Any) -> Components:
        from transformers import CLIPTextModelWithProjection, CLIPTokenizer

        c = super()._load_pretrained(path, kind, dtype)
        load = loading.load_component
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

    def encode_prompts(self, c: Components, prompts: list[str],
                       grad: bool = False) -> list[dict[str, Any]]:
        """prompt_embeds [77, D1+D2] (penultimate layers), pooled_prompt_embeds [P],
        prompt_mask [77] from the first tokenizer (both split text the same way).
        grad: keep the graph, for a text-encoder LoRA (see sd15)."""
        import torch

        hidden, mask, pooled = [], None, None
        for enc, tokenizer in zip(c.text_encoders, c.tokenizers, strict=True):
            tok = self._tokenize(tokenizer, prompts)
            mask = tok.attention_mask.bool() if mask is None else mask
            with torch.set_grad_enabled(grad):
                out = enc(tok.input_ids.to(unwrap(enc).device), output_hidden_states=True)
            hidden.append(out.hidden_states[-2])
            pooled = out[0]  # the last encoder's text_embeds (projection)
        embeds = torch.cat([h.to(hidden[-1].dtype) for h in hidden], dim=-1)
        return [{"prompt_embeds": embeds[i], "pooled_prompt_embeds": pooled[i],
                 "prompt_mask": mask[i]} for i in range(len(prompts))]

    # ------------------------------------------------------------ training

    def _unet_kwargs(self, c: Components, sample: NoiseSample,
                     batch: dict[str, Any]) -> dict[str, Any]:
        """The pooled text embedding and the size/crop ids, as the UNet's added_cond."""
        if "time_ids" in batch:
            ids = batch["time_ids"]
        else:
            h, w = (s * self._vae_scale(c) for s in sample.noisy.shape[-2:])
            ids = time_ids(batch.get("original_size", (h, w)),
                           batch.get("crop_top_left", (0, 0)),
                           batch.get("target_size", (h, w)))
        dtype = unwrap(c.denoiser).dtype
        b = sample.noisy.shape[0]
        ids = ids.to(sample.noisy.device, dtype).expand(b, 6)
        pooled = batch["pooled_prompt_embeds"].to(sample.noisy.device, dtype)
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
            unet=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            add_watermarker=False)
        pipe.set_progress_bar_config(disable=True)
        return pipe


FAMILY = StableDiffusionXLFamily()
