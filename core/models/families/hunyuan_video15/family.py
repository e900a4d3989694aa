"""HunyuanVideo 1.5 text-to-video (hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v
and -720p_t2v, their folders or hub ids; image-to-video below): an 8.3B dual-stream DiT
(HunyuanVideo15Transformer3DModel, 54 blocks, patch 1), a Qwen2.5-VL-7B text model and a
ByT5 glyph encoder, the causal 3D VAE AutoencoderKLHunyuanVideo15 (32 latent channels,
16x in space, 4x in time: F = 4k + 1 frames become 1 + (F - 1) / 4 latent frames), flow
matching. Follows HunyuanVideo15Pipeline (diffusers 0.42).

Text: the pipeline's own encode_prompt (text.py says how both encoders' output is packed
into one cached tensor, each prompt's real tokens only: the transformer moves the real
tokens first and masks the rest, so the pipeline's padding changes nothing).

Latents: `encode_images` takes pixels [B, 3, H, W] (an image, one frame) or
[B, 3, F, H, W] (a clip) and gives the posterior mean times the VAE's scaling_factor,
[B, 32, F', H/16, W/16], as the pipeline divides it out before decoding. One sample at a
time: diffusers 0.42's VAE mid-block attention builds its causal mask [B, S, S] against
queries [B, 1, S, C], which broadcasts wrongly for B > 1.

The transformer's input, as HunyuanVideo15Pipeline builds it for text-to-video: the noisy
latents, 32 channels of condition latents and one of mask, both zero
(`prepare_cond_latents_and_mask`), on channels (65); `image_embeds` all zero (the
pipeline gives 729 zero tokens; any count of zero tokens is the same, the transformer
masks them all when every one is zero, so training gives one); t = sigma * 1000 in the
latents' dtype, as the pipeline passes the scheduler's timesteps.

Sigmas: uniform, then shifted by the scheduler's `shift` (5.0 for the 480p models, 9.0
for 720p T2V: the pipeline samples np.linspace(1, 0) through that shift), the
shifted-uniform draw musubi-tuner trains Hunyuan and Wan with; train.flow_shift overrides
it. The loss is MSE against noise - latents (FlowMatchEulerDiscreteScheduler's velocity).

LoRA: both streams' attention projections in every dual-stream block (to_q/k/v/out.0 on
the video tokens, add_q/k/v_proj/to_add_out on the text tokens; "all" adds both
feed-forwards), not the token refiner's (its original q/k/v are one fused tensor). Files:
pytorch_lora_weights ("transformer.<module>" keys, HunyuanVideoLoraLoaderMixin's
save_lora_weights: diffusers 0.42's HunyuanVideo15Pipeline has no LoRA loader, and
pipelines.py's pipeline, which mixes that loader in, loads it with `load_lora_weights`)
and lora_comfyui.safetensors for ComfyUI's LoraLoaderModelOnly, under "diffusion_model."
in the names ComfyUI's HunyuanVideo LoRA map reads (comfy/lora.py model_lora_keys_unet;
ComfyUI's HunyuanVideo 1.5 is a HunyuanVideo model there): double_blocks.N.img_attn_qkv,
img_attn_proj, img_mlp.fc1, txt_attn_qkv, ... (comfyui_keys.py lists them). ComfyUI's
model holds q, k and v in one fused `img_attn.qkv` / `txt_attn.qkv` weight and maps no
LoRA name to a part of it, so plain LoRA's q, k and v are written as one fused LoRA each
(down stacked, up block-diagonal, alpha/r folded into up and no `.alpha`:
core/models/comfyui_names.py), which patches exactly the diffusers file's change. DoRA,
LoKr and LoHa cannot be fused that way: their file keeps one module per projection
(img_attn_q, ...), and ComfyUI drops the q/k/v ones (their out projections and
feed-forwards load); use plain LoRA for ComfyUI.

Image-to-video (a folder whose model_index.json names HunyuanVideo15ImageToVideoPipeline):
i2v.py, which says how the first-frame condition is cached and fed; tiny_i2v/
(tiny:hunyuan_video15_i2v) is its tiny model.

Single files: ComfyUI's diffusion-model file of the transformer (Tencent's names; bf16,
fp8 or fp8_scaled, docs/quantization.md), mapped by original.py as diffusers 0.42 has no
converter for it; model.config gives the rest (empty: the 480p T2V repo, whose transformer
config differs from 720p's only in target_size; an image-to-video file takes an
image-to-video folder). Not here: the step-distilled models (use_meanflow, refused at
load) and the super-resolution ones. I2V validation starts from each prompt's
validation.control_images entry (`first_image`, i2v.py), or the shared synthetic_image
(core/models/video_pipeline.py) without one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models import loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, RandomSpec, SingleFileSpec, class_tokenizer
from core.models.comfyui_names import Fused, ModuleNames
from core.models.families.hunyuan_video15.i2v import (
    FIRST_IMAGE,
    I2V_PIPELINE,
    condition_inputs,
    encode_condition,
    i2v_components,
    is_i2v,
)
from core.models.families.hunyuan_video15.text import encode, unpack
from core.models.flow import FlowFamily
from core.models.geometry import Geometry
from core.models.modules import encode_latents, freeze, unwrap
from core.models.source import pipeline_class_or

ATTENTION = ("to_q", "to_k", "to_v", r"to_out\.0", "add_q_proj", "add_k_proj", "add_v_proj",
             "to_add_out")
FEED_FORWARD = (r"ff\.net\.0\.proj", r"ff\.net\.2", r"ff_context\.net\.0\.proj",
                r"ff_context\.net\.2")
# diffusers module (inside transformer_blocks.N) -> the original name (double_blocks.N),
# as ComfyUI's HunyuanVideo LoRA map spells it (comfyui_keys.py). q, k and v have one
# each only for the kinds that cannot be fused (ComfyUI drops those: see the docstring).
ORIGINAL_NAMES = ModuleNames(blocks={"transformer_blocks": ("double_blocks", {
    "attn.to_q": "img_attn_q", "attn.to_k": "img_attn_k", "attn.to_v": "img_attn_v",
    "attn.to_out.0": "img_attn_proj", "attn.add_q_proj": "txt_attn_q",
    "attn.add_k_proj": "txt_attn_k", "attn.add_v_proj": "txt_attn_v",
    "attn.to_add_out": "txt_attn_proj", "ff.net.0.proj": "img_mlp.fc1",
    "ff.net.2": "img_mlp.fc2", "ff_context.net.0.proj": "txt_mlp.fc1",
    "ff_context.net.2": "txt_mlp.fc2", "norm1.linear": "img_mod.linear",
    "norm1_context.linear": "txt_mod.linear"})})
# The original model's fused q/k/v Linears: plain LoRA is written as one LoRA on each.
FUSED = (Fused("transformer_blocks", "img_attn_qkv", ("attn.to_q", "attn.to_k", "attn.to_v")),
         Fused("transformer_blocks", "txt_attn_qkv",
               ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")))


def condition_channels(noisy: Any) -> Any:
    """The text-to-video condition: 32 zero latent channels and a zero mask channel."""
    b, ch, frames, h, w = noisy.shape
    return noisy.new_zeros(b, ch + 1, frames, h, w)


def activation_layout(config: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The memory estimate's MMDiT formula over the dual-stream blocks (patch 1: a
    token per latent voxel). Not calibrated on a measured run."""
    return ({"num_attention_heads": int(config.get("num_attention_heads", 16)),
             "attention_head_dim": int(config.get("attention_head_dim", 128)),
             "num_layers": int(config.get("num_layers", 54))},
            int(config.get("patch_size", 1)))
def random_tokenizer(cls: str, folder: Path, bang_padded: bool) -> Any:
    """random:hunyuan_video15's tokenizers: the tiny build's Qwen one, with this
    pipeline's template, and the real byte-level ByT5 (`class_tokenizer`)."""
    if not cls.startswith("Qwen2"):
        return class_tokenizer(cls, folder, bang_padded)
    from core.models.families.hunyuan_video15.tiny import TEMPLATE_DROP, template_prefix
    from core.models.tiny.qwen import TEMPLATE_SUFFIX, qwen_tokenizer

    return qwen_tokenizer(folder, template_prefix(), TEMPLATE_SUFFIX, TEMPLATE_DROP)


class HunyuanVideo15Family(FlowFamily):
    name = "hunyuan_video15"
    block_lists = ("transformer_blocks",)
    # 4k + 1 frames, 4 to a latent frame, 16x16 pixels to a latent; patch 1. 24 fps:
    # the model's (121 frames are its 5 s; the pipeline takes no rate, and diffusers'
    # image-to-video example exports at 24).
    geometry = Geometry(video=True, frame_step=4, temporal_compression=4, fps=24.0,
                        spatial_compression=16, latent_channels=32, spatial_multiple=16)
    first_image = FIRST_IMAGE  # a HunyuanVideo15ImageToVideoPipeline folder (i2v.py)
    pipeline_prefix = "HunyuanVideo15"
    # An original file (its ByT5 projection) is named as this family, before Flux's
    # "double_blocks." claims it. ComfyUI's diffusion-model file of the transformer
    # (bf16, fp8, fp8_scaled), mapped by original.py; model.config gives the rest.
    single_file = SingleFileSpec(markers=("byt5_in.",), rank=25)
    transformer_class_name = "HunyuanVideo15Transformer3DModel"
    single_file_default_config = "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v"
    text_encoder_count = 2
    pipeline_class_name = "HunyuanVideo15Pipeline"
    # The memory estimate's text tokens: Qwen's 1000 (the most a prompt gives) beside
    # ByT5's 256 glyph tokens and the 729 image tokens (SigLIP's, real in image-to-video;
    # zeros the validation pipeline still carries through every block in text-to-video).
    max_sequence_length = 1000
    memory = MemorySpec(extra_text_tokens=256 + 729, activation_layout=activation_layout,
                        text_encoder_kind="llm")
    timestep_sampling = "uniform"
    random = RandomSpec(tokenizer=random_tokenizer)
    # tiny:hunyuan_video15_i2v, a random image-to-video model (tiny_i2v/ says why it goes
    # through here).
    trained_tiny = (("hunyuan_video15_i2v", "core.models.families.hunyuan_video15.tiny_i2v"),)

    # ------------------------------------------------------------ loading

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None) -> Components:
        """A diffusers folder or hub id, or a single file of the transformer with the rest
        from model.config (see the docstring)."""
        c = super().load(path, dtype=dtype, device=device, config=config)
        if is_i2v(c):
            freeze([c.image_encoder], device)
        return c

    def config_problems(self, cfg: Any) -> list[Any]:
        """A kind whose q/k/v ComfyUI drops is named (see the docstring)."""
        from core.problems import warning

        problems = []
        kind = cfg.train.lora_kind
        if kind != "lora":
            problems.append(warning(
                "train.lora_kind", f"{kind}'s attention q/k/v cannot be fused into the "
                "single qkv weight ComfyUI's HunyuanVideo 1.5 holds, so ComfyUI drops them "
                "from lora_comfyui.safetensors (its out projections and feed-forwards "
                "load); train lora for a file ComfyUI takes whole"))
        return problems

    def transformer_names(self, state: dict[str, Any]) -> dict[str, Any]:
        from core.models.families.hunyuan_video15.original import diffusers_names

        return diffusers_names(state)

    def _pretrained_class(self, path: str, kind: loading.SourceKind) -> Any:
        """The folder's own pipeline (image-to-video where model_index.json names it,
        i2v.py), as pipelines.py's subclass."""
        from core.models.families.hunyuan_video15.pipelines import validation_pipeline_class

        return validation_pipeline_class(
            pipeline_class_or(path, I2V_PIPELINE, self.pipeline_class_name))

    def _pipeline_class(self) -> Any:
        """pipelines.py's subclass: it loads the folder as diffusers' pipeline does and
        has the LoRA saver and loader diffusers' own lacks."""
        from core.models.families.hunyuan_video15.pipelines import validation_pipeline_class

        return validation_pipeline_class(self.pipeline_class_name)

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        """Both text encoders; an image-to-video folder's image encoder too (i2v.py)."""
        c = Components(
            family=self.name, source=source, fingerprint=fp, vae=pipe.vae,
            denoiser=pipe.transformer, text_encoders=[pipe.text_encoder, pipe.text_encoder_2],
            tokenizers=[pipe.tokenizer, pipe.tokenizer_2], noise_scheduler=pipe.scheduler)
        return i2v_components(c, pipe, source)

    # ------------------------------------------------------------ text and pixels

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [L, D1 + D2 + 2] and prompt_mask [L] (text.py)."""
        return encode(self.validation_pipeline(c), prompts, c.text_encoders[0].device)

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """scaling_factor * z of pixels in [-1, 1], [B, 3, H, W] or [B, 3, F, H, W], as
        [B, 32, F', H/16, W/16] (one sample at a time, see the docstring): the posterior
        mean without a generator, a posterior sample with one."""
        import torch

        video = pixels if pixels.ndim == 5 else pixels.unsqueeze(2)

        def latents(clips: Any, noise: Any = None) -> Any:
            return torch.cat([encode_latents(c.vae, clips[i:i + 1], noise)
                              for i in range(clips.shape[0])])

        if not is_i2v(c):
            return latents(video, generator)
        # Image-to-video: the first frame's condition, cached beside the latents (i2v.py).
        return {"latents": latents(video, generator), **encode_condition(c, video, latents)}

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """The transformer's velocity for latents [B, 32, F', h, w] at t = sigma * 1000,
        given as HunyuanVideo15Pipeline gives it (see the docstring)."""
        import torch

        model = c.denoiser
        config = unwrap(model).config
        dtype = unwrap(model).dtype
        noisy = sample.noisy.to(dtype)
        if noisy.ndim != 5 or noisy.shape[1] != config.out_channels:
            raise ValueError(f"hunyuan_video15 latents must be [B, {config.out_channels}, "
                             f"frames, h, w], got {tuple(noisy.shape)}: the latent cache was "
                             "built for another family; delete it to rebuild")
        text = unpack(batch["prompt_embeds"].to(noisy.device, dtype), config.text_embed_dim,
                      config.text_embed_2_dim)
        if is_i2v(c):
            condition, image = condition_inputs(noisy, batch)
        else:
            condition = condition_channels(noisy)
            image = noisy.new_zeros(noisy.shape[0], 1, config.image_embed_dim)
        hidden = torch.cat([noisy, condition], dim=1)
        return model(hidden_states=hidden, timestep=sample.timesteps.to(noisy.device, dtype),
                     image_embeds=image, return_dict=False, **text)[0]

    def lora_target_modules(self, scope: str = "attention") -> Any:
        """A regular expression peft matches against the whole module name (a list would
        match by suffix and take the token refiner's to_q/k/v too)."""
        leaves = [f"attn\\.{leaf}" for leaf in ATTENTION]
        leaves += list(FEED_FORWARD) if scope == "all" else []
        return rf"transformer_blocks\.\d+\.({'|'.join(leaves)})"

    def _save_comfy(self, c: Components, peft_sd: dict[str, Any], config: Any,
                    path: Path) -> Path | None:
        """Original names under "diffusion_model.", q/k/v fused for plain LoRA (see the
        docstring)."""
        from core.models.comfyui_names import save_fused_comfy

        return save_fused_comfy(unwrap(c.denoiser), peft_sd, config, path, ORIGINAL_NAMES,
                                FUSED)

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """pipelines.py's HunyuanVideo15Pipeline sharing the loaded modules (its own
        scheduler); it takes `num_frames` (4k + 1) and validation.guidance_scale."""
        from diffusers.guiders import ClassifierFreeGuidance

        from core.models.families.hunyuan_video15.pipelines import validation_pipeline_class
        from core.models.families.hunyuan_video15.tiny import GUIDANCE

        name = I2V_PIPELINE if is_i2v(c) else self.pipeline_class_name
        image = ({"image_encoder": c.image_encoder, "feature_extractor": c.feature_extractor}
                 if is_i2v(c) else {})
        pipe = validation_pipeline_class(name)(
            transformer=unwrap(c.denoiser), vae=c.vae, scheduler=self.validation_scheduler(c),
            text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            text_encoder_2=c.text_encoders[1], tokenizer_2=c.tokenizers[1],
            guider=ClassifierFreeGuidance(guidance_scale=GUIDANCE), **image)
        pipe.set_progress_bar_config(disable=True)
        return pipe


FAMILY = HunyuanVideo15Family()
