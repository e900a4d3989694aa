"""Krea 2: a single-stream MMDiT (Krea2Transformer2DModel), a Qwen3-VL-4B text encoder
read at twelve layers, Qwen-Image's causal VAE (AutoencoderKLQwenImage), flow matching.
Follows Krea2Pipeline and diffusers' examples/dreambooth/train_dreambooth_lora_krea2.py;
the closest family is qwen_image (same VAE and latent normalisation, same chat template,
same 2x2 packing, same training sigma draw), which this one extends.

Text, as Krea2Pipeline.encode_prompt builds it (that method is called): the prompt in
Qwen-Image's chat template, padded in the middle ([system | prompt | PAD | suffix]) to
`max_sequence_length` = 512 after the 34 system tokens are dropped, the text encoder's
hidden states at `text_encoder_select_layers` (2, 5, ..., 35: the pipeline's config)
stacked per token -> [512, 12, 2560] and a bool mask. The cache keeps each prompt's real
tokens only ([L_i, 12 x 2560], the layers flattened so collate pads it as any family's;
mask all True), and collate pads a batch to its longest with the mask False. That is the
same prediction as the pipeline's layout: every text token sits at rotary position
(0, 0, 0) (Krea2Pipeline.prepare_position_ids), the text-fusion refiner has no rotary
embedding, and padded tokens are masked as keys everywhere, so neither their place nor
their values reach the image tokens (tests/test_family_krea2.py compares with the
reference trainer's fixed-length layout). `predict` unflattens the layers.

Latents: as qwen_image (one frame through the causal VAE, normalised per channel with
latents_mean/latents_std, the frame axis dropped: caches hold [B, 16, h, w]); `predict`
packs 2x2 patches, builds the position ids with Krea2Pipeline.prepare_position_ids, and
unpacks the velocity.

Sigmas, as the reference trainer samples them (weighting scheme "none"): u ~ U(0, 1),
the scheduler's training sigma table at floor(u * 1000). Krea 2's scheduler has
use_dynamic_shifting, so that table is unshifted (k/1000); the resolution-aware shift
(calculate_shift of the image token count; a fixed mu = 1.15 for the distilled Turbo) is
applied only at inference, which validation's pipeline does. The transformer takes
sigma itself (timesteps / 1000). Loss: MSE against noise - latents.

Guidance: the transformer takes none. Krea2Pipeline's classifier-free guidance is
`cond + g * (cond - uncond)`, on whenever g > 0 (the usual scale 1 + g): validation's
guidance_scale is passed as the pipeline's, with the negative prompt's embeddings.

LoRA: the reference trainer's default targets (the Krea 2 authors' config, LORA_TARGETS),
which by suffix also reach the text-fusion blocks' attention and feed-forward; "all" adds
the SwiGLU gates. Files through Krea2Pipeline.save_lora_weights; ComfyUI 0.29.0 has Krea 2
(comfy/model_base.py Krea2) and maps "transformer.<diffusers module>" names onto its own
(comfy/utils.py krea2_to_diffusers; comfyui_keys.py), which lora_comfyui.safetensors holds.

Distilled: Krea 2 Turbo (model_index.json's is_distilled, a Turbo pipeline class, or
"turbo" in the path) is recognised and warned about at check (checks.py): train on the
base (Raw) checkpoint. Single files: ComfyUI's diffusion-model file (Krea's names, bf16,
fp8 or fp8_scaled) loads its transformer through Krea2Transformer2DModel.from_single_file,
the rest from model.config.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, SingleFileSpec, ValidationSpec
from core.models.components import extended
from core.models.families.qwen_image.family import QwenImageFamily
from core.models.flow import FlowFamily
from core.models.modules import unwrap

# Krea2Pipeline's default taps (text_encoder_select_layers): Qwen3-VL-4B hidden states.
TEXT_LAYERS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)
# train_dreambooth_lora_krea2.py's default (--lora_layers unset).
LORA_TARGETS = ["img_in", "final_layer.linear", "to_q", "to_k", "to_v", "to_out.0", "to_gate",
                "ff.up", "ff.down", "text_fusion.projector", "txt_in.linear_1",
                "txt_in.linear_2", "time_embed.linear_1", "time_embed.linear_2",
                "time_mod_proj"]
LORA_EXTRA = ["ff.gate"]


@dataclass
class Krea2Components(Components):
    """A loaded Krea 2: the pipeline's text taps and whether it is distilled (Turbo),
    read from the pipeline's config, beside the shared fields."""

    text_layers: tuple[int, ...] = TEXT_LAYERS
    is_distilled: bool = False


def random_settings(c: Components) -> Krea2Components:
    """random:krea2 as `load` gives it: the pipeline's default taps, not distilled (the
    shipped model_index.json's)."""
    return extended(c, Krea2Components)


def text_layers(c: Components) -> tuple[int, ...]:
    """The loaded model's taps (the pipeline's default for Components built plain)."""
    return tuple(getattr(c, "text_layers", TEXT_LAYERS))


@functools.cache
def _validation_pipeline_class() -> Any:
    """Krea2Pipeline taking the cache's flattened embeddings (built on first use)."""
    from diffusers import Krea2Pipeline

    class Krea2ValidationPipeline(Krea2Pipeline):
        """Embeddings [B, L, K x D] (the text cache's layout) are unflattened to the
        pipeline's [B, L, K, D]; a mask left out is all real tokens; the prompt and the
        negative are padded (mask False) to one length, as the pipeline's fixed-length
        text is: both passes share one set of position ids."""

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            layers = int(self.transformer.config.num_text_layers)
            keys = [k for k in ("prompt_embeds", "negative_prompt_embeds")
                    if kwargs.get(k) is not None]
            for key in keys:
                embeds = kwargs[key]
                if embeds.ndim == 3:
                    kwargs[key] = embeds = embeds.unflatten(-1, (layers, -1))
                if kwargs.get(f"{key}_mask") is None:
                    kwargs[f"{key}_mask"] = embeds.new_ones(embeds.shape[:2]).bool()
            longest = max((kwargs[k].shape[1] for k in keys), default=0)
            for key in keys:
                kwargs[key], kwargs[f"{key}_mask"] = pad_text(
                    kwargs[key], kwargs[f"{key}_mask"].bool(), longest)
            return super().__call__(*args, **kwargs)

    return Krea2ValidationPipeline


def pad_text(embeds: Any, mask: Any, length: int) -> tuple[Any, Any]:
    """[B, L, K, D] embeddings and their [B, L] mask padded to `length` tokens (zeros,
    mask False): the same prediction, every text token sitting at rotary position 0."""
    import torch.nn.functional as F

    extra = length - embeds.shape[1]
    if extra <= 0:
        return embeds, mask
    return F.pad(embeds, (0, 0, 0, 0, 0, extra)), F.pad(mask, (0, extra), value=False)


class Krea2Family(QwenImageFamily):
    name = "krea2"
    block_lists = ("transformer_blocks",)
    # Its blocks run text and image tokens as one sequence under one key mask: no
    # subset of the image tokens can be routed past a block (train.token_routing).
    routing = None
    # ComfyUI / Krea's original names (comfy/model_detection.py's Krea 2 marker).
    single_file = SingleFileSpec(markers=("txtfusion.projector.",), rank=50)
    pipeline_prefix = "Krea2"
    pipeline_class_name = "Krea2Pipeline"
    # ComfyUI's diffusion-model file (bf16, fp8 or fp8_scaled, Krea's original names):
    # diffusers' converter reads it; the rest comes from model.config.
    transformer_class_name = "Krea2Transformer2DModel"
    single_file_default_config = "krea/Krea-2-Raw"
    max_sequence_length = 512
    # The transformer config has no patch size: it takes 2x2 tokens. Qwen3-VL reads text.
    memory = MemorySpec(latent_packing=2, text_encoder_kind="llm")
    # validation.model on Krea 2 Turbo: 8 steps, no guidance (its model card; the
    # pipeline guides whenever the scale is > 0)
    validation = ValidationSpec(mask_kwarg="prompt_embeds_mask", distilled=(8, 0.0))
    # Qwen-Image's tokenizer (Krea 2's text encoder is a Qwen one).
    random = dataclasses.replace(QwenImageFamily.random, settings=random_settings)

    # ------------------------------------------------------------ loading

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None) -> Components:
        """FlowFamily's load; it takes no denoiser built already, so a Krea 2 folder is
        read whole, not streamed (core/config/streaming.py), as it always was."""
        return FlowFamily.load(self, path, dtype=dtype, device=device, config=config)

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        return Krea2Components(
            family=self.name, source=source, fingerprint=fp, vae=pipe.vae,
            denoiser=pipe.transformer, text_encoders=[pipe.text_encoder],
            tokenizers=[pipe.tokenizer], noise_scheduler=pipe.scheduler,
            is_distilled=bool(pipe.config.get("is_distilled", False)),
            text_layers=tuple(pipe.text_encoder_select_layers))

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [L_i, 12 x D] (its real tokens, template system part
        dropped), prompt_mask [L_i] all True."""
        import torch

        pipe = self.validation_pipeline(c)
        with torch.no_grad():
            embeds, mask = pipe.encode_prompt(prompt=prompts, device=c.text_encoders[0].device,
                                              max_sequence_length=self.sequence_length(c))
        out = []
        for e, m in zip(embeds, mask, strict=True):
            real = e[m].flatten(1)
            out.append({"prompt_embeds": real,
                        "prompt_mask": torch.ones(real.shape[0], dtype=torch.bool,
                                                  device=real.device)})
        return out

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """Pack 2x2, run the transformer with position ids and the text key mask, unpack."""
        from diffusers import Krea2Pipeline, QwenImagePipeline

        model = c.denoiser
        inner = unwrap(model)
        dtype = inner.dtype
        noisy = sample.noisy.to(dtype)
        b, ch, h, w = noisy.shape
        if h % 2 or w % 2:
            raise ValueError(f"krea2 latents must have even height and width, got {h}x{w}: "
                             "use image sides that are multiples of 16 pixels")
        device = noisy.device
        packed = QwenImagePipeline._pack_latents(noisy, b, ch, h, w)  # Krea 2's 2x2 packing
        embeds = batch["prompt_embeds"].to(device, dtype)
        embeds = embeds.unflatten(-1, (int(inner.config.num_text_layers), -1))
        mask = batch["prompt_mask"].to(device).bool()
        ids = Krea2Pipeline.prepare_position_ids(embeds.shape[1], h // 2, w // 2, device)
        out = model(hidden_states=packed, encoder_hidden_states=embeds,
                    timestep=(sample.timesteps.to(device) / 1000).to(dtype),
                    position_ids=ids, encoder_attention_mask=None if bool(mask.all()) else mask,
                    return_dict=False)[0]
        scale = 2 ** len(c.vae.temperal_downsample)
        return QwenImagePipeline._unpack_latents(out, h * scale, w * scale, scale).squeeze(2)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return LORA_TARGETS + (LORA_EXTRA if scope == "all" else [])

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """A Krea2Pipeline sharing the loaded modules (its own scheduler, the model's taps
        and distilled flag), taking the cache's flattened embeddings."""
        pipe = _validation_pipeline_class()(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            text_encoder_select_layers=text_layers(c), is_distilled=c.is_distilled)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def config_problems(self, cfg: Any) -> list[Any]:
        """A Turbo (distilled) checkpoint, a folder missing a component (checks.py)."""
        from core.models.families.krea2.checks import model_problems

        return model_problems(cfg.model.path)


FAMILY = Krea2Family()
