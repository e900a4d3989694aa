"""Qwen-Image 2.1: a single-stream, block-causal DiT (QwenImage21Transformer2DModel), a
Qwen3-VL-8B text encoder (Qwen3VLForConditionalGeneration behind a Qwen3VLProcessor), its
own RGBA causal VAE (AutoencoderKLQwenImage21), flow matching. Follows diffusers 0.42.1's
QwenImage21Pipeline (pipelines/qwenimage21) and its modular pipelines; diffusers ships no
training script for it, so what sampling does not fix follows qwen_image's (the
Qwen-Image trainer's), which this family extends.

What differs from Qwen-Image 1 (qwen_image/family.py), from the diffusers source:
- Transformer: one stream of 32 blocks (width 4096 = 32 heads x 128, SwiGLU MLP ratio 3,
  no biases) over text and image tokens together, in place of 60 dual-stream MMDiT blocks
  at 3072; one `modulation` projection shared by every block; `causal_condition`: text
  tokens are modulated from t = 0 and attention is block-causal (text causal, each image
  block bidirectional, the target image seeing everything), so no subset of image tokens
  can be routed past a block (routing = None). Latents are not patched (patch_size 1):
  one token per 16x16 pixels, and each 2x2 group of them fills one `img_mask` slot
  appended after the text. Rotary axes (16, 56, 56): text advances all three; the image
  block sits at the frame position after the text, its height/width centred on zero.
- Text encoder: Qwen3-VL-8B (hidden 4096 = the transformer's context_in_dim) in place of
  Qwen2.5-VL-7B, read through a processor; the template's system line is "Comprehend and
  analyze the provided prompt." (its token count derived from the processor, not a fixed
  34), prompts are left-padded, hidden_states[-1] is taken before the final RMSNorm (a
  hook, as the pipeline does), the system tokens are dropped and there is no truncation to
  a max_sequence_length (512 is kept for the memory estimate). An empty prompt becomes " ".
- VAE: AutoencoderKLQwenImage21, 64 latent channels, 16x in space (8x in time), four
  input channels: pixels are RGBA, opaque images with alpha 1 (the pipeline converts to
  RGBA before preprocessing); normalised per channel with latents_mean/latents_std.
- Shift: the scheduler shifts dynamically at inference, calculate_shift of the image token
  count with the pipeline's fallbacks (256 -> 0.5 to 4096 -> 1.15; Qwen-Image: up to 8192
  -> 0.9 with shift_terminal 0.02, which 2.1's scheduler does not use), on
  linspace(1, 1/N, N) or the checkpoint's `sample_sigmas` (Turbo's grid).
- Guidance: none in the transformer, and the pipeline's default true_cfg_scale is 1.0
  ("meant to be sampled without guidance"; Qwen-Image 1 defaults to 4.0): validation's
  guidance_scale is passed as true_cfg_scale, which guides only above 1 with a negative.

Text cache: per prompt its real tokens only ([L_i, 4096], mask all True); collate pads a
batch to its longest, mask False, as encode_prompt right-pads a batch (and the
transformer drops padded keys; the image block's frame position follows the padded text
length, in the pipeline's batches as in ours). Latents: [B, 64, H/16, W/16].
`predict` flattens them (QwenImage21Pipeline._pack_latents), gives img_shapes [(1, h, w)]
and img_mask (zeros over the text, ones over the h*w/4 slots), timestep sigma, the text
mask (None when all real), keeps the last h*w tokens of the output and unflattens them.

Sigmas: no reference trainer, so the Qwen-Image trainer's draw (qwen_image: uniform u,
the scheduler's unshifted training table at floor(u * 1000); the shift is inference's).
Loss: MSE against noise - latents. LoRA: to_q/to_k/to_v/to_out.0 of every block (the same
names as Qwen-Image's default); "all" adds the SwiGLU MLPs and the input/output
projections. Files through QwenImage21Pipeline.save_lora_weights (QwenImageLoraLoaderMixin).
ComfyUI 0.29.0 has no Qwen-Image 2.1 model (its qwen_image is Qwen-Image 1's MMDiT), so
no lora_comfyui.safetensors is written.

Distilled: Qwen-Image 2.1 Turbo (`sample_sigmas` in its pipeline config) is recognised
(`is_distilled`) and warned about at check (checks.py). Single files (diffusers reads
the transformer's, marked by txt_in.text_norm.) are refused: use a diffusers folder.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.models import loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import RandomSpec, SingleFileSpec
from core.models.components import extended
from core.models.families.qwen_image.family import QwenImageFamily
from core.models.geometry import Geometry
from core.models.modules import encode_causal_latents, unwrap

LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
LORA_EXTRA = ["img_mlp.proj", "img_mlp.gate_layer", "img_mlp.out", "img_in",
              "txt_in.in_layer", "txt_in.out_layer", "proj_out"]


@dataclass
class QwenImage21Components(Components):
    """A loaded Qwen-Image 2.1: its processor and the checkpoint's sampling grid (Turbo's;
    None for the base) beside the shared fields."""

    processor: Any = None
    sample_sigmas: list[float] | None = None
    is_distilled: bool = False  # Turbo (validation.model reads it)


def random_tokenizer(cls: str, folder: Path, bang_padded: bool) -> Any:
    """random:qwen_image21's tokenizer: the tiny build's Qwen3 one."""
    from core.models.families.qwen_image21.tiny import tokenizer

    return tokenizer(folder)


def random_settings(c: Components) -> QwenImage21Components:
    """random:qwen_image21 as `load` gives it: its index names a processor, not a
    tokenizer, so the tiny tokenizer is built here (the processor over it on use,
    `processor_of`)."""
    import tempfile

    if not c.tokenizers:
        with tempfile.TemporaryDirectory(prefix="random-tokenizer-") as tmp:
            c.tokenizers = [random_tokenizer("", Path(tmp) / "tokenizer", False)]
    return extended(c, QwenImage21Components)


@functools.cache
def _validation_pipeline_class() -> Any:
    """QwenImage21Pipeline taking the trainer's validation call (built on first use)."""
    from diffusers import QwenImage21Pipeline

    class QwenImage21ValidationPipeline(QwenImage21Pipeline):
        """`guidance_scale` is passed on as true_cfg_scale (the model has no guidance
        input); embeddings given without a mask are one prompt's real tokens."""

        def __call__(self, *args: Any, guidance_scale: float | None = None,
                     **kwargs: Any) -> Any:
            if guidance_scale is not None:
                kwargs.setdefault("true_cfg_scale", guidance_scale)
            for key in ("prompt_embeds", "negative_prompt_embeds"):
                embeds = kwargs.get(key)
                if embeds is not None and kwargs.get(f"{key}_mask") is None:
                    kwargs[f"{key}_mask"] = embeds.new_ones(embeds.shape[:2]).bool()
            return super().__call__(*args, **kwargs)

    return QwenImage21ValidationPipeline


def processor_of(c: Components) -> Any:
    """The loaded processor; random:'s Components get the tiny one over their tokenizer."""
    found = getattr(c, "processor", None)
    if found is not None:
        return found
    from core.models.families.qwen_image21.tiny import processor

    return processor(c.tokenizers[0])


def rgba(pixels: Any) -> Any:
    """[B, 3, ...] pixels in [-1, 1] with an opaque alpha channel (1.0), as the pipeline's
    RGBA conversion and preprocessing give the VAE."""
    import torch

    return torch.cat([pixels, torch.ones_like(pixels[:, :1])], dim=1)


class QwenImage21Family(QwenImageFamily):
    name = "qwen_image21"
    geometry = Geometry(latent_channels=64, spatial_compression=16, temporal_compression=8,
                        spatial_multiple=32)
    block_lists = ("transformer_blocks",)
    routing = None  # block-causal joint sequence (see the module docstring)
    # diffusers' single-file key for Qwen-Image 2.1 (single_file_utils.py CHECKPOINT_KEY_NAMES)
    single_file = SingleFileSpec(markers=("txt_in.text_norm.",), rank=55)
    pipeline_prefix = "QwenImage21"
    pipeline_class_name = "QwenImage21Pipeline"
    # No ComfyUI or single-file transformer to read (load refuses files): not Qwen-Image's.
    transformer_class_name = ""
    # validation.model on Qwen-Image 2.1 Turbo: the Turbo blocks' 8 steps, no guidance
    # (the pipeline samples its shipped sample_sigmas, whatever the step count)
    validation = dataclasses.replace(QwenImageFamily.validation, distilled=(8, 1.0))
    random = RandomSpec(tokenizer=random_tokenizer, settings=random_settings)

    # ------------------------------------------------------------ loading

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None, denoiser: Any = None) -> Components:
        """A diffusers folder or hub id; a single file is refused (see the docstring)."""
        if loading.checked_source(path, self.name) == "file":
            raise loading.ModelLoadError(
                path, "is a single-file Qwen-Image 2.1 checkpoint, but QwenImage21Pipeline "
                "cannot load one file: set model.path to a diffusers folder (the one holding "
                "model_index.json, e.g. a download of Qwen/Qwen-Image-2.1) or that hub id")
        return super(QwenImageFamily, self).load(path, dtype=dtype, device=device,
                                                 config=config, denoiser=denoiser)

    def _pretrained_components(self, path: str, kind: loading.SourceKind) -> dict[str, Any]:
        """The processor, loaded by processor.py (transformers needs torchvision for it)."""
        from core.models.families.qwen_image21.processor import load_processor

        return {"processor": load_processor(path, kind == "folder")}

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        sigmas = pipe.config.get("sample_sigmas")
        return QwenImage21Components(
            family=self.name, source=source, fingerprint=fp, vae=pipe.vae,
            denoiser=pipe.transformer, text_encoders=[pipe.text_encoder],
            tokenizers=[pipe.processor.tokenizer], noise_scheduler=pipe.scheduler,
            is_distilled=bool(sigmas),
            processor=pipe.processor, sample_sigmas=list(sigmas) if sigmas else None)

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [L_i, D] (its real tokens, the system part dropped),
        prompt_mask [L_i] all True (QwenImage21Pipeline.encode_prompt, batched)."""
        import torch

        pipe = self.validation_pipeline(c)
        with torch.no_grad():
            embeds, mask, _ = pipe.encode_prompt(prompt=prompts,
                                                 device=c.text_encoders[0].device)
        lengths = (mask.sum(dim=1).tolist() if mask is not None
                   else [embeds.shape[1]] * len(prompts))
        return [{"prompt_embeds": embeds[i, :n],
                 "prompt_mask": torch.ones(n, dtype=torch.bool, device=embeds.device)}
                for i, n in enumerate(int(v) for v in lengths)]

    # ------------------------------------------------------------ images

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """(z - latents_mean) / latents_std of opaque RGBA pixels, [B, 64, H/16, W/16]: the
        posterior mean without a generator, a sample with one; the frame axis dropped."""
        return encode_causal_latents(c.vae, rgba(pixels).unsqueeze(2), generator).squeeze(2)

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """Flatten, run the transformer with img_shapes, img_mask and the text mask, keep
        the target tokens, unflatten (see the module docstring)."""
        import torch
        from diffusers import QwenImage21Pipeline

        model = c.denoiser
        noisy = sample.noisy.to(unwrap(model).dtype).contiguous()
        b, ch, h, w = noisy.shape
        if h % 2 or w % 2:
            raise ValueError(f"qwen_image21 latents must have even height and width, got "
                             f"{h}x{w}: use image sides that are multiples of 32 pixels")
        device = noisy.device
        embeds = batch["prompt_embeds"].to(device, noisy.dtype)
        mask = batch["prompt_mask"].to(device).bool()
        slots = torch.ones(b, h * w // 4, dtype=torch.bool, device=device)
        out = model(
            hidden_states=QwenImage21Pipeline._pack_latents(noisy, b, ch, h, w),
            encoder_hidden_states=embeds, timestep=(sample.timesteps.to(device) / 1000).to(
                noisy.dtype), img_shapes=[[(1, h, w)]] * b,
            img_mask=torch.cat([torch.zeros_like(mask), slots], dim=1),
            encoder_hidden_states_mask=None if bool(mask.all()) else mask,
            return_dict=False)[0]
        return out[:, -h * w:].transpose(1, 2).reshape(b, ch, h, w)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return LORA_TARGETS + (LORA_EXTRA if scope == "all" else [])

    def _save_comfy(self, c: Components, peft_sd: dict[str, Any], config: Any,
                    path: Any) -> None:
        """None: ComfyUI 0.29.0 has no Qwen-Image 2.1 model to map a file onto."""
        return None

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """A QwenImage21Pipeline sharing the loaded modules (its own scheduler, the
        checkpoint's sample_sigmas), taking guidance_scale as true_cfg_scale."""
        pipe = _validation_pipeline_class()(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], processor=processor_of(c),
            sample_sigmas=getattr(c, "sample_sigmas", None))
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def config_problems(self, cfg: Any) -> list[Any]:
        """A Turbo checkpoint, a folder missing a component (checks.py)."""
        from core.models.families.qwen_image21.checks import model_problems

        return model_problems(cfg.model.path)


FAMILY = QwenImage21Family()
