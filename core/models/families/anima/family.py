"""Anima (circlestone-labs): NVIDIA's Cosmos-Predict2 2B DiT (CosmosTransformer3DModel, a
video transformer: a still is one latent frame), a Qwen3-0.6B text encoder whose last
hidden states an LLM adapter (AnimaTextConditioner) maps onto T5 token embeddings, the
Qwen-Image VAE (AutoencoderKLQwenImage), flow matching. diffusers ships it only as a
modular pipeline, AnimaModularPipeline (AnimaAutoBlocks): its folders hold
modular_model_index.json, not model_index.json. pipeline.py loads and samples it.
There is no diffusers training script for Anima; the reference trainer is
diffusion-pipe's (models/cosmos_predict2.py, its 'anima' model type).

Text, as the pipeline's own steps build it (AnimaTextEncoderStep.encode_prompt, then
AnimaTextConditioningStep): the prompt through the Qwen tokenizer and Qwen3's last hidden
states (padding zeroed), the same prompt's T5 token ids (a T5 tokenizer, no T5 model) as
the conditioner's queries, both truncated at 512; the conditioner's output has one row
per T5 token, zeroes the padded ones and is zero-padded to 512 rows, which the
transformer cross-attends to without a mask. The conditioner is frozen here (the
reference trainer's documented llm_adapter_lr = 0: train the DiT only), so it runs at
caching as a second text encoder (`text_encoders` = [Qwen3, the conditioner]; tokenizers
[Qwen, T5]): the cache keeps each prompt's conditioned rows of its real T5 tokens
([T_i, 1024], mask all True), collate pads a batch with zero rows, and `predict` pads to
512 with zeros: the very tensor the pipeline hands the transformer.

Latents: as Qwen-Image's (one frame through the causal VAE, (z - latents_mean) /
latents_std per channel, the frame axis dropped: [B, 16, h, w]); `predict` gives the
transformer [B, 16, 1, h, w], the all-zero padding mask the pipeline gives, and drops the
frame axis of its output. Sides must be multiples of 16 pixels (2x2 patches).

Sigmas, as the reference trainer draws them: logit-normal (sigmoid of N(0, 1)), no
shift (diffusion-pipe's default; kohya's sd-scripts, the other Anima trainer, also
trains unshifted with its sigmoid sampling). The scheduler's static shift 3 is the
sampler's: validation's pipeline applies it (AnimaSetTimestepsStep hands the scheduler
sigmas 1 .. 1/N, which it shifts). The transformer takes sigma itself (the pipeline's
timestep / 1000); noisy = (1 - s) x + s n; target n - x; MSE.

Guidance: none in the model; AnimaModularPipeline guides with ClassifierFreeGuidance
(uncond + g * (cond - uncond), off at g = 1), the empty prompt as negative:
validation.guidance_scale is its scale (pipeline.py).

LoRA: on the transformer's blocks, the Linears diffusion-pipe adapts in each DiT block
(attention, feed-forward; "all" adds the adaLN modulation Linears). Files: the diffusers
file through AnimaLoraLoaderMixin (which AnimaModularPipeline has: load_lora_weights
loads it into the transformer), and lora_comfyui.safetensors in the original Cosmos
names ComfyUI 0.29.0 maps for its Anima model (comfyui_keys.py). Single files (ComfyUI's
split files) are refused with what to use. Distilled: an Anima Turbo checkpoint is warned
about at check (checks.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models import loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import (
    MemorySpec,
    RandomSpec,
    SingleFileSpec,
    ValidationSpec,
    class_tokenizer,
)
from core.models.comfyui_names import ModuleNames, save_named_comfy
from core.models.families.wan.family import activation_layout as wan_activation_layout
from core.models.flow import FlowFamily
from core.models.geometry import Geometry
from core.models.modules import encode_causal_latents, freeze, unwrap

# The DiT block Linears (diffusion-pipe adapts every Linear of its `Block`s).
LORA_TARGETS = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q",
                "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ff.net.0.proj", "ff.net.2"]
LORA_EXTRA = [f"norm{n}.linear_{k}" for n in (1, 2, 3) for k in (1, 2)]
PIPELINE = "AnimaModularPipeline"


def comfy_names() -> ModuleNames:
    """diffusers module -> ComfyUI's Anima weight name (comfyui_keys.py's table)."""
    from core.models.families.anima.comfyui_keys import LEAVES

    return ModuleNames(blocks={"transformer_blocks": ("blocks", dict(
        (d, c) for c, d in LEAVES))})


def save_lora_weights(save_directory: str, transformer_lora_layers: dict[str, Any],
                      transformer_lora_adapter_metadata: dict[str, Any]) -> None:
    """pytorch_lora_weights.safetensors as diffusers' pipelines write one ("transformer."
    keys, the adapter config as metadata): AnimaLoraLoaderMixin loads but has no
    save_lora_weights of its own, so its base class's writer is called."""
    from diffusers import AnimaModularPipeline

    AnimaModularPipeline._save_lora_weights(
        save_directory, lora_layers={"transformer": transformer_lora_layers},
        lora_metadata={"transformer": transformer_lora_adapter_metadata})


def random_tokenizer(cls: str, folder: Path, bang_padded: bool) -> Any:
    """random:anima's tokenizers: the tiny Qwen3 one, and T5's (`class_tokenizer`)."""
    if not cls.startswith("Qwen2"):
        return class_tokenizer(cls, folder, bang_padded)
    from core.models.tiny.qwen3 import qwen_tokenizer

    return qwen_tokenizer(folder)


def random_settings(c: Components) -> Components:
    """random:anima as `load` gives it: the Cosmos transformer's padding resize in place
    (cosmos_shim.py)."""
    from core.models.families.anima.cosmos_shim import ensure_padding_resize

    ensure_padding_resize()
    return c


class AnimaFamily(FlowFamily):
    name = "anima"
    # The Qwen-Image VAE: Wan's causal video VAE given one frame.
    geometry = Geometry(latent_channels=16, temporal_compression=4)
    block_lists = ("transformer_blocks",)
    # ComfyUI's Anima keys (comfy/model_detection.py: the LLM adapter inside the DiT).
    single_file = SingleFileSpec(markers=("llm_adapter.blocks.",), rank=55)
    pipeline_prefix = "Anima"
    pipeline_class_name = PIPELINE
    text_encoder_count = 2  # Qwen3 and the text conditioner (module docstring)
    max_sequence_length = 512  # the pipeline's default, and the conditioner's rows
    # validation.model on Anima Turbo: 10 steps, no guidance (checks.py)
    validation = ValidationSpec(distilled=(10, 1.0))
    random = RandomSpec(tokenizer=random_tokenizer, settings=random_settings)

    # The estimate's MMDiT formula over the Cosmos blocks is Wan's (the same block:
    # self-attention over the image tokens, cross-attention to the text, an MLP; patch 2
    # in space); not calibrated on a measured Anima run. Qwen3 is a decoder LM.
    memory = MemorySpec(activation_layout=wan_activation_layout, text_encoder_kind="llm")

    # ------------------------------------------------------------ loading

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None, denoiser: Any = None) -> Components:
        """A modular diffusers folder or hub id (pipeline.py); a single file is refused."""
        from core.models.families.anima.pipeline import load_pipeline

        kind = loading.checked_source(path, self.name)
        if kind == "file":
            raise loading.ModelLoadError(
                path, "is a single file: Anima loads from a diffusers folder (the one "
                "holding modular_model_index.json, e.g. circlestone-labs/Anima-Base-v1.0-"
                "Diffusers, or what diffusers' Anima conversion recipe writes from "
                "ComfyUI's split files)")
        pipe = load_pipeline(path, kind, loading.resolve_dtype(dtype), denoiser)
        c = Components(
            family=self.name, source=path, fingerprint=loading.fingerprint(path, kind),
            vae=pipe.vae, denoiser=pipe.transformer,
            text_encoders=[pipe.text_encoder, pipe.text_conditioner],
            tokenizers=[pipe.tokenizer, pipe.t5_tokenizer], noise_scheduler=pipe.scheduler)
        freeze((c.vae, *([] if denoiser is not None else [c.denoiser]), *c.text_encoders),
               device)
        return c

    # ------------------------------------------------------------ text and images

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [T_i, D], the conditioner's rows of its real T5
        tokens, each prompt encoded alone as the pipeline encodes one; mask all True."""
        import torch

        from core.models.families.anima.pipeline import conditioned_text

        pipe = self._text_pipeline(c)
        out = []
        with torch.no_grad():
            for prompt in prompts:
                e = conditioned_text(pipe, prompt, self.sequence_length(c))
                out.append({"prompt_embeds": e, "prompt_mask": torch.ones(
                    e.shape[0], dtype=torch.bool, device=e.device)})
        return out

    def _text_pipeline(self, c: Components) -> Any:
        from core.models.families.anima.pipeline import validation_pipeline

        encoder, conditioner = c.text_encoders
        return validation_pipeline({"text_encoder": encoder, "text_conditioner": conditioner,
                                    "tokenizer": c.tokenizers[0],
                                    "t5_tokenizer": c.tokenizers[1]})

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """(z - latents_mean) / latents_std of pixels in [-1, 1], [B, 16, H/8, W/8]: the
        posterior mean without a generator, a sample with one; one frame, dropped."""
        return encode_causal_latents(c.vae, pixels.unsqueeze(2), generator).squeeze(2)

    # ------------------------------------------------------------ training

    def train_shift(self, c: Components) -> float:
        """Unshifted, as the reference trainer (the scheduler's shift is the sampler's)."""
        return 1.0

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """One frame through the transformer with the text padded to 512 zero rows, the
        zero padding mask and timestep sigma; the velocity [B, 16, h, w]."""
        from core.models.families.anima.pipeline import pad_rows

        model = c.denoiser
        dtype = unwrap(model).dtype
        noisy = sample.noisy.to(dtype)
        b, _, h, w = noisy.shape
        if h % 2 or w % 2:
            raise ValueError(f"anima latents must have even height and width, got {h}x{w}: "
                             "use image sides that are multiples of 16 pixels")
        device = noisy.device
        text = pad_rows(batch["prompt_embeds"].to(device, dtype), self.sequence_length(c))
        scale = self.geometry.spatial_compression
        padding = noisy.new_zeros(1, 1, h * scale, w * scale)
        out = model(hidden_states=noisy.unsqueeze(2), encoder_hidden_states=text,
                    timestep=(sample.timesteps.to(device) / 1000).to(dtype),
                    padding_mask=padding, return_dict=False)[0]
        return out.squeeze(2)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return LORA_TARGETS + (LORA_EXTRA if scope == "all" else [])

    def _pipeline_class(self) -> Any:
        """What FlowFamily.save_lora reads `save_lora_weights` from (the diffusers file
        through the function above)."""
        from types import SimpleNamespace

        return SimpleNamespace(save_lora_weights=save_lora_weights)

    def _save_comfy(self, c: Components, peft_sd: dict[str, Any], config: Any,
                    path: Path) -> Path | None:
        """ComfyUI's Anima names under "diffusion_model." (comfyui_keys.py)."""
        return save_named_comfy(c.denoiser, peft_sd, config, path, comfy_names())

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """AnimaModularPipeline sampling from the cached text (pipeline.py), on the loaded
        modules and its own scheduler; the text side where it is loaded (--stage merge)."""
        from core.models.families.anima.pipeline import validation_pipeline

        encoder, conditioner = (list(c.text_encoders) + [None, None])[:2]
        tokenizers = (list(c.tokenizers) + [None, None])[:2]
        return validation_pipeline({
            "transformer": unwrap(c.denoiser), "vae": c.vae,
            "scheduler": self.validation_scheduler(c), "text_encoder": encoder,
            "text_conditioner": conditioner, "tokenizer": tokenizers[0],
            "t5_tokenizer": tokenizers[1]})

    def config_problems(self, cfg: Any) -> list[Any]:
        """A Turbo checkpoint, a folder missing a component (checks.py)."""
        from core.models.families.anima.checks import model_problems

        return model_problems(cfg.model.path)


FAMILY = AnimaFamily()
