"""Wan 2.1 / 2.2 text-to-video (Wan-AI/Wan2.1-T2V-1.3B and -14B, their Diffusers
folders): a video DiT (WanTransformer3DModel, patches of 1x2x2 latent voxels), a UMT5-XXL
text encoder, the causal 3D VAE AutoencoderKLWan (8x in space, 4x in time: F frames
become 1 + (F - 1) / 4 latent frames), flow matching. Follows WanPipeline.

Text, as WanPipeline.encode_prompt builds it (that method is called): tokens padded to
`max_sequence_length` = 512 (the pipeline's __call__ default), UMT5's last hidden state
for the real tokens, and zeros in place of the padding, so every prompt is [512, 4096];
the transformer takes no mask (nor does the pipeline give one), so `prompt_mask` only
marks the real tokens and collate never pads.

Latents: `encode_images` takes pixels [B, 3, H, W] (an image, one frame) or
[B, 3, F, H, W] (a clip, F = 4k + 1) and gives (z - latents_mean) / latents_std,
[B, 16, F', H/8, W/8], as the pipeline undoes before decoding. The frame axis stays: an
image's latents are [16, 1, h, w], so images and clips train through one path, and
batches group by that shape (frames and size).

Sigmas: uniform, then shifted by the scheduler's `flow_shift` (3.0 for the 480p models,
the value Wan samples with), the shifted-uniform draw of musubi-tuner and diffusion-pipe's
Wan training (musubi's `--timestep_sampling shift --discrete_flow_shift 3.0`).
train.flow_shift overrides it (Wan's authors sample 720p at 5.0). The transformer gets
t = sigma * 1000, as the pipeline passes the scheduler's timesteps; the loss is MSE
against noise - latents (its flow_prediction).

LoRA: the attention projections of both attentions in every block (self-attention over
the video tokens and cross-attention to the text), as musubi-tuner and diffusers' Wan
LoRA loader name them; "all" adds the feed-forwards. Files: pytorch_lora_weights
(WanPipeline.save_lora_weights; `load_lora_weights` reads it) and lora_comfyui.safetensors
in Wan's original module names under "diffusion_model." (blocks.N.self_attn.q, ...),
which ComfyUI maps to its Wan model's weights as it maps any "diffusion_model.<key>"
LoRA, and which diffusers' Wan loader also converts (the tests load it that way).

Single files: ComfyUI's wan2.1_t2v_*.safetensors hold only the diffusion model;
WanTransformer3DModel.from_single_file reads it and model.config gives the rest.

Wan 2.2 A14B (two experts: `transformer` above boundary_ratio * 1000, `transformer_2`
below, as WanPipeline samples): the denoiser is experts.py's WanExperts, which routes each
sample to the expert of its timestep. model.experts (`configure_run`) trains both (each
its own LoRA) or one, whose range alone the sigmas are then drawn from (`draw_sigmas`:
the same draw, renormalised inside the range); the eval still scores every timestep,
the frozen expert's included. Files: one set per trained expert (expert_files.py).
Validation samples with both experts, as the pipeline does (guidance_scale for both).
tiny:wan22 (tiny22/) is its tiny model; expert_checks.py refuses what it does not take.

Image-to-video (a folder whose model_index.json names WanImageToVideoPipeline: Wan 2.1
I2V with its CLIP image encoder, Wan 2.2 I2V A14B without): i2v.py, which says how the
first-frame condition is cached and fed; tiny:wan_i2v (tiny_i2v/) is its tiny model.

Wan 2.2 TI2V-5B (a WanPipeline folder whose config sets expand_timesteps): text-to-video
with per-token timesteps and the 48-channel, 16x VAE, as ti2v.py says; tiny:wan_ti2v
(tiny_ti2v/) is its tiny model. Its image-conditioned mode is not trained (ti2v.py).

Not yet here: I2V single files
(whose config must come from an I2V folder), first-last-frame models (FLF2V), a
validation image per prompt (I2V validation starts from a fixed synthetic image,
video_pipeline.synthetic_image), Wan 2.2 as two single files (one per expert), a starting LoRA
(train.init_lora) or FSDP for two experts; a model or config that needs them is refused
(at load, at the check where the model is known without loading, or when the run starts).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from core.models import loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, SingleFileSpec
from core.models.families.wan.comfy import save_comfy
from core.models.families.wan.expert_checks import BOTH, expert_problems, run_refusal
from core.models.families.wan.expert_spec import EXPERTS, experts_in
from core.models.families.wan.i2v import (
    FIRST_IMAGE,
    I2V_PIPELINE,
    condition_inputs,
    encode_condition,
    i2v_components,
    is_i2v,
)
from core.models.families.wan.pipelines import validation_pipeline_class
from core.models.families.wan.ti2v import (
    EXPAND_TIMESTEPS,
    expands_timesteps,
    is_ti2v,
    ti2v_components,
    token_timesteps,
)
from core.models.flow import FlowFamily
from core.models.geometry import Geometry
from core.models.modules import encode_causal_latents, freeze, unwrap
from core.models.routing import RoutingSpec, Slot
from core.models.source import pipeline_class_or

ATTENTION = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
             "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"]
FEED_FORWARD = ["ffn.net.0.proj", "ffn.net.2"]


def activation_layout(config: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The memory estimate's MMDiT formula over Wan's blocks: self-attention over the
    video tokens (patch 2 in space; the frames multiply the tokens), one block per
    layer. Not calibrated on a measured Wan run."""
    return ({"num_attention_heads": int(config.get("num_attention_heads", 12)),
             "attention_head_dim": int(config.get("attention_head_dim", 128)),
             "num_layers": int(config.get("num_layers", 30))},
            int(list(config.get("patch_size", [1, 2, 2]))[-1]))


class WanFamily(FlowFamily):
    name = "wan"
    block_lists = ("blocks",)
    # train.token_routing: a block takes (hidden_states, encoder_hidden_states, temb,
    # rotary_emb); the rotary table is (cos, sin), each [1, S, 1, D]; TI2V's temb holds one
    # row per token ([B, S, 6, D]) and is narrowed with them.
    routing = RoutingSpec(hidden=Slot(0, "hidden_states"), rope=Slot(3, "rotary_emb"),
                          rope_axis=1, per_token=(Slot(2, "temb", ndim=4),))
    # Wan's causal VAE: 4k + 1 frames, 4 to a latent frame, 8x8 pixels to a latent; the
    # transformer packs 2x2 latents (TI2V-5B's VAE packs 2x2 pixels first: 16x16).
    # 16 fps: Wan's training rate (WanPipeline's examples export at 16).
    geometry = Geometry(video=True, frame_step=4, temporal_compression=4, fps=16.0,
                        latent_channels=16, spatial_multiple=16)
    first_image = FIRST_IMAGE  # a WanImageToVideoPipeline folder (i2v.py)
    # Original-format single files (the diffusion model alone) and diffusers folders.
    single_file = SingleFileSpec(markers=("head.modulation",), rank=40)
    # Wan 2.2 A14B's high- and low-noise experts (expert_spec.py).
    experts = EXPERTS
    pipeline_prefix = "Wan"
    transformer_class_name = "WanTransformer3DModel"
    single_file_default_config = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    text_encoder_count = 1
    pipeline_class_name = "WanPipeline"
    max_sequence_length = 512
    memory = MemorySpec(activation_layout=activation_layout)
    timestep_sampling = "uniform"
    # tiny:wan22, a random two-expert Wan 2.2 (tiny22/ says why it goes through here).
    trained_tiny = (("wan22", "core.models.families.wan.tiny22"),
                    ("wan_i2v", "core.models.families.wan.tiny_i2v"),
                    ("wan_ti2v", "core.models.families.wan.tiny_ti2v"))

    # ------------------------------------------------------------ loading

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None) -> Components:
        """FlowFamily's load; an image-to-video model's image encoder, frozen on `device`
        beside the other modules."""
        c = super().load(path, dtype=dtype, device=device, config=config)
        if is_i2v(c):
            freeze([c.image_encoder], device)
        return c

    def _pretrained_class(self, path: str, kind: loading.SourceKind) -> Any:
        """The folder's own pipeline class: WanImageToVideoPipeline where model_index.json
        names it (i2v.py), WanPipeline otherwise."""
        import diffusers

        return getattr(diffusers,
                       pipeline_class_or(path, I2V_PIPELINE, self.pipeline_class_name))

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        """One transformer (Wan 2.1, Wan 2.2 TI2V-5B), or Wan 2.2's two experts as one
        WanExperts; refuse what this family does not train yet (see the module
        docstring). TI2V is known by the pipeline's own expand_timesteps (ti2v.py)."""
        ti2v = expands_timesteps(pipe, source)  # refuses TI2V I2V and TI2V two experts
        c = super()._components_from_pipeline(pipe, source, fp)
        second = getattr(pipe, "transformer_2", None)
        if second is not None or pipe.transformer is None:
            c.denoiser = self._two_experts(pipe, second, source)
        c = i2v_components(c, pipe, source)
        return ti2v_components(c) if ti2v else c

    @staticmethod
    def _two_experts(pipe: Any, second: Any, source: str) -> Any:
        """WanExperts of the pipeline's transformer (high noise) and transformer_2 (low
        noise), split where the pipeline splits them."""
        from core.models.families.wan.experts import WanExperts

        ratio = pipe.config.get("boundary_ratio")
        if pipe.transformer is None or second is None or ratio is None:
            raise loading.ModelLoadError(source, "is a Wan folder with one of transformer / "
                                         "transformer_2 / boundary_ratio missing from "
                                         "model_index.json: a Wan 2.2 A14B folder has all "
                                         "three, a Wan 2.1 folder only transformer")
        steps = int(pipe.scheduler.config.get("num_train_timesteps", 1000))
        return WanExperts(pipe.transformer, second, ratio, steps)

    def config_problems(self, cfg: Any) -> list[Any]:
        """model.experts against the model's experts, where known without loading it."""
        return expert_problems(cfg)

    def configure_run(self, c: Components, cfg: Any) -> None:
        """model.experts onto the loaded model: which expert gets the adapter (or, in a
        full fine-tune, trains) and whose range the sigmas are drawn from."""
        experts = experts_in(c.denoiser)
        refused = run_refusal(cfg, 1 if experts is None else 2)
        if refused is not None:
            raise ValueError(": ".join(refused))
        if experts is not None:
            experts.trained_expert = cfg.model.experts

    def train_shift(self, c: Components) -> float:
        """The scheduler's flow_shift (UniPC's name for it; 1 when absent)."""
        return float(c.noise_scheduler.config.get("flow_shift", 1.0) or 1.0)

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [512, D] (zeros after the real tokens, as the
        pipeline pads) and prompt_mask [512] marking the real tokens."""
        import torch

        pipe = self._text_pipeline(c)
        length = self.sequence_length(c)
        device = c.text_encoders[0].device
        with torch.no_grad():
            embeds, _ = pipe.encode_prompt(prompt=prompts, do_classifier_free_guidance=False,
                                           max_sequence_length=length, device=device)
            real = c.tokenizers[0](prompts, padding="max_length", max_length=length,
                                   truncation=True, return_tensors="pt").attention_mask
        return [{"prompt_embeds": embeds[i], "prompt_mask": real[i].bool().to(embeds.device)}
                for i in range(len(prompts))]

    def _text_pipeline(self, c: Components) -> Any:
        """A pipeline whose encode_prompt encodes the text: the validation pipeline, or
        for image-to-video a text-only WanPipeline (the same encode_prompt, copied in
        diffusers; WanImageToVideoPipeline's prompt cleaning calls ftfy unguarded)."""
        if not is_i2v(c):
            return self.validation_pipeline(c)
        from diffusers import WanPipeline

        return WanPipeline(tokenizer=c.tokenizers[0], text_encoder=c.text_encoders[0],
                           vae=c.vae, scheduler=c.noise_scheduler, transformer=None)

    # ------------------------------------------------------------ pixels

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """(z - latents_mean) / latents_std of pixels in [-1, 1], [B, 3, H, W] or
        [B, 3, F, H, W], as [B, 16, F', H/8, W/8] (TI2V-5B's VAE: [B, 48, F', H/16,
        W/16]): the posterior mean without a generator, a posterior sample with one."""
        video = pixels if pixels.ndim == 5 else pixels.unsqueeze(2)
        latents = encode_causal_latents(c.vae, video, generator)
        if not is_i2v(c):
            return latents
        # Image-to-video: the first frame's condition, cached beside the latents (i2v.py).
        condition = encode_condition(c, video, lambda v: encode_causal_latents(c.vae, v))
        return {"latents": latents, **condition}

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """The transformer's velocity for latents [B, 16, F', h, w] at t = sigma * 1000
        (TI2V-5B: [B, 48, F', h, w], t given per token as WanPipeline gives it)."""
        model = c.denoiser
        dtype = unwrap(model).dtype
        noisy = sample.noisy.to(dtype)
        if noisy.ndim != 5:
            raise ValueError(f"wan latents must be [B, C, frames, h, w], got "
                             f"{tuple(noisy.shape)}: the latent cache was built for another "
                             "family; delete it to rebuild")
        h, w = noisy.shape[-2:]
        if h % 2 or w % 2:
            # the transformer's 2x2 patch; TI2V-5B's VAE makes a latent of 16 pixels
            vae = c.vae.config if c.vae is not None else {}
            side = 2 * int(vae.get("scale_factor_spatial", 8) or 8)
            raise ValueError(f"wan latents must have even height and width, got {h}x{w}: "
                             f"use sides that are multiples of {side} pixels")
        device = noisy.device
        embeds = batch["prompt_embeds"].to(device, dtype)
        timesteps = sample.timesteps.to(device)
        if is_ti2v(c):  # float32 per token, as the pipeline's float32 mask times t
            timesteps = token_timesteps(timesteps, noisy, unwrap(model).config.patch_size)
        elif experts_in(c.denoiser) is None:  # WanExperts routes at full precision, then casts
            timesteps = timesteps.to(dtype)
        hidden, image = condition_inputs(c, noisy, batch) if is_i2v(c) else (noisy, {})
        return model(hidden_states=hidden, timestep=timesteps, encoder_hidden_states=embeds,
                     return_dict=False, **image)[0]

    def draw_sigmas(self, c: Components, n: int, generator: Any, device: Any) -> Any:
        """The shifted-uniform draw (or the run's); with one Wan 2.2 expert training,
        only sigmas whose timestep lies in its range (the draw renormalised there)."""
        experts = experts_in(c.denoiser)
        draw = functools.partial(super().draw_sigmas, c, generator=generator, device=device)
        if experts is None or experts.trained_expert == BOTH:
            return draw(n)
        from core.models.families.wan.experts import draw_within

        steps = int(c.noise_scheduler.config.get("num_train_timesteps", 1000))
        return draw_within(draw, n, lambda sigmas: experts.holds(sigmas * steps))

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return ATTENTION + (FEED_FORWARD if scope == "all" else [])

    def save_lora(self, c: Components, out_dir: Path) -> dict[str, Path]:
        """One transformer: FlowFamily's files (pytorch_lora_weights, lora_comfyui). Two
        experts: each trained expert's files (expert_files.py)."""
        from core.models.adapters import diffusers_kinds
        from core.models.families.wan.expert_files import save_expert_loras

        experts = experts_in(c.denoiser)
        if experts is None:
            return super().save_lora(c, out_dir)
        return save_expert_loras(experts.experts(), out_dir,
                                 self._pipeline_class().save_lora_weights,
                                 diffusers_kinds(self.name), save_comfy)

    def _save_comfy(self, c: Components, peft_sd: dict[str, Any], config: Any,
                    path: Path) -> Path | None:
        return save_comfy(unwrap(c.denoiser), peft_sd, config, path)

    # ------------------------------------------------------------ validation

    @staticmethod
    def _pipeline_name(c: Components) -> str:
        return I2V_PIPELINE if is_i2v(c) else "WanPipeline"

    def validation_scheduler(self, c: Components) -> Any:
        """The loaded scheduler's own class (UniPC with flow sigmas), fresh."""
        return type(c.noise_scheduler).from_config(c.noise_scheduler.config)

    def validation_pipeline(self, c: Components) -> Any:
        """A WanPipeline sharing the loaded modules, returning frames (see
        pipelines.py); it takes `num_frames` (4k + 1). Two experts: both, split at the
        model's boundary_ratio. Image-to-video: WanImageToVideoPipeline with the image
        encoder, from a fixed synthetic first frame unless given `image`. TI2V-5B:
        expand_timesteps set, so it samples with per-token timesteps as trained."""
        experts = experts_in(c.denoiser)
        denoisers: dict[str, Any] = {"transformer": unwrap(c.denoiser)}
        if experts is not None:
            denoisers = {"transformer": experts.transformer,
                         "transformer_2": experts.transformer_2,
                         "boundary_ratio": experts.boundary_ratio}
        if is_i2v(c):
            denoisers.update(image_encoder=c.image_encoder, image_processor=c.image_processor)
        if is_ti2v(c):
            denoisers[EXPAND_TIMESTEPS] = True
        pipe = validation_pipeline_class(self._pipeline_name(c))(
            scheduler=self.validation_scheduler(c), vae=c.vae,
            text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0], **denoisers)
        pipe.set_progress_bar_config(disable=True)
        return pipe


FAMILY = WanFamily()
