"""FLUX.1: MMDiT + single-stream transformer, CLIP-L (pooled) + T5 (sequence), flow matching.

Text, as FluxPipeline.encode_prompt builds it (that method is called): T5's last hidden
states padded to `max_sequence_length` = 512 (the pipeline default; FLUX.1-dev's
training length) as the sequence, CLIP-L's pooled output as the vector. txt_ids are
zeros [L, 3].

Latents: `encode_images` returns unpacked [B, 16, h, w] latents (like every family, so
caches and buckets need no Flux case); `predict` packs them into 2x2 patches with
FluxPipeline._pack_latents, builds img_ids with _prepare_latent_image_ids, and unpacks
the output, as diffusers' train_dreambooth_lora_flux.py does, so prediction and target
are both [B, 16, h, w].

Guidance: guidance-distilled models (FLUX.1-dev, `guidance_embeds=True`) are given the
guidance value `train_guidance` = 1.0 during training, as ai-toolkit and SimpleTuner
do for LoRA training (diffusers' script uses 3.5; set the attribute to change it).
Models without guidance embeddings (FLUX.1-schnell) get None. Validation uses the
pipeline's default guidance_scale unless the caller passes one.

Flow matching and LoRA details: see flow.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models import common
from core.models.base import Components, NoiseSample
from core.models.flow import FlowFamily, tiny_flow_vae
from core.models.t5 import build_t5_tokenizer, tiny_t5_encoder

# diffusers' train_dreambooth_lora_flux.py default: attention projections of both
# streams and the feed-forwards of the double blocks (single blocks match attn.to_*).
LORA_TARGETS = [
    "attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0",
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
    "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2",
]

# The real FLUX.1 VAE's latent normalisation.
VAE_SCALING = 0.3611
VAE_SHIFT = 0.1159
TINY_DIM = 32  # T5 width = joint_attention_dim = CLIP width = pooled_projection_dim


class FluxFamily(FlowFamily):
    name = "flux"
    text_encoder_count = 2
    pipeline_class_name = "FluxPipeline"
    default_max_sequence_length = 512
    train_guidance = 1.0

    # ------------------------------------------------------------ tiny model

    def build_tiny(self, out_dir: Path, seed: int = 0) -> None:
        """Write a tiny random FLUX.1-dev-shaped model (guidance embeds) as a diffusers
        folder."""
        import torch
        from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
        from transformers import CLIPTextModel, CLIPTokenizer, T5TokenizerFast

        from core.models.sd15 import tiny_clip_config
        from core.models.tokenizers import build_clip_tokenizer

        out_dir = Path(out_dir)
        torch.manual_seed(seed)
        transformer = FluxTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=TINY_DIM,
            pooled_projection_dim=TINY_DIM, guidance_embeds=True, axes_dims_rope=(4, 6, 6))
        torch.manual_seed(seed + 1)
        vae = tiny_flow_vae(VAE_SCALING, VAE_SHIFT)
        common.calibrate_tiny_vae(vae, seed, with_shift=True)
        torch.manual_seed(seed + 2)
        clip = CLIPTextModel(tiny_clip_config(TINY_DIM, "quick_gelu", TINY_DIM, 2))
        build_clip_tokenizer(out_dir / "tokenizer")
        vocab = build_t5_tokenizer(out_dir / "tokenizer_2")
        t5 = tiny_t5_encoder(vocab, TINY_DIM, seed + 3)
        scheduler = FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
            max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
        load = {"local_files_only": True}
        pipe = FluxPipeline(
            transformer=transformer, vae=vae, scheduler=scheduler, text_encoder=clip,
            tokenizer=CLIPTokenizer.from_pretrained(str(out_dir / "tokenizer"), **load),
            text_encoder_2=t5,
            tokenizer_2=T5TokenizerFast.from_pretrained(str(out_dir / "tokenizer_2"), **load))
        pipe.save_pretrained(str(out_dir), safe_serialization=True)

    # ------------------------------------------------------------ loading

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        return Components(
            family=self.name, source=source, fingerprint=fp, vae=pipe.vae,
            denoiser=pipe.transformer, text_encoders=[pipe.text_encoder, pipe.text_encoder_2],
            tokenizers=[pipe.tokenizer, pipe.tokenizer_2], noise_scheduler=pipe.scheduler,
            extras={"max_sequence_length": self.max_sequence_length,
                    "guidance": self.train_guidance})

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [512, D_t5], prompt_mask [512], pooled [D_clip]."""
        import torch

        pipe = self.validation_pipeline(c)
        msl = c.extras.get("max_sequence_length", self.max_sequence_length)
        with torch.no_grad():
            embeds, pooled, _ = pipe.encode_prompt(
                prompt=prompts, prompt_2=None, device=c.vae.device, max_sequence_length=msl)
        mask = c.tokenizers[1](prompts, padding="max_length", max_length=msl, truncation=True,
                               return_tensors="pt").attention_mask.bool()
        return [{"prompt_embeds": embeds[i], "prompt_mask": mask[i],
                 "pooled_prompt_embeds": pooled[i]} for i in range(len(prompts))]

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, text: dict[str, Any],
                extra: dict[str, Any] | None = None) -> Any:
        """Pack, run the transformer with img/txt ids and guidance, unpack (see above)."""
        import torch
        from diffusers import FluxPipeline

        self.check_text_length(text, c.extras.get("max_sequence_length",
                                                  self.max_sequence_length))
        model = c.denoiser
        inner = common.unwrap(model)
        dtype = inner.dtype
        noisy = sample.noisy.to(dtype)
        b, ch, h, w = noisy.shape
        if h % 2 or w % 2:
            raise ValueError(f"flux latents must have even height and width, got {h}x{w}: "
                             "use image sides that are multiples of 16 pixels")
        device = noisy.device
        packed = FluxPipeline._pack_latents(noisy, b, ch, h, w)
        img_ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, device, dtype)
        embeds = text["prompt_embeds"].to(device, dtype)
        txt_ids = torch.zeros(embeds.shape[1], 3, device=device, dtype=dtype)
        guidance = None
        if inner.config.guidance_embeds:
            value = c.extras.get("guidance", self.train_guidance)
            guidance = torch.full((b,), float(value), device=device, dtype=torch.float32)
        out = model(
            hidden_states=packed, timestep=(sample.timesteps.to(device) / 1000).to(dtype),
            guidance=guidance, pooled_projections=text["pooled_prompt_embeds"].to(device, dtype),
            encoder_hidden_states=embeds, txt_ids=txt_ids, img_ids=img_ids,
            return_dict=False)[0]
        scale = 2 ** (len(c.vae.config.block_out_channels) - 1)
        return FluxPipeline._unpack_latents(out, h * scale, w * scale, scale)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        extra = ["proj_mlp", "proj_out"]  # the single blocks' MLP in and joint out
        return LORA_TARGETS + (extra if scope == "all" else [])

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """A FluxPipeline sharing the loaded modules (its own scheduler). Its default
        max_sequence_length (512) is the training one; if c.extras["max_sequence_length"]
        was changed, pass the same value when calling it."""
        from diffusers import FluxPipeline

        pipe = FluxPipeline(
            transformer=common.unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            text_encoder_2=c.text_encoders[1], tokenizer_2=c.tokenizers[1])
        pipe.set_progress_bar_config(disable=True)
        return pipe


FAMILY = FluxFamily()
