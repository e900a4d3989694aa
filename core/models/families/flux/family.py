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

Timestep sampling (train.timestep_sampling = "auto"): logit-normal (mean 0, std 1),
unshifted, where diffusers' train_dreambooth_lora_flux.py defaults to uniform
(--weighting_scheme none). Kept on purpose: the SD3 paper (Esser et al. 2024, which
FLUX.1 follows) found logit-normal sampling better than uniform for rectified flow, and
the trainers most Flux LoRAs come from sample so too (kohya sd-scripts' and SimpleTuner's
"sigmoid" default, ai-toolkit's); it is also what every earlier run here used. Set
train.timestep_sampling = "uniform" for the diffusers script's law.

Guidance: guidance-distilled models (FLUX.1-dev, `guidance_embeds=True`) are given the
guidance value `train_guidance` = 1.0 during training, as ai-toolkit and SimpleTuner
do for LoRA training (diffusers' script uses 3.5; train.guidance, which sets a loaded
model's `GuidedComponents.guidance`, changes it).
Models without guidance embeddings (FLUX.1-schnell) get None. Validation uses the
pipeline's default guidance_scale unless the caller passes one.

Flow matching and LoRA details: see flow.py. The tiny model: tiny.py.
"""

from __future__ import annotations

from typing import Any

from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, RandomSpec, SingleFileSpec, ValidationSpec
from core.models.components import GuidedComponents, extended
from core.models.flow import FlowFamily, pack_2x2
from core.models.modules import unwrap
from core.models.routing import RoutingSpec, Slot

# diffusers' train_dreambooth_lora_flux.py default: attention projections of both
# streams and the feed-forwards of the double blocks (single blocks match attn.to_*).
LORA_TARGETS = [
    "attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0",
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
    "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2",
]

# The guidance value a guidance-distilled model (FLUX.1-dev) gets in training.
TRAIN_GUIDANCE = 1.0


def random_settings(c: Components) -> GuidedComponents:
    """random:flux as `load` gives it: its guidance value, which train.guidance sets."""
    return extended(c, GuidedComponents, guidance=TRAIN_GUIDANCE)


class FluxFamily(FlowFamily):
    name = "flux"
    # Original-format single files and diffusers folders (core/models/loading.py).
    single_file = SingleFileSpec(markers=("double_blocks.",), rank=30)
    pipeline_prefix = "Flux"
    text_encoder_count = 2
    pipeline_class_name = "FluxPipeline"
    # A file of the transformer alone (BFL's flux1-dev.safetensors, ComfyUI's bf16, fp8
    # and fp8_scaled diffusion-model files): diffusers' converter reads its names.
    transformer_class_name = "FluxTransformer2DModel"
    single_file_default_config = "black-forest-labs/FLUX.1-dev"
    whole_checkpoints = True
    max_sequence_length = 512
    memory = MemorySpec(latent_packing=2)  # 2x2 latent patches packed before the transformer
    block_lists = ("transformer_blocks", "single_transformer_blocks")
    # train.token_routing: both kinds of block take (hidden_states, encoder_hidden_states,
    # temb, image_rotary_emb) and give (encoder_hidden_states, hidden_states); the rotary
    # table (cos, sin) has a row per text token, then one per image token.
    routing = RoutingSpec(hidden=Slot(0, "hidden_states"), rope=Slot(3, "image_rotary_emb"),
                          text=Slot(1, "encoder_hidden_states"), output=1)
    train_guidance = TRAIN_GUIDANCE
    random = RandomSpec(settings=random_settings)
    # Validation passes guidance_scale as the distilled guidance and no true_cfg_scale.
    validation = ValidationSpec(negative_prompt_note=(
        "FLUX.1 models are guidance-distilled and validation draws them without a "
        "negative prompt: it is ignored; leave it empty"))

    # ------------------------------------------------------------ loading

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        return GuidedComponents(
            family=self.name, source=source, fingerprint=fp, vae=pipe.vae,
            denoiser=pipe.transformer, text_encoders=[pipe.text_encoder, pipe.text_encoder_2],
            tokenizers=[pipe.tokenizer, pipe.tokenizer_2], noise_scheduler=pipe.scheduler,
            guidance=self.train_guidance)

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [512, D_t5], prompt_mask [512], pooled [D_clip]."""
        import torch

        pipe = self.validation_pipeline(c)
        msl = self.sequence_length(c)
        with torch.no_grad():
            embeds, pooled, _ = pipe.encode_prompt(
                prompt=prompts, prompt_2=None, device=c.vae.device, max_sequence_length=msl)
        mask = c.tokenizers[1](prompts, padding="max_length", max_length=msl, truncation=True,
                               return_tensors="pt").attention_mask.bool()
        return [{"prompt_embeds": embeds[i], "prompt_mask": mask[i],
                 "pooled_prompt_embeds": pooled[i]} for i in range(len(prompts))]

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """Pack, run the transformer with img/txt ids and guidance, unpack (see above).
        The text mask is not given: the transformer takes none, as in the pipeline."""
        import torch

        self.check_text_length(batch, self.sequence_length(c))
        model = c.denoiser
        inner = unwrap(model)
        dtype = inner.dtype
        noisy = sample.noisy.to(dtype)
        b, device = noisy.shape[0], noisy.device
        packed, img_ids, unpack = pack_2x2(noisy, self.name, c.vae)
        embeds = batch["prompt_embeds"].to(device, dtype)
        txt_ids = torch.zeros(embeds.shape[1], 3, device=device, dtype=dtype)
        guidance = None
        if inner.config.guidance_embeds:
            value = self.train_guidance if c.guidance is None else c.guidance
            guidance = torch.full((b,), float(value), device=device, dtype=torch.float32)
        hidden, ids = self.image_tokens(batch, packed, img_ids)
        out = model(
            hidden_states=hidden, timestep=(sample.timesteps.to(device) / 1000).to(dtype),
            guidance=guidance, pooled_projections=batch["pooled_prompt_embeds"].to(device, dtype),
            encoder_hidden_states=embeds, txt_ids=txt_ids, img_ids=ids,
            return_dict=False)[0]
        return unpack(out[:, :packed.shape[1]])  # the target's tokens

    def image_tokens(self, batch: dict[str, Any], packed: Any, img_ids: Any
                     ) -> tuple[Any, Any]:
        """The image tokens [B, N, 4C] and their ids [N, 3] the transformer reads: the
        target's (FLUX.1 Kontext joins its control's after them)."""
        return packed, img_ids

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        extra = ["proj_mlp", "proj_out"]  # the single blocks' MLP in and joint out
        return LORA_TARGETS + (extra if scope == "all" else [])

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """A FluxPipeline sharing the loaded modules (its own scheduler). Its default
        max_sequence_length (512) is the training one."""
        from diffusers import FluxPipeline

        pipe = FluxPipeline(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            text_encoder_2=c.text_encoders[1], tokenizer_2=c.tokenizers[1])
        pipe.set_progress_bar_config(disable=True)
        return pipe


FAMILY = FluxFamily()
