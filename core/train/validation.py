"""Validation images: fixed prompts and seeds, saved as validation/step_NNNNNN/00.png;
a video family with validation.frames > 1 also writes each video as 00.mp4 (00.png is its
first frame, which the gallery and the grid show), with its AAC audio track when the
pipeline generates one (`.audio`, `.audio_sample_rate`); an edit family edits each prompt's
validation.control_images, and an image-to-video model starts from them.

The prompts are encoded once, before training, while the text encoders are still on the
GPU for the caches (`encode_validation_prompts`); each validation then runs the family's
pipeline without text encoders, from those embeddings, in the denoiser's dtype, with the
VAE brought to the GPU only to decode.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import ValidationConfig
from core.config.prompts import PromptSettings, prompt_settings
from core.files import atomic_path
from core.models.modules import plain_forward, unwrap
from core.runs.folder import RunFolder

if TYPE_CHECKING:
    from core.models.base import Components, ModelFamily

# What encode_prompts returns that the pipelines take as keyword arguments.
_TEXT_KEYS = ("prompt_embeds", "pooled_prompt_embeds")


@dataclasses.dataclass
class ValidationTexts:
    """Encoded validation prompts (on the CPU), and the empty prompt's encoding, which
    classifier-free guidance uses as the negative."""

    prompts: list[dict[str, Any]]
    negative: dict[str, Any]
    # Pipelines that take a list of per-prompt [L, D] embeddings (Z-Image's), the
    # family's `validation.list_prompt_embeds`, rather than a batch tensor.
    as_list: bool = False
    # The pipeline's argument for the text mask, for families whose denoiser takes one
    # (the family's `validation.mask_kwarg`, e.g. Chroma's "prompt_attention_mask").
    mask_kwarg: str | None = None
    # A text encoder that reads the control images (Qwen-Image-Edit) encodes the empty
    # prompt with each prompt's images, as its pipeline encodes the negative prompt: one
    # negative per prompt, used in place of `negative`.
    negatives: list[dict[str, Any]] | None = None

    def pipeline_inputs(self, index: int, device: Any) -> dict[str, Any]:
        """Keyword arguments of a pipeline call for prompt `index` (a batch of one), on
        `device`: the pipelines that take embeddings (Flux's, SD3's, ...) use them where
        they are given, so embeddings left on the CPU meet a denoiser on the GPU."""
        out = {}
        negative = self.negatives[index] if self.negatives else self.negative

        def wrap(t: Any) -> Any:
            return [t.to(device)] if self.as_list else t.unsqueeze(0).to(device)

        for key in _TEXT_KEYS:
            if key in self.prompts[index]:
                out[key] = wrap(self.prompts[index][key])
                out[f"negative_{key}"] = wrap(negative[key])
        if self.mask_kwarg:
            out[self.mask_kwarg] = self.prompts[index]["prompt_mask"].unsqueeze(0).to(device)
            out[f"negative_{self.mask_kwarg}"] = (
                negative["prompt_mask"].unsqueeze(0).to(device))
        return out


def control_images(family: ModelFamily, cfg: ValidationConfig,
                   first_image: bool = False) -> list[list[Any]]:
    """Each validation prompt's control images (PIL RGB) for an edit family, or its first
    image for an image-to-video model (`first_image`); [] for others or when none are
    configured (the check refuses that for an edit family)."""
    from core.data.controls import split_controls
    from core.data.images import load_rgb

    if not (family.edit or first_image) or not cfg.control_images:
        return []
    return [[load_rgb(path) for path in split_controls(entry)] for entry in cfg.control_images]


def encode_validation_prompts(family: ModelFamily, components: Components,
                              cfg: ValidationConfig) -> ValidationTexts | None:
    """The validation prompts (their text, flags left out) and each one's negative
    prompt (validation.negative_prompt or its --n; empty by default), encoded once
    (None without prompts); with their control images where the family's text encoder
    reads them."""
    if not cfg.prompts:
        return None
    settings = [prompt_settings(cfg, i) for i in range(len(cfg.prompts))]
    prompts = [s.text for s in settings]
    negative_texts = [s.negative for s in settings]
    edit = family.edit
    images = control_images(family, cfg) if edit and edit.text_reads_references else []

    def cpu(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v.detach().cpu() for k, v in item.items()} for item in items]

    def texts(encoded: list[dict[str, Any]], negatives: list[dict[str, Any]]) -> ValidationTexts:
        return ValidationTexts(prompts=encoded, negative=negatives[0],
                               as_list=family.validation.list_prompt_embeds,
                               mask_kwarg=family.validation.mask_kwarg, negatives=negatives)

    if images:
        return texts(cpu(edit.encode_prompts_with_images(components, prompts, images)),
                     cpu(edit.encode_prompts_with_images(components, negative_texts, images)))
    unique = sorted(set(negative_texts))  # each negative encoded once
    encoded = cpu(family.encode_prompts(components, [*prompts, *unique]))
    by_text = dict(zip(unique, encoded[len(prompts):], strict=True))
    return texts(encoded[:len(prompts)], [by_text[t] for t in negative_texts])


def generate_validation_images(family: ModelFamily, components: Components,
                               cfg: ValidationConfig, run_dir: Path, step: int,
                               device: Any, texts: ValidationTexts | None,
                               first_image: bool = False) -> list[Path]:
    """One image per prompt, each with its settings (`prompt_settings`: seed
    validation.seed + index, the section's size, steps and guidance, unless its flags
    say), written atomically so a watcher never shows half a PNG. `first_image`: the
    model is image-to-video, and validation.control_images gives each prompt its first
    frame."""
    from core.train.validation_model import validation_model

    if texts is None or not cfg.prompts:
        return []
    # validation.model: another checkpoint's denoiser with the run's LoRA, loaded now.
    with validation_model(family, components, cfg, device) as (drawn, settings):
        return _draw_all(family, drawn, settings, run_dir, step, device, texts, first_image)


def _draw_all(family: ModelFamily, components: Components, cfg: ValidationConfig,
              run_dir: Path, step: int, device: Any, texts: ValidationTexts,
              first_image: bool) -> list[Path]:
    """generate_validation_images with the components and settings drawn with."""
    without_text = dataclasses.replace(
        components, text_encoders=[None] * len(components.text_encoders))
    pipe = family.validation_pipeline(without_text)
    folder = RunFolder(run_dir).validation_step(step)
    folder.mkdir(parents=True, exist_ok=True)
    vae = components.vae
    home = vae.device
    vae.to(device)
    frames = cfg.frames if family.video else 0
    controls = control_images(family, cfg, first_image)
    # The spec whose images these are: an edit family's references, else the first image.
    image_kwargs = (family.edit or family.first_image).validation_kwargs if controls else None
    try:
        with plain_forward(unwrap(components.denoiser)):
            out = []
            for index in range(len(cfg.prompts)):
                drawn = prompt_settings(cfg, index)
                area_side = round((drawn.width * drawn.height) ** 0.5)
                # An empty entry (EditSpec.optional): this prompt draws from its text alone.
                image = (image_kwargs(controls[index], area_side)
                         if image_kwargs and controls[index] else {})
                out.append(_one_image(pipe, cfg, drawn, texts.pipeline_inputs(index, device),
                                      index, folder, frames, image))
            return out
    finally:
        vae.to(home)


def _one_image(pipe: Any, cfg: ValidationConfig, drawn: PromptSettings,
               text_inputs: dict[str, Any], index: int, folder: Path, frames: int = 0,
               image: dict[str, Any] | None = None) -> Path:
    """Prompt `index`'s image, drawn with `drawn`, from its encoded prompt, `text_inputs`
    (a video family's: `frames` frames, 0 for none; an edit family's: an edit of the
    control images in `image`, the pipeline's kwargs)."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(drawn.seed)
    video = {"num_frames": frames} if frames else {}
    with torch.no_grad():
        out = pipe(**text_inputs, num_inference_steps=drawn.steps,
                   guidance_scale=drawn.guidance_scale, height=drawn.height,
                   width=drawn.width, generator=generator, **video, **(image or {}))
    image = out.images[0]
    if frames > 1:  # written first: a watcher that sees the PNG finds the video too
        from core.data.video import write_video

        write_video(folder / f"{index:02d}.mp4", out.frames[0], cfg.fps)
        audio = getattr(out, "audio", None)  # a family that generates sound with the video
        if audio is not None:
            from core.data.audio import write_audio_track

            write_audio_track(folder / f"{index:02d}.mp4", audio[0].numpy(),
                              out.audio_sample_rate)
    path = folder / f"{index:02d}.png"
    with atomic_path(path) as tmp:
        image.save(tmp, format="PNG")
    return path
