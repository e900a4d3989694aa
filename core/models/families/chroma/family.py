"""Chroma (Chroma1-HD): FLUX.1-schnell's transformer with an approximator instead of the
per-block modulation, T5-XXL alone as text encoder, flow matching, real CFG.

Text, as ChromaPipeline.encode_prompt builds it (that method is called): T5 runs with
the tokenizer's attention mask (unlike Flux) on prompts padded to `max_sequence_length`
= 512 (the pipeline default); the text mask the transformer gets keeps the real tokens
and exactly one padding token after them (`_get_t5_prompt_embeds`: positions
<= the number of real tokens; Chroma's "T5 padding" masking). That mask is the
`prompt_mask` of each prompt, and `predict` gives it to the transformer extended with
True for every image token, as ChromaPipeline._prepare_attention_mask does. txt_ids are
zeros [L, 3].

The mask is boolean. ChromaPipeline casts it to the embeddings' float dtype, and
scaled_dot_product_attention adds a float mask to the scores instead of masking, so in
diffusers' own pipeline the padding is not masked at all (diffusers issues #12116 and
#13619, open as of diffusers 0.42). Chroma was trained with the padding masked (its
trainer, lodestone-rock/flow, and ComfyUI's Chroma model mask it), so training and
validation here pass a boolean mask: the keep-set is the pipeline's, the meaning is
Chroma's. Validation calls the pipeline with that mask (`validation.mask_kwarg`); a
boolean mask stays boolean through the pipeline.

diffusers' ChromaTransformer2DModel drops the mask in its single-stream blocks when
gradient checkpointing is on (it calls them without it); `predict` supplies it there,
so a checkpointed step computes what an unchecked one does.

Latents: the FLUX.1 VAE (16 channels, scaling 0.3611, shift 0.1159). `encode_images`
returns unpacked [B, 16, h, w] latents; `predict` packs 2x2 patches with
ChromaPipeline._pack_latents, builds img_ids with _prepare_latent_image_ids, gives the
transformer timestep = sigma (sigma * 1000 / 1000, as the pipeline divides by 1000) and
unpacks its output, so prediction and target are both [B, 16, h, w].

Guidance: Chroma is not guidance-distilled; its transformer takes no guidance value
(the approximator is given 0). Validation runs real classifier-free guidance with the
empty prompt as the negative (pipeline default guidance_scale 5.0; diffusers' docs use
3.0 to 5.0).

Timesteps: diffusers has no Chroma training script; this follows its Flux one, as
FlowFamily does (sigmas logit-normal, unshifted when the scheduler shifts dynamically,
which Chroma1-HD's does: the pipeline passes `mu` from calculate_shift).

LoRA: the diffusers file loads with ChromaPipeline.load_lora_weights (FluxLoraLoaderMixin,
`transformer_lora_layers`). ComfyUI's Chroma model class subclasses its Flux one
(comfy/model_base.py `class Chroma(Flux)`), so comfy/lora.py maps Chroma LoRAs through
the Flux branch (`flux_to_diffusers`, "transformer.<diffusers module>" keys) onto its
BFL-named weights (double_blocks / single_blocks, the same names as Flux): the shared
`lora_comfyui.safetensors` writer is that layout.

Flow matching and LoRA file details: see flow.py. The tiny model: tiny.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, SingleFileSpec, ValidationSpec
from core.models.families.flux.family import LORA_TARGETS as FLUX_LORA_TARGETS
from core.models.flow import FlowFamily, pack_2x2
from core.models.modules import unwrap

# Flux's targets (train_dreambooth_lora_flux.py's default): Chroma's blocks have the same
# attention and feed-forward modules; its pruned norms have no linear layers.
LORA_TARGETS = FLUX_LORA_TARGETS


class ChromaFamily(FlowFamily):
    name = "chroma"
    block_lists = ("transformer_blocks", "single_transformer_blocks")
    # Original-format single files and diffusers folders (core/models/loading.py).
    # Flux's block names plus its approximator (diffusers' own "chroma" detection key)
    single_file = SingleFileSpec(markers=("distilled_guidance_layer.",), rank=10)
    pipeline_prefix = "Chroma"
    text_encoder_count = 1
    pipeline_class_name = "ChromaPipeline"
    # A file of the transformer alone (ComfyUI's bf16, fp8 and fp8_scaled files):
    # diffusers' converter reads its names.
    transformer_class_name = "ChromaTransformer2DModel"
    single_file_default_config = "lodestones/Chroma1-HD"
    whole_checkpoints = True
    max_sequence_length = 512
    memory = MemorySpec(latent_packing=2)  # 2x2 latent patches packed before the transformer
    # The ChromaPipeline argument validation gives the text mask to (core/train/validation.py).
    validation = ValidationSpec(mask_kwarg="prompt_attention_mask")

    # ------------------------------------------------------------ loading

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [512, D_t5] and prompt_mask [512], True for the real
        tokens and the one padding token Chroma attends to (see the module docstring)."""
        import torch

        pipe = self.validation_pipeline(c)
        with torch.no_grad():
            embeds, _, mask, *_ = pipe.encode_prompt(
                prompt=prompts, device=c.text_encoders[0].device,
                do_classifier_free_guidance=False,
                max_sequence_length=self.sequence_length(c))
        mask = mask.bool()
        return [{"prompt_embeds": embeds[i], "prompt_mask": mask[i]}
                for i in range(len(prompts))]

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """Pack, run the transformer with img/txt ids and the text mask, unpack."""
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
        text_mask = batch["prompt_mask"].to(device=device, dtype=torch.bool)
        mask = torch.cat([text_mask, torch.ones(b, packed.shape[1], device=device,
                                                dtype=torch.bool)], dim=1)
        with _single_blocks_keep_mask(inner, mask):
            out = model(hidden_states=packed,
                        timestep=(sample.timesteps.to(device) / 1000).to(dtype),
                        encoder_hidden_states=embeds, txt_ids=txt_ids, img_ids=img_ids,
                        attention_mask=mask, return_dict=False)[0]
        return unpack(out)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        extra = ["proj_mlp", "proj_out"]  # the single blocks' MLP in and joint out
        return LORA_TARGETS + (extra if scope == "all" else [])

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """A ChromaPipeline sharing the loaded modules (its own scheduler). Its default
        max_sequence_length (512) is the training one. Called with prompt strings it builds
        diffusers' float mask; pass `prompt_attention_mask` (a boolean one, as
        encode_prompts gives) to mask as training does."""
        from diffusers import ChromaPipeline

        pipe = ChromaPipeline(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0])
        pipe.set_progress_bar_config(disable=True)
        return pipe


@contextlib.contextmanager
def _single_blocks_keep_mask(model: Any, mask: Any) -> Iterator[None]:
    """While gradient checkpointing is on, hand `mask` to the single-stream blocks, which
    ChromaTransformer2DModel checkpoints as block(hidden_states, temb, image_rotary_emb)
    without it (their forward takes it as the fourth argument)."""
    from diffusers.models.transformers.transformer_chroma import ChromaSingleTransformerBlock

    if not getattr(model, "gradient_checkpointing", False):
        yield
        return
    checkpoint = model._gradient_checkpointing_func

    def with_mask(block: Any, *args: Any) -> Any:
        if isinstance(block, ChromaSingleTransformerBlock) and len(args) == 3:
            args = (*args, mask)
        return checkpoint(block, *args)

    model._gradient_checkpointing_func = with_mask
    try:
        yield
    finally:
        model._gradient_checkpointing_func = checkpoint


FAMILY = ChromaFamily()
