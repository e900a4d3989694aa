"""Qwen-Image: a 20B MMDiT (QwenImageTransformer2DModel), a Qwen2.5-VL-7B text encoder, a
Wan-style causal 3D VAE (AutoencoderKLQwenImage), flow matching. Follows QwenImagePipeline
and diffusers' examples/dreambooth/train_dreambooth_lora_qwen_image.py.

Text, as QwenImagePipeline.encode_prompt builds it (that method is called): each prompt
goes into the pipeline's chat template, Qwen2.5-VL's last hidden states (hidden_states[-1])
are kept for the real tokens, and the first `prompt_template_encode_start_idx` (34) of
them, the template's system part, are dropped; at most `max_sequence_length` = 512 remain
(the training script's default). So the length varies per prompt: each prompt's dict holds
only its own tokens (mask all True), as if encoded alone, and collate pads a batch to its
longest with the mask False on the padding. `predict` passes that mask as
`encoder_hidden_states_mask` exactly as the pipeline and the script do: a long 0/1 tensor,
or None when no item is padded (their encode_prompt and concat drop an all-ones mask).

Latents: the VAE encodes [B, 3, 1, H, W] (one frame) to [B, 16, 1, H/8, W/8];
`encode_images` normalises them per channel, (z - latents_mean) / latents_std, as the
script does, and drops the frame axis, so caches hold [B, 16, h, w] like every family.
`predict` packs 2x2 patches with QwenImagePipeline._pack_latents, gives
img_shapes = [(1, h/2, w/2)] per item, and unpacks the output (dropping the frame axis
again); the validation pipeline decodes with the same normalisation undone.

Sigmas, as the script samples them: u ~ U(0, 1) (its default weighting scheme "none"),
index = floor(u * 1000), sigma = the scheduler's training sigma table at that index. The
real scheduler config has use_dynamic_shifting = true, so that table is unshifted (the
scheduler shifts only at inference, by calculate_shift of the image sequence length, which
the validation pipeline does): sigmas are k/1000, k = 1..1000. Timesteps given to the
transformer are sigma (the pipeline's timestep / 1000). Loss: MSE against noise - latents.

Guidance: Qwen-Image is not guidance-distilled (guidance_embeds false; the transformer's
guidance path is unused, so training passes none). Validation uses true classifier-free
guidance with the empty prompt as negative: `validation.guidance_scale` becomes the
pipeline's `true_cfg_scale` (see `validation_pipeline`).

LoRA: the script's default targets (to_k, to_q, to_v, to_out.0: the image stream's
attention), saved through QwenImagePipeline.save_lora_weights; ComfyUI reads
"transformer.<diffusers module>" keys for Qwen-Image (comfy/lora.py, model_base.QwenImage:
its module names are diffusers'), which lora_comfyui.safetensors holds with `.alpha`.
Single files: ComfyUI's diffusion-model file (diffusers' names under
`model.diffusion_model.`, bf16, fp8 or fp8_scaled) loads its transformer through
QwenImageTransformer2DModel.from_single_file, the rest from model.config
(QwenImagePipeline itself has no from_single_file).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, RandomSpec, SingleFileSpec
from core.models.flow import FlowFamily
from core.models.geometry import Geometry
from core.models.modules import encode_causal_latents, unwrap
from core.models.routing import RoutingSpec, Slot

# diffusers' train_dreambooth_lora_qwen_image.py default (--lora_layers unset).
LORA_TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]
# scope "all": the text stream's attention, both streams' MLPs and the output projection.
LORA_EXTRA = ["add_k_proj", "add_q_proj", "add_v_proj", "to_add_out", "img_mlp.net.0.proj",
              "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2", "proj_out"]


@functools.cache
def _validation_pipeline_class() -> Any:
    """QwenImagePipeline whose `guidance_scale` is its true-CFG scale (built on first use,
    so importing this module needs no diffusers)."""
    from diffusers import QwenImagePipeline

    class QwenImageValidationPipeline(QwenImagePipeline):
        """The trainer's validation passes `guidance_scale` and the empty prompt's
        `negative_prompt_embeds`; a model that is not guidance-distilled takes that scale
        as `true_cfg_scale` (4.0 is the pipeline's own default). Embeddings given without
        a mask are one prompt's own tokens, all real."""

        def __call__(self, *args: Any, guidance_scale: float | None = None,
                     **kwargs: Any) -> Any:
            guidance_scale = validation_call_kwargs(self.transformer, guidance_scale, kwargs)
            return super().__call__(*args, guidance_scale=guidance_scale, **kwargs)

    return QwenImageValidationPipeline


def validation_call_kwargs(transformer: Any, guidance_scale: float | None,
                           kwargs: dict[str, Any]) -> float | None:
    """A Qwen-Image pipeline call from the trainer's validation, made right in place: a
    model that is not guidance-distilled takes `guidance_scale` as `true_cfg_scale`
    (returned None then), and embeddings given without a mask are one unpadded prompt,
    every token real (the pipeline then drops the all-ones mask, and does not warn that
    none was given). Returns the guidance_scale to pass on."""
    import torch

    if not transformer.config.guidance_embeds and guidance_scale is not None:
        kwargs.setdefault("true_cfg_scale", guidance_scale)
        guidance_scale = None
    for key in ("prompt_embeds", "negative_prompt_embeds"):
        embeds = kwargs.get(key)
        if embeds is not None and kwargs.get(f"{key}_mask") is None:
            kwargs[f"{key}_mask"] = embeds.new_ones(embeds.shape[:2], dtype=torch.long)
    return guidance_scale


def random_tokenizer(cls: str, folder: Path, bang_padded: bool) -> Any:
    """random:qwen_image's Qwen2.5-VL tokenizer (and template): the tiny build's."""
    from core.models.tiny.qwen import qwen_tokenizer

    return qwen_tokenizer(folder)


class QwenImageFamily(FlowFamily):
    name = "qwen_image"
    # Wan's causal video VAE, given one frame (its temporal factor unused for stills).
    geometry = Geometry(latent_channels=16, temporal_compression=4)
    block_lists = ("transformer_blocks",)
    # train.token_routing: a block takes (hidden_states, encoder_hidden_states,
    # encoder_hidden_states_mask, temb, image_rotary_emb, attention_kwargs, modulate_index)
    # and gives (encoder_hidden_states, hidden_states); the rotary embedding is an (image,
    # text) pair, the image rows [S, D] first; the edit models' modulate_index holds one
    # entry per image token ([B, S]: target or reference) and is narrowed with them.
    routing = RoutingSpec(hidden=Slot(0, "hidden_states"), rope=Slot(4, "image_rotary_emb"),
                          rope_part=0, per_token=(Slot(6, "modulate_index", ndim=2),), output=1)
    # Original-format single files and diffusers folders (core/models/loading.py).
    # its text RMSNorm (diffusers and ComfyUI names)
    single_file = SingleFileSpec(markers=("txt_norm.",), rank=60)
    pipeline_prefix = "QwenImage"
    text_encoder_count = 1
    pipeline_class_name = "QwenImagePipeline"
    transformer_class_name = "QwenImageTransformer2DModel"
    single_file_default_config = "Qwen/Qwen-Image"
    max_sequence_length = 512
    memory = MemorySpec(text_encoder_kind="llm")  # Qwen2.5-VL
    timestep_sampling = "uniform"
    random = RandomSpec(tokenizer=random_tokenizer)

    # ------------------------------------------------------------ loading

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [L_i, D] with L_i its own token count (template
        dropped, at most max_sequence_length), prompt_mask [L_i] all True."""
        import torch

        pipe = self.validation_pipeline(c)
        with torch.no_grad():
            embeds, mask = pipe.encode_prompt(prompt=prompts, device=c.text_encoders[0].device,
                                              max_sequence_length=self.sequence_length(c))
        lengths = (mask.sum(dim=1).tolist() if mask is not None
                   else [embeds.shape[1]] * len(prompts))
        return [{"prompt_embeds": embeds[i, :n],
                 "prompt_mask": torch.ones(n, dtype=torch.bool, device=embeds.device)}
                for i, n in enumerate(int(v) for v in lengths)]

    # ------------------------------------------------------------ images

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """(z - latents_mean) / latents_std of pixels in [-1, 1], [B, 16, H/8, W/8]: the
        posterior mean without a generator, a posterior sample with one (the script's
        latent_dist.sample()); the one-frame axis dropped."""
        return encode_causal_latents(c.vae, pixels.unsqueeze(2), generator).squeeze(2)

    # ------------------------------------------------------------ training

    def draw_sigmas(self, c: Components, n: int, generator: Any, device: Any) -> Any:
        """Uniform (the default): the script's draw, u then the scheduler's training sigma
        table indexed by floor(u * num_train_timesteps), shifted by the run's flow_shift
        or the scheduler's static shift (none for dynamic shifting). Any other sampling
        draws as every flow family does."""
        import torch

        from core.models.objectives import shift_sigmas

        s = self.flow_settings(c)
        if s.timestep_sampling != "uniform":
            return super().draw_sigmas(c, n, generator, device)
        steps = int(c.noise_scheduler.config.get("num_train_timesteps", 1000))
        table = shift_sigmas(torch.linspace(1, steps, steps, dtype=torch.float32).flip(0)
                             / steps, s.shift)
        draw_on = generator.device if generator is not None else device
        u = torch.rand(n, generator=generator, device=draw_on, dtype=torch.float32)
        return table[(u * steps).long().cpu()].to(device)

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """Pack, run the transformer with img_shapes and the text mask, unpack."""
        from diffusers import QwenImagePipeline

        model = c.denoiser
        dtype = unwrap(model).dtype
        noisy = sample.noisy.to(dtype)
        b, ch, h, w = noisy.shape
        if h % 2 or w % 2:
            raise ValueError(f"qwen_image latents must have even height and width, got "
                             f"{h}x{w}: use image sides that are multiples of 16 pixels")
        device = noisy.device
        packed = QwenImagePipeline._pack_latents(noisy, b, ch, h, w)
        embeds = batch["prompt_embeds"].to(device, dtype)
        mask = batch["prompt_mask"].to(device)
        out = model(
            hidden_states=packed, encoder_hidden_states=embeds,
            encoder_hidden_states_mask=None if bool(mask.all()) else mask.long(),
            timestep=(sample.timesteps.to(device) / 1000).to(dtype),
            img_shapes=[(1, h // 2, w // 2)] * b, return_dict=False)[0]
        scale = 2 ** len(c.vae.temperal_downsample)
        return QwenImagePipeline._unpack_latents(out, h * scale, w * scale, scale).squeeze(2)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return LORA_TARGETS + (LORA_EXTRA if scope == "all" else [])

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """A QwenImagePipeline sharing the loaded modules (its own scheduler), whose
        `guidance_scale` is the true-CFG scale. Its default max_sequence_length (512) is
        the training one."""
        pipe = _validation_pipeline_class()(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0])
        pipe.set_progress_bar_config(disable=True)
        return pipe


    def config_problems(self, cfg: Any) -> list[Any]:
        """Qwen-Image's scheduler stretches its sigmas to end at `shift_terminal`; with one
        sampling step that stretch divides by zero and the validation image is NaN."""
        from core.problems import error

        if not cfg.validation.prompts or cfg.validation.steps >= 2:
            return []
        return [error("validation.steps", f"{cfg.validation.steps} sampling step gives NaN "
                                          "images with Qwen-Image's scheduler; use 2 or more")]


FAMILY = QwenImageFamily()
