"""ERNIE-Image (baidu/ERNIE-Image and its distilled ERNIE-Image-Turbo): an 8B single-stream
DiT (ErnieImageTransformer2DModel, 36 shared-AdaLN blocks), a Ministral 3 3B text encoder
(Mistral3Model), FLUX.2's VAE (AutoencoderKLFlux2), flow matching. Follows
ErnieImagePipeline; diffusers ships no training script for it, so the objective is the
one that pipeline samples.

Text, as ErnieImagePipeline.encode_prompt builds it (that method is called): each prompt
tokenized alone (the tokenizer's special tokens, no template, no padding), and the text
encoder's second-to-last hidden states (`hidden_states[-2]`) for its tokens: [L_i, 3072],
a length of its own. The cache keeps them so (mask all True); collate pads a batch to its
longest with the mask False, and `predict` hands the transformer `text_bth` and the real
lengths `text_lens` (the mask's sums), as the pipeline's `_pad_text` does: text tokens sit
at rotary positions 0..L-1, the image tokens after the item's own length, and padded
tokens are masked as keys, so the padding changes no image token. The prompt enhancer
(the pipeline's optional `pe`, a Ministral3ForCausalLM that rewrites prompts) is never
loaded: training and validation use the prompts as written.

Latents: as FLUX.2's pipelines make them, and as ErnieImagePipeline undoes them before
decoding: the VAE posterior mode [B, 32, H/8, W/8], patchified 2x2
(`_patchify_latents`: [B, 128, H/16, W/16]), normalised with the VAE's batch-norm running
statistics, (x - running_mean) / sqrt(running_var + 1e-5): the pipeline decodes with that
1e-5 ("the trained value"; the hub config's batch_norm_eps says 1e-4), so training uses
it. The transformer takes the 128-channel grid as it is (patch_size 1).

Sigmas: the pipeline samples sigmas linspace(1, 0) through its scheduler, whose static
`shift` (use_dynamic_shifting false; 3.0, ComfyUI's ERNIE-Image sampling shift) bends
them. Training draws u ~ U(0, 1) and applies that shift (flow.py), as diffusers' trainers
for statically shifted models (Z-Image) index the shifted table. The transformer is given
the scheduler's timestep sigma * 1000, in its dtype, as the pipeline passes it. Loss: MSE
against noise - latents (the scheduler's Euler step takes the output as that velocity).

Guidance: the transformer takes none. ErnieImagePipeline guides whenever
guidance_scale > 1 (`uncond + g * (cond - uncond)`; its default 4.0, 50 steps for the
base); validation passes validation.guidance_scale and the negative prompt's embeddings.
ERNIE-Image-Turbo samples in 8 steps at guidance 1.0 (its model card): recognised by name
at check (checks.py: train on the base), and `validation.distilled` for validation.model.

LoRA: no reference trainer; the blocks' attention projections (self_attention.to_q/k/v,
to_out.0), "all" adds the GELU-gated feed-forward. Files through
ErnieImagePipeline.save_lora_weights (ErnieImageLoraLoaderMixin reads "transformer."
keys, and "diffusion_model." ones mapped onto them); ComfyUI 0.29.0 has ERNIE-Image and
maps "transformer.<diffusers module>" names (comfyui_keys.py). Single files (ComfyUI's
diffusion model, diffusers' names under an optional "model.diffusion_model." prefix)
load the transformer; model.config gives the rest.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, SingleFileSpec, ValidationSpec
from core.models.components import extended
from core.models.flow import FlowFamily
from core.models.geometry import Geometry
from core.models.modules import unwrap
from core.models.objectives import standard_noise

# The attention projections of every block; "all" adds the feed-forward.
LORA_TARGETS = ["self_attention.to_q", "self_attention.to_k", "self_attention.to_v",
                "self_attention.to_out.0"]
FEED_FORWARD = ["mlp.gate_proj", "mlp.up_proj", "mlp.linear_fc2"]
# ErnieImagePipeline's latent normalisation epsilon (its decode hard-codes it).
BN_EPS = 1e-5


@functools.cache
def pipeline_class() -> Any:
    """ErnieImagePipeline whose from_pretrained leaves the optional prompt enhancer
    (a second 3B model) unloaded; save_lora_weights is the pipeline's own."""
    from diffusers import ErnieImagePipeline

    class ErnieImageTrainingPipeline(ErnieImagePipeline):
        @classmethod
        def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
            return ErnieImagePipeline.from_pretrained(
                *args, **{"pe": None, "pe_tokenizer": None, **kwargs})

    return ErnieImageTrainingPipeline


def activation_layout(config: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The transformer config as the memory estimate's MMDiT formula reads it: each
    block one joint block over image and text tokens at hidden_size, and the 2x2
    patchify of the VAE's latents as the patch."""
    heads = int(config.get("num_attention_heads", 32))
    return ({"num_attention_heads": heads,
             "attention_head_dim": int(config.get("hidden_size", 4096)) // heads,
             "num_layers": int(config.get("num_layers", 36))},
            int(config.get("patch_size", 1) or 1) * 2)
@dataclass
class ErnieImageComponents(Components):
    """A loaded ERNIE-Image: whether it is the Turbo (checks.py `is_turbo`: its name or
    index says so), which validation.model samples with `validation.distilled`."""

    is_distilled: bool = False


class ErnieImageFamily(FlowFamily):
    name = "ernie_image"
    geometry = Geometry(latent_channels=32)  # FLUX.2's VAE
    block_lists = ("layers",)
    # Its blocks run image and text tokens as one sequence under one key mask, the text
    # positions counted from the image's: no subset of image tokens can be routed.
    routing = None
    # ComfyUI's ERNIE-Image marker (comfy/model_detection.py), diffusers' names too.
    single_file = SingleFileSpec(markers=("layers.0.mlp.linear_fc2.",), rank=50)
    pipeline_prefix = "ErnieImage"
    text_encoder_count = 1
    pipeline_class_name = "ErnieImagePipeline"
    transformer_class_name = "ErnieImageTransformer2DModel"
    single_file_default_config = "baidu/ERNIE-Image"
    # The pipeline cuts no prompt; the memory estimate counts this many text tokens.
    max_sequence_length = 512
    # The VAE's 2x2 patchify before the transformer; Ministral 3 (a decoder LM) reads text.
    memory = MemorySpec(latent_packing=2, activation_layout=activation_layout,
                        text_encoder_kind="llm")
    timestep_sampling = "uniform"
    # The pipeline takes a list of [L, D] embeddings; validation.model on
    # ERNIE-Image-Turbo: 8 steps at guidance 1.0 (its model card).
    validation = ValidationSpec(list_prompt_embeds=True, distilled=(8, 1.0))

    # ------------------------------------------------------------ loading

    def _pipeline_class(self) -> Any:
        return pipeline_class()

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        from core.models.families.ernie_image.checks import is_turbo

        c = super()._components_from_pipeline(pipe, source, fp)
        return extended(c, ErnieImageComponents, is_distilled=is_turbo(source))

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [L_i, D] (its own tokens), prompt_mask [L_i] all True."""
        import torch

        pipe = self.validation_pipeline(c)
        with torch.no_grad():
            embeds = pipe.encode_prompt(prompts, c.text_encoders[0].device)
        return [{"prompt_embeds": e,
                 "prompt_mask": torch.ones(e.shape[0], dtype=torch.bool, device=e.device)}
                for e in embeds]

    # ------------------------------------------------------------ images

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """Normalised patchified latents [B, 4C, H/16, W/16] (see the module docstring):
        the posterior mode without a generator, a posterior sample with one."""
        import torch
        from diffusers import ErnieImagePipeline

        vae = c.vae
        with torch.no_grad():
            dist = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist
            latents = dist.mode().float()
            if generator is not None:
                noise = standard_noise(latents.shape, generator, latents.device)
                latents = latents + dist.std.float() * noise
        patches = ErnieImagePipeline._patchify_latents(latents)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(patches.device, torch.float32)
        var = vae.bn.running_var.view(1, -1, 1, 1).to(patches.device, torch.float32)
        return ((patches - mean) / torch.sqrt(var + BN_EPS)).to(vae.dtype)

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """The transformer on the latent grid, the padded text and each item's text
        length, at timestep sigma * 1000 (the pipeline's call)."""
        model = c.denoiser
        dtype = unwrap(model).dtype
        noisy = sample.noisy.to(dtype)
        device = noisy.device
        embeds = batch["prompt_embeds"].to(device, dtype)
        lengths = batch["prompt_mask"].to(device).bool().sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("an ernie_image prompt embedding has no real tokens: the text "
                             "cache is damaged; delete the text cache to rebuild it")
        return model(hidden_states=noisy, timestep=sample.timesteps.to(device, dtype),
                     text_bth=embeds, text_lens=lengths, return_dict=False)[0]

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return LORA_TARGETS + (FEED_FORWARD if scope == "all" else [])

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """An ErnieImagePipeline sharing the loaded modules (its own scheduler, no prompt
        enhancer). Give it prompt_embeds as a list of [L, D] tensors."""
        from diffusers import ErnieImagePipeline

        pipe = ErnieImagePipeline(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0])
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def config_problems(self, cfg: Any) -> list[Any]:
        """A Turbo (distilled) checkpoint, a folder missing a component (checks.py)."""
        from core.models.families.ernie_image.checks import model_problems

        return model_problems(cfg.model.path)


FAMILY = ErnieImageFamily()
