"""LTX-2 (Lightricks/LTX-2, its diffusers folder): one audio-video DiT
(LTX2VideoTransformer3DModel: a video stream over 1x1x1 latent patches and an audio
stream, each with self-attention, cross-attention to the text and cross-attention to the
other stream), Gemma 3 12B through LTX2TextConnectors for the text, the causal video VAE
AutoencoderKLLTX2Video (32x in space, 8x in time: F = 8k + 1 frames become k + 1 latent
frames of 128 channels) and the audio VAE AutoencoderKLLTX2Audio with its vocoder; flow
matching. Follows LTX2Pipeline.

Text (text.py): the Gemma layers through the frozen connectors, cached as the transformer
reads them. Latents: `encode_images` gives (z - latents_mean) / latents_std of the video
VAE's posterior, [B, 128, F', H/32, W/32] (an image: one frame), as the pipeline's
_normalize_latents; a clip's audio track is encoded by `audio` (audio.py's AudioSpec) into the
same cache entry. Objective (objective.py): video and audio noised at one sigma, MSE
against noise - latents for each, the sigmas shifted as the pipeline shifts them for
the sample's token count; the transformer gets t = sigma * 1000 (and sigma = t, which
LTX-2.3's prompt modulation reads, as the pipeline passes it), the video positions at the
pipeline's 24 fps.

LoRA: every attention of every block (video and audio self- and text cross-attention, the
audio-to-video and video-to-audio attentions), "all" adds both feed-forwards. Files:
pytorch_lora_weights (LTX2Pipeline.save_lora_weights; `load_lora_weights` reads it) and
lora_comfyui.safetensors under "diffusion_model." in LTX-2's original module names (the
same as diffusers' for these modules; each scale folded into B, no `.alpha`: lora.py),
which ComfyUI's LTX-2 loader and diffusers' own converter read.

The connectors, the audio VAE and the vocoder wait in host memory and come to the
device for their use (the text cache, the audio cache, validation): the real connectors
alone are about 1.4 B parameters.

Image-to-video: the same checkpoint, chosen by model.ltx2_mode (options.py; the folder
cannot say), set onto the loaded model by `configure_run`; i2v.py says how training
follows LTX2ImageToVideoPipeline (the first latent frame clean at timestep 0, no loss on
it) and validation samples with that pipeline from each prompt's first image.
LTX-2.3 (versions.py): the same classes, told apart by its configs (per-modality
connector projections, gated attention, prompt modulation, no caption projections):
trained the same way, its cached text split at each stream's width, validated with the
guidance LTX2Pipeline suggests for it (audio CFG 7, STG, modality guidance); tiny:ltx23
(tiny23/) and random:ltx2:2.3 (full_size_2.3/). LTX-2.5 is refused at the check and at
load, with the reason.
Single files: ComfyUI's ltx-2-19b-*.safetensors (bf16, fp8 or fp8_scaled) load their
diffusion model through LTX2VideoTransformer3DModel.from_single_file; what the file
bundles beside it (VAE, audio VAE, vocoder, text connectors) is not read, model.config
gives those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.models import loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, SingleFileSpec, ValidationSpec
from core.models.families.ltx2.audio import AUDIO, FRAME_RATE, audio_length
from core.models.families.ltx2.i2v import (
    FIRST_IMAGE,
    keep_first_frame,
    takes_first_image,
    video_timesteps,
)
from core.models.families.ltx2.objective import (
    AudioVideoSample,
    audio_inputs,
    joint_loss,
    token_shift,
    video_per_item,
)
from core.models.families.ltx2.text import MAX_SEQUENCE_LENGTH, encode, split
from core.models.families.ltx2.versions import (
    TINY_23,
    model_problems,
    refusal,
    source_version,
    transformer_version,
    video_text_width,
)
from core.models.flow import FlowFamily
from core.models.geometry import Geometry
from core.models.modules import _posterior, freeze, unwrap
from core.models.objectives import sample_sigmas
from core.problems import error, warning

AUDIO_LATENTS_PER_SECOND = 16000 / 160 / 4

STREAMS = ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn",
           "video_to_audio_attn")
ATTENTION = [f"{s}.{p}" for s in STREAMS for p in ("to_q", "to_k", "to_v", "to_out.0")]
FEED_FORWARD = ["ff.net.0.proj", "ff.net.2", "audio_ff.net.0.proj", "audio_ff.net.2"]


@dataclass
class LTX2Components(Components):
    """Components with LTX-2's other parts (see the module docstring)."""

    connectors: Any = None
    audio_vae: Any = None
    vocoder: Any = None
    first_image: bool = False  # model.ltx2_mode = "image_to_video" (configure_run)


def activation_layout(config: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The memory estimate's MMDiT formula over the video stream (1x1 patches; the audio
    stream's are `audio_stream`). Not calibrated."""
    return ({"num_attention_heads": int(config.get("num_attention_heads", 32)),
             "attention_head_dim": int(config.get("attention_head_dim", 128)),
             "num_layers": int(config.get("num_layers", 48))}, 1)


def audio_stream(config: dict[str, Any], shape: Any) -> tuple[dict[str, Any], Any]:
    """The memory estimate's audio stream beside the video's: its tokens at its own width,
    in every block, for the transformer `config` and the step `shape` (a StepShape). The
    real audio VAE gives 25 latents a second (16 kHz, hop 160, 4 mel frames a latent) of
    video at the pipeline's 24 fps."""
    import dataclasses
    import math

    frames = (shape.latent_frames - 1) * LTX2Family.geometry.temporal_compression + 1
    tokens = math.ceil(frames / FRAME_RATE * AUDIO_LATENTS_PER_SECOND)
    audio = {"num_attention_heads": int(config.get("audio_num_attention_heads", 32)),
             "attention_head_dim": int(config.get("audio_attention_head_dim", 64)),
             "num_layers": int(config.get("num_layers", 48))}
    return audio, dataclasses.replace(shape, latent_height=tokens, latent_width=1,
                                      latent_frames=1, image_sequences=1)


class LTX2Family(FlowFamily):
    name = "ltx2"
    block_lists = ("transformer_blocks",)
    # fps: LTX2Pipeline's default frame_rate (audio.py), which its positions assume.
    geometry = Geometry(video=True, frame_step=8, temporal_compression=8, fps=FRAME_RATE,
                        spatial_compression=32, latent_channels=128, spatial_multiple=32)
    audio = AUDIO  # a clip's sound track, cached beside its frames (audio.py)
    first_image = FIRST_IMAGE  # model.ltx2_mode = "image_to_video" (i2v.py)
    pipeline_prefix = "LTX2"
    text_encoder_count = 1
    pipeline_class_name = "LTX2Pipeline"
    transformer_class_name = "LTX2VideoTransformer3DModel"
    single_file_default_config = "Lightricks/LTX-2"
    # ComfyUI's audio-video LTX-2 marker (comfy/model_detection.py "ltxav").
    single_file = SingleFileSpec(markers=("audio_adaln_single.",), rank=50)
    max_sequence_length = MAX_SEQUENCE_LENGTH
    # Gemma 3 reads the prompt; the audio stream runs beside the video tokens.
    memory = MemorySpec(activation_layout=activation_layout, extra_stream=audio_stream,
                        text_encoder_kind="llm")
    # tiny:ltx23, a random LTX-2.3 (tiny23/); random:ltx2:2.3 is full_size_2.3/
    trained_tiny = ((TINY_23, "core.models.families.ltx2.tiny23"),)
    validation = ValidationSpec(mask_kwarg="prompt_attention_mask")

    # ------------------------------------------------------------ loading

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None) -> Components:
        """FlowFamily's load; the connectors, audio VAE and vocoder frozen in host
        memory (see the module docstring)."""
        refused = refusal(path, source_version(path))
        if refused:
            raise loading.ModelLoadError(path, refused)
        c = super().load(path, dtype=dtype, device=device, config=config)
        refused = refusal(path, transformer_version(unwrap(c.denoiser).config))
        if refused:  # a hub id whose name did not say
            raise loading.ModelLoadError(path, refused)
        freeze([c.connectors, c.audio_vae, c.vocoder], "cpu")
        return c

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        base = super()._components_from_pipeline(pipe, source, fp)
        fields = {k: getattr(base, k) for k in Components.__dataclass_fields__}
        return LTX2Components(**fields, connectors=pipe.connectors,
                              audio_vae=pipe.audio_vae, vocoder=pipe.vocoder)

    @staticmethod
    def parts(c: Components) -> LTX2Components:
        """`c` with its connectors, audio VAE and vocoder; random:ltx2 (built without
        them) is refused, naming model.path."""
        if not isinstance(c, LTX2Components) or c.connectors is None:
            raise ValueError("model.path: random:ltx2 (and random:ltx2:2.3) is for --stage "
                             "check's memory estimate only (its text connectors and Gemma "
                             "tokenizer are not built); train Lightricks/LTX-2, "
                             "Lightricks/LTX-2.3, tiny:ltx2 or tiny:ltx23")
        return c

    def config_problems(self, cfg: Any) -> list[Any]:
        """A dataset sampled at another rate than the 24 fps the transformer's video
        positions and the audio length assume; image-to-video on one-frame samples,
        whose one latent frame is the condition, leaving nothing to train; an LTX-2.5
        model.path, named with why (versions.py)."""
        out = [warning(f"datasets.{i}.fps", f"{ds.fps:g} fps: ltx2 trains at "
                       f"{FRAME_RATE:g} fps, the rate LTX2Pipeline samples at (its video "
                       "positions and audio length assume it); set it to 0 (the family's "
                       "rate) unless the clips are meant to play slower or faster")
               for i, ds in enumerate(cfg.datasets) if ds.fps not in (0, FRAME_RATE)]
        if takes_first_image(cfg.model):
            out += [error(f"datasets.{i}.frames", f"is 1, but {FIRST_IMAGE.switch} "
                          "keeps each sample's first latent frame as the clean condition "
                          "and trains the frames after it: a one-frame sample has none; "
                          "use 9 or more frames, or text_to_video")
                    for i, ds in enumerate(cfg.datasets) if ds.frames == 1]
        return out + model_problems(cfg.model.path)  # LTX-2.5 is refused (versions.py)

    def configure_run(self, c: Components, cfg: Any) -> None:
        """model.ltx2_mode onto the loaded model: training conditions on each clip's
        first latent frame and validation samples with LTX2ImageToVideoPipeline."""
        self.parts(c).first_image = takes_first_image(cfg.model)

    # ------------------------------------------------------------ text and latents

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [1024, D_video + D_audio], prompt_mask [1024]."""
        return encode(self.validation_pipeline(c), self.parts(c).connectors, prompts,
                      self.sequence_length(c))

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """Normalised video latents [B, 128, F', H/32, W/32] of pixels [B, 3, H, W] or
        [B, 3, F, H, W] in [-1, 1] (the posterior mean, or a sample with a generator)."""
        from diffusers import LTX2Pipeline

        vae = c.vae
        video = pixels if pixels.ndim == 5 else pixels.unsqueeze(2)
        return LTX2Pipeline._normalize_latents(_posterior(vae, video, generator),
                                               vae.latents_mean, vae.latents_std,
                                               vae.config.scaling_factor)

    # ------------------------------------------------------------ training

    def noise_and_target(self, c: Components, latents: Any, generator: Any = None,
                         timesteps: Any = None, noise: Any = None,
                         noise_offset: float = 0.0) -> NoiseSample:
        """FlowFamily's sample, its sigmas drawn with the shift for this many video
        tokens (objective.py) unless given; it carries what the audio half needs."""
        n_train = int(c.noise_scheduler.config.get("num_train_timesteps", 1000))
        if timesteps is None:
            s = self.flow_settings(c)
            tokens = int(latents[0, 0].numel())  # frames x h x w: 1x1x1 patches
            shift = (c.flow.shift if c.flow is not None and c.flow.shift else
                     token_shift(c.noise_scheduler.config, tokens))
            sigmas = sample_sigmas(latents.shape[0], generator, latents.device,
                                   s.timestep_sampling, s.logit_mean, s.logit_std, shift,
                                   s.mode_scale)
            timesteps = sigmas * n_train
        base = super().noise_and_target(c, latents, generator, timesteps, noise, noise_offset)
        given = bool(getattr(c, "first_image", False))
        if given:  # image-to-video (i2v.py): the first latent frame stays clean
            base.noisy = keep_first_frame(base.noisy, latents)
        return AudioVideoSample(**vars(base), generator=generator,
                                fixed_noise=noise is not None, first_frame_given=given)

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """The transformer's video velocity [B, 128, F', h, w]; the audio velocity waits
        on the sample for `loss` (objective.py)."""
        from diffusers import LTX2Pipeline

        model = c.denoiser
        config = unwrap(model).config
        dtype = unwrap(model).dtype
        noisy = sample.noisy
        if noisy.ndim != 5:
            raise ValueError(f"ltx2 latents must be [B, C, frames, h, w], got "
                             f"{tuple(noisy.shape)}: the latent cache was built for another "
                             "family; delete it to rebuild")
        _, _, f, h, w = noisy.shape
        device = noisy.device
        video_text, audio_text = split(batch["prompt_embeds"].to(device, dtype),
                                       video_text_width(config))
        mask = batch["prompt_mask"].to(device)
        frames = (f - 1) * self.geometry.temporal_compression + 1
        steps = int(c.noise_scheduler.config.get("num_train_timesteps", 1000))
        length = audio_length(c.audio_vae.config, frames)
        audio, audio_t = audio_inputs(sample, batch, length, int(config.audio_in_channels),
                                      steps)
        t = sample.timesteps.to(device)
        # image-to-video: timestep 0 on the first frame's tokens (i2v.py); sigma stays t
        video_t = video_timesteps(t, noisy) if getattr(sample, "first_frame_given", False) \
            else t
        video, audio_out = model(
            hidden_states=LTX2Pipeline._pack_latents(noisy).to(dtype),
            audio_hidden_states=audio.to(dtype), encoder_hidden_states=video_text,
            audio_encoder_hidden_states=audio_text, timestep=video_t, audio_timestep=audio_t,
            sigma=t, audio_sigma=audio_t, encoder_attention_mask=mask,
            audio_encoder_attention_mask=mask, num_frames=f, height=h, width=w,
            fps=FRAME_RATE, audio_num_frames=audio.shape[1], use_cross_timestep=True,
            return_dict=False)
        if isinstance(sample, AudioVideoSample):
            sample.audio_prediction = audio_out
        return LTX2Pipeline._unpack_latents(video, f, h, w)

    def loss(self, c: Components, prediction: Any, sample: NoiseSample,
             min_snr_gamma: float = 0.0) -> Any:
        """Each item's video MSE plus its audio MSE where it has audio, batch mean."""
        if not isinstance(sample, AudioVideoSample):
            return super().loss(c, prediction, sample)
        return joint_loss(video_per_item(prediction, sample), sample)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return ATTENTION + (FEED_FORWARD if scope == "all" else [])

    def _save_comfy(self, c: Components, peft_sd: dict[str, Any], config: Any,
                    path: Any) -> Any:
        """LTX-2's original names (lora.py)."""
        from core.models.families.ltx2.lora import save_original_lora
        from core.models.lora_files import base_weights

        return save_original_lora(peft_sd, config, path, base_weights(unwrap(c.denoiser)))

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """An LTX2Pipeline sharing the loaded modules that samples from the cached text
        and returns frames and audio (pipelines.py); it takes `num_frames` (8k + 1).
        Image-to-video: LTX2ImageToVideoPipeline over the same modules, from `image`."""
        from core.models.families.ltx2.pipelines import I2V_PIPELINE, validation_pipeline_class

        c = self.parts(c)
        name = I2V_PIPELINE if c.first_image else self.pipeline_class_name
        pipe = validation_pipeline_class(name)(
            scheduler=self.validation_scheduler(c), vae=c.vae, audio_vae=c.audio_vae,
            text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            connectors=c.connectors, transformer=unwrap(c.denoiser), vocoder=c.vocoder)
        pipe.set_progress_bar_config(disable=True)
        return pipe


FAMILY = LTX2Family()
