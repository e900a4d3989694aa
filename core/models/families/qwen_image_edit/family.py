"""Qwen-Image-Edit: Qwen-Image (qwen_image/family.py: the transformer, VAE, latents, sigma
draw, loss, LoRA targets and files are the same) trained on edit pairs, as diffusers 0.42's
QwenImageEditPipeline (Qwen/Qwen-Image-Edit, one reference image) and
QwenImageEditPlusPipeline (Qwen/Qwen-Image-Edit-2509 and -2511, up to three) condition
sampling (pipeline_qwenimage_edit.py, pipeline_qwenimage_edit_plus.py).

References (`edit.references` = 3, the most a Plus model takes; plain Qwen-Image-Edit takes
1, and a second control raises a ValueError naming datasets.N.control_2, at --stage check
for a folder or tiny: model.path, else when the caches are built): each is cached as the
normalised VAE posterior mean, exactly as a target (`encode_controls`: capabilities.py's
`controls_as_targets` after the count check),
which is the pipelines' `_encode_vae_image` (sample_mode "argmax", (z - mean) / std). The
dataset fits each control to its target's bucket; at inference the pipelines resize it to
about 1024x1024 instead (`validation_pipeline` does as they do).

`predict` builds the transformer input as the denoising loop does (edit lines 765-782,
plus 809-826; "edit"/"plus" are pipeline_qwenimage_edit.py/_plus.py): the noisy target
packed with `_pack_latents`, each reference packed alike and concatenated after it on the
sequence axis (prepare_latents: edit 466-469, plus 465-491, one after the other in
control order), img_shapes [(1, h/2, w/2) of the target, then each reference's] (edit
712-717, plus 753-760), timestep sigma (the loop's t / 1000), the text mask (None when all
ones, as encode_prompt drops it); and keeps the target's tokens of the output
(`noise_pred[:, :latents.size(1)]`). A 2511 transformer (zero_cond_t) reads the reference
tokens' timestep 0 from img_shapes itself. Items whose references differ in number or
shape run as separate groups.

Text (`edit.text_reads_references`): Qwen2.5-VL reads the prompt with its control images. For
each prompt, `encode_prompts_with_images` calls the pipeline's own encode_prompt (edit
272-316: `_get_qwen_prompt_embeds` 225-270, the template with the vision tokens through
the processor, hidden_states[-1] of the real tokens, the 64-token system part dropped;
plus 228-284, "Picture i: " and the vision tokens per image) with the images __call__
hands it (`prompt_images`: edit, the first image resized to about 1024x1024 at its
aspect ratio, 623-624 and 662; plus, each image resized to about CONDITION_IMAGE_SIZE,
384x384, 697-706), one prompt at a time because the images differ per prompt (the plus
template numbers every image of the call). The image tokens stay in the embeddings.
Without images (`encode_prompts`) both variants encode as QwenImageEditPlusPipeline does
a prompt without a picture (the same template, no vision tokens): the plain pipeline
cannot (its template holds an image placeholder, and the processor refuses it unfilled).
The pipelines encode the negative prompt with the same images (edit 688-697, plus
729-737), so validation's negative is "" encoded with each prompt's images
(core/train/validation.py). The edit pipelines do not truncate to max_sequence_length.

Loading: a diffusers folder or hub id whose model_index.json names either pipeline (its
class is kept in `QwenImageEditComponents.pipeline_class`); the processor rides on
QwenImageEditComponents, loaded through processor.py (transformers 5 builds a
Qwen2VLProcessor only with torchvision). A single file (ComfyUI's diffusion-model file,
with Qwen-Image's names) loads its transformer as Qwen-Image's does; model.config names
the edit pipeline's folder or hub id that gives the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.models import loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import (
    EditSpec,
    MemorySpec,
    RandomSpec,
    SingleFileSpec,
    controls_as_targets,
)
from core.models.components import extended
from core.models.families.qwen_image.family import QwenImageFamily
from core.models.families.qwen_image_edit.validation import (
    EDIT,
    PLUS,
    validation_pipeline_class,
)
from core.models.modules import unwrap

CONTROL_KEY = "datasets.N.control_2"  # the key that gives a pair its second reference


@dataclass
class QwenImageEditComponents(Components):
    """A loaded Qwen-Image-Edit model: its pipeline class (EDIT or PLUS) and its
    Qwen2VLProcessor beside the shared Components."""

    pipeline_class: str | None = None
    processor: Any = None


def random_tokenizer(cls: str, folder: Path, bang_padded: bool) -> Any:
    """random:qwen_image_edit's Qwen2.5-VL tokenizer, with the vision tokens."""
    from core.models.tiny.qwen import qwen_edit_tokenizer

    return qwen_edit_tokenizer(folder)


def random_settings(c: Components) -> QwenImageEditComponents:
    """random:qwen_image_edit is a QwenImageEditPipeline whose tokenizer is the tiny
    one: its vision token ids replace the real vocabulary's in the encoder's config,
    so the random encoder finds the image placeholders."""
    vocab = c.tokenizers[0].get_vocab()
    config = c.text_encoders[0].config
    for key, token in (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
                       ("vision_start_token_id", "<|vision_start|>"),
                       ("vision_end_token_id", "<|vision_end|>")):
        setattr(config, key, vocab[token])
    return extended(c, QwenImageEditComponents, pipeline_class=EDIT)


def _per_prompt(embeds: Any, mask: Any) -> list[dict[str, Any]]:
    """encode_prompt's padded batch as one dict per prompt, its own tokens only (as
    QwenImageFamily.encode_prompts: the pipelines drop an all-ones mask)."""
    import torch

    lengths = mask.sum(dim=1).tolist() if mask is not None else [embeds.shape[1]] * len(embeds)
    return [{"prompt_embeds": embeds[i, :n],
             "prompt_mask": torch.ones(n, dtype=torch.bool, device=embeds.device)}
            for i, n in enumerate(int(v) for v in lengths)]


def encode_controls(c: Components, controls: list[Any]) -> dict[str, Any]:
    """`controls_as_targets` ({"control_latents": [B, K, 16, h, w]}, each reference encoded
    as a target: the pipelines' `_encode_vae_image`), after the count check."""
    FAMILY.check_controls(c, len(controls))
    return controls_as_targets(FAMILY, c, controls)


def encode_prompts_with_images(c: Components, prompts: list[str],
                               images: list[list[Any]]) -> list[dict[str, Any]]:
    """Prompt i read with images[i] by the pipeline's own encode_prompt (see the module
    docstring), one prompt at a time; a prompt without images as `encode_prompts`."""
    import torch

    pipe = FAMILY.text_pipeline(c, c.pipeline_class or EDIT)
    out: list[dict[str, Any]] = []
    for prompt, own in zip(prompts, images, strict=True):
        if not own:
            out += FAMILY.encode_prompts(c, [prompt])
            continue
        with torch.no_grad():
            embeds, mask = pipe.encode_prompt(prompt=[prompt],
                                              image=FAMILY.prompt_images(c, own, pipe),
                                              device=c.text_encoders[0].device)
        out += _per_prompt(embeds, mask)
    return out


class QwenImageEditFamily(QwenImageFamily):
    name = "qwen_image_edit"
    # Its transformer files have Qwen-Image's keys (qwen_image claims them, this family
    # takes them too); folders are told apart by model_index.json: the longest prefix
    # wins over "QwenImage".
    single_file = SingleFileSpec(layout_of="qwen_image")
    single_file_default_config = "Qwen/Qwen-Image-Edit-2509"
    pipeline_prefix = "QwenImageEdit"
    pipeline_class_name = EDIT
    edit = EditSpec(references=3, text_reads_references=True, encode_controls=encode_controls,
                    encode_prompts_with_images=encode_prompts_with_images)
    # The memory estimate's text length: the prompt's (max_sequence_length, which the
    # edit pipelines do not truncate to) and a reference's vision tokens, 1369 at the
    # plain pipeline's 1024x1024 (37x37 merged 28-pixel patches) and its two markers; the
    # Plus models' three 384x384 references take fewer (3 x 196 and their markers).
    memory = MemorySpec(extra_text_tokens=1371, text_encoder_kind="llm")
    # tiny:qwen_image_edit_plus, a random QwenImageEditPlusPipeline (2511-shaped).
    trained_tiny = (("qwen_image_edit_plus", "core.models.families.qwen_image_edit.tiny_plus"),)
    random = RandomSpec(tokenizer=random_tokenizer, settings=random_settings)

    # ------------------------------------------------------------ loading

    def _pretrained_class(self, path: str, kind: loading.SourceKind) -> Any:
        """DiffusionPipeline: it picks the pipeline model_index.json names (Edit or Plus)."""
        from diffusers import DiffusionPipeline

        return DiffusionPipeline

    def _pretrained_components(self, path: str, kind: loading.SourceKind) -> dict[str, Any]:
        """The processor, loaded by processor.py (transformers needs torchvision for it)."""
        from core.models.families.qwen_image_edit.processor import load_processor

        return {"processor": load_processor(path, kind == "folder")}

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        kind = type(pipe).__name__
        if kind not in (EDIT, PLUS):
            raise loading.ModelLoadError(source, f"holds a {kind}, but {self.name} trains "
                                         f"{EDIT} (Qwen/Qwen-Image-Edit) and {PLUS} "
                                         "(Qwen/Qwen-Image-Edit-2509, -2511) models")
        c = super()._components_from_pipeline(pipe, source, fp)
        return extended(c, QwenImageEditComponents, pipeline_class=kind,
                        processor=pipe.processor)

    # ------------------------------------------------------------ references

    def max_controls(self, c: Components) -> int:
        """References this model takes: 1 for Qwen-Image-Edit, 3 for the Plus models."""
        return self.edit.references if c.pipeline_class == PLUS else 1

    def check_controls(self, c: Components, count: int, key: str = CONTROL_KEY) -> None:
        if count > self.max_controls(c):
            raise ValueError(f"{key} is set: this pair has {count} control images, but "
                             f"{c.source} is a Qwen-Image-Edit model ({EDIT}), which takes 1; "
                             "clear it, or use a Qwen-Image-Edit-2509/2511 model "
                             f"({PLUS}), which takes up to {self.edit.references}")

    # ------------------------------------------------------------ text

    def text_pipeline(self, c: Components, kind: str) -> Any:
        """A `kind` pipeline over the loaded modules, for its encode_prompt."""
        import diffusers

        return getattr(diffusers, kind)(
            transformer=unwrap(c.denoiser), scheduler=c.noise_scheduler, vae=c.vae,
            text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            processor=self.processor(c))

    def processor(self, c: Components) -> Any:
        """The loaded processor; random:'s Components have none, so the tiny one's is
        built over its tokenizer."""
        found = getattr(c, "processor", None)
        if found is not None:
            return found
        from core.models.families.qwen_image_edit.processor import new_processor
        from core.models.tiny.qwen import CHAT_TEMPLATE, VL_IMAGE_PROCESSOR

        return new_processor(c.tokenizers[0], VL_IMAGE_PROCESSOR, CHAT_TEMPLATE)

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Prompts without images, encoded as QwenImageEditPlusPipeline encodes them (see
        the module docstring), batched: [L_i, D] each, mask all True."""
        import torch

        with torch.no_grad():
            embeds, mask = self.text_pipeline(c, PLUS).encode_prompt(
                prompt=prompts, image=None, device=c.text_encoders[0].device)
        return _per_prompt(embeds, mask)

    def prompt_images(self, c: Components, images: list[Any], pipe: Any = None) -> Any:
        """What the loaded pipeline's __call__ hands encode_prompt for these PIL images
        (resized by its image_processor, lanczos): edit, the first at about 1024*1024
        pixels (multiples of 32) at its aspect ratio; plus, the list, each at about
        CONDITION_IMAGE_SIZE (384*384)."""
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as edit
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
            CONDITION_IMAGE_SIZE,
        )

        pipe = pipe if pipe is not None else self.text_pipeline(c, c.pipeline_class or EDIT)
        resize = pipe.image_processor.resize
        if c.pipeline_class == PLUS:
            out = []
            for image in images:
                width, height = plus.calculate_dimensions(CONDITION_IMAGE_SIZE,
                                                          image.size[0] / image.size[1])
                out.append(resize(image, height, width))
            return out
        self.check_controls(c, len(images))
        width, height, _ = edit.calculate_dimensions(1024 * 1024,
                                                     images[0].size[0] / images[0].size[1])
        return resize(images[0], height, width)

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """The target's velocity, its references beside it (see the module docstring);
        a batch without "control_latents" is Qwen-Image's text-to-image prediction."""
        import torch

        controls = batch.get("control_latents")
        if controls is None:
            return super().predict(c, sample, batch)
        model = c.denoiser
        dtype = unwrap(model).dtype
        noisy = sample.noisy.to(dtype)
        b = noisy.shape[0]
        device = noisy.device
        refs = [controls[i].to(device, dtype) for i in range(b)]  # [K, C, h, w] each
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, item in enumerate(refs):
            self.check_controls(c, item.shape[0])
            groups.setdefault(tuple(item.shape), []).append(i)
        embeds = batch["prompt_embeds"].to(device, dtype)
        mask = batch["prompt_mask"].to(device)
        timesteps = (sample.timesteps.to(device) / 1000).to(dtype).expand(b)
        if len(groups) == 1:  # the usual batch: one bucket, the same references
            return self._predict_group(c, noisy, torch.stack(refs), embeds, mask, timesteps)
        out = torch.empty_like(noisy)
        for idx in groups.values():
            rows = torch.tensor(idx, device=device)
            out[rows] = self._predict_group(
                c, noisy[rows], torch.stack([refs[i] for i in idx]), embeds[rows],
                mask[rows], timesteps[rows])
        return out

    def _predict_group(self, c: Components, noisy: Any, refs: Any, embeds: Any, mask: Any,
                       timesteps: Any) -> Any:
        """One transformer call: noisy [n, C, h, w], refs [n, K, C, h', w'] (one shape)."""
        import torch
        from diffusers import QwenImageEditPlusPipeline as Pipe

        n, ch, h, w = noisy.shape
        shapes = [(h, w), *(tuple(r.shape[-2:]) for r in refs[0])]
        if any(side % 2 for shape in shapes for side in shape):
            raise ValueError(f"qwen_image_edit latents must have even height and width, got "
                             f"{shapes}: use image sides that are multiples of 16 pixels")
        packed = Pipe._pack_latents(noisy, n, ch, h, w)
        tokens = [packed, *(Pipe._pack_latents(refs[:, k], n, ch, *refs.shape[-2:])
                            for k in range(refs.shape[1]))]
        out = c.denoiser(
            hidden_states=torch.cat(tokens, dim=1), encoder_hidden_states=embeds,
            encoder_hidden_states_mask=None if bool(mask.all()) else mask.long(),
            timestep=timesteps, img_shapes=[[(1, y // 2, x // 2) for y, x in shapes]] * n,
            return_dict=False)[0][:, :packed.shape[1]]
        scale = 2 ** len(c.vae.temperal_downsample)
        return Pipe._unpack_latents(out, h * scale, w * scale, scale).squeeze(2)

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """The loaded variant's pipeline (validation.py) sharing the loaded modules, its
        own scheduler; runs from embeddings with text_encoder None (validation.py says
        why); guidance_scale is the true-CFG scale, as for Qwen-Image."""
        pipe = validation_pipeline_class(c.pipeline_class or EDIT)(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            processor=getattr(c, "processor", None))
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def config_problems(self, cfg: Any) -> list[Any]:
        """Qwen-Image's (validation.steps), and a second reference for a model.path known
        to be a plain Qwen-Image-Edit (a folder's model_index.json, tiny:)."""
        from core.models.families.qwen_image_edit.checks import plain_edit_problems

        return super().config_problems(cfg) + plain_edit_problems(cfg)


FAMILY = QwenImageEditFamily()
