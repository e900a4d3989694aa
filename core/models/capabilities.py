"""What only some families can do, as optional spec objects on the family.

A family declares a capability once, as one of these objects (`family.audio`,
`family.edit`, ...); a family without it leaves the attribute None (FamilyDefaults), and
shared code asks `if family.audio:` and calls the spec's functions, never the family's
name. The functions a spec holds are plain module-level functions of the family's
folder, taking the loaded `Components` first where they need the model.

`memory`, `random` and `single_file` have an empty default (every family is estimated,
built offline and recognized from files); the others are None unless declared. Each
capability is one row of core/models/tags.py's table too, which the form, the config
files and the ops read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.models.components import Components


@dataclass(frozen=True)
class AudioSpec:
    """A family that trains a sound track with its clips (LTX-2).

    `sample_rate(c)`: the rate its audio encoder takes, which the cache reads a clip's
    track at. `encode(c, waveform, frames, fps, generator)`: latents [B, L, D] of
    `waveform` [B, channels, samples] at that rate, the track under `frames` frames at
    `fps`; cached in the clip's entry as "audio_latents" and handed to `predict` as a
    per-item list (None for a sample without audio)."""

    sample_rate: Callable[[Components], int]
    encode: Callable[..., Any]


def image_kwargs(images: list[Any], resolution: int) -> dict[str, Any]:
    """The pipeline keyword arguments of one validation prompt's control images (PIL RGB)
    for a validation at `resolution`: `image`, one image or a list of them."""
    return {"image": images[0] if len(images) == 1 else images}


@dataclass(frozen=True)
class EditSpec:
    """An edit family (FLUX.1 Kontext, Qwen-Image-Edit, FLUX.2): its samples take
    reference (control) images beside the target.

    `references`: how many a sample may take (datasets.N.control, control_2, ...).
    `optional`: references are optional (FLUX.2 draws from text alone too): a dataset
    without control folders trains text-to-image, and validation.control_images may be
    empty, or hold an empty entry for a prompt drawn without references.
    `text_reads_references`: its text encoder reads them with the prompt (Qwen2.5-VL), so
    text entries are keyed by caption and control images and encoded by
    `encode_prompts_with_images(c, prompts, images)` (images[i]: prompt i's controls as
    PIL RGB at their own size, orientation applied), which such a family must give.
    `encode_controls(c, controls)`: the cached control latents of one [B, 3, H, W] pixel
    batch in [-1, 1] per control, each resized and cropped to its target's bucket; None:
    `controls_as_targets`. `validation_kwargs(images, resolution)`: one validation
    prompt's validation.control_images as pipeline keywords."""

    references: int
    optional: bool = False
    text_reads_references: bool = False
    encode_prompts_with_images: Callable[..., list[dict[str, Any]]] | None = None
    encode_controls: Callable[[Components, list[Any]], dict[str, Any]] | None = None
    validation_kwargs: Callable[[list[Any], int], dict[str, Any]] = image_kwargs

    def __post_init__(self) -> None:
        # A family that says its text encoder reads the references must say how; caught
        # when the family module is imported, not at the first cached caption.
        if self.text_reads_references and self.encode_prompts_with_images is None:
            raise ValueError("EditSpec: text_reads_references needs "
                             "encode_prompts_with_images")


def controls_as_targets(family: Any, c: Components, controls: list[Any]) -> dict[str, Any]:
    """EditSpec.encode_controls' default: each control encoded as the family's
    `encode_images` encodes a target (posterior mean), stacked as {"control_latents":
    [B, K, C, h, w]}; the dataset hands them to `predict` as per-item [K, C, h, w]."""
    import torch

    return {"control_latents": torch.stack([family.encode_images(c, x) for x in controls],
                                           dim=1)}


def control_latents(family: Any, c: Components, controls: list[Any]) -> dict[str, Any]:
    """An edit family's cached control latents: its `edit.encode_controls`, else
    `controls_as_targets`."""
    own = family.edit.encode_controls
    return own(c, controls) if own is not None else controls_as_targets(family, c, controls)


@dataclass(frozen=True)
class FirstImageSpec:
    """Image-to-video: a model of the family may sample from a first image, so
    validation.control_images gives each validation prompt its first frame.

    `takes_first_image(model)`: whether the config's model section (paths resolved) does
    (wan's folders name their pipeline); `switch`: the family's own key where one
    checkpoint does both and the folder cannot say (ltx2's 'model.ltx2_mode =
    "image_to_video"'), which the check's warning on ignored control images names."""

    takes_first_image: Callable[[Any], bool]
    switch: str = ""
    validation_kwargs: Callable[[list[Any], int], dict[str, Any]] = image_kwargs


@dataclass(frozen=True)
class ExpertSpec:
    """A family whose models may hold several denoisers that take turns (Wan 2.2's high-
    and low-noise experts).

    `stacks(denoiser)`: one list of swappable blocks per expert (None where the loaded
    model has one denoiser: the family's block_lists apply). `parked(denoiser)`: modules
    that wait in host memory while another runs; `start_parking(denoiser, device,
    held_elsewhere)`: their turn-taking, once the adapter is on. `trained(cfg, loaded)`:
    how many of the `loaded` denoisers the run trains, for the memory estimate."""

    stacks: Callable[[Any], list[list[Any]] | None]
    parked: Callable[[Any], list[Any]]
    start_parking: Callable[[Any, Any, set[int]], None]
    trained: Callable[[Any, int], int]


@dataclass(frozen=True)
class SingleFileSpec:
    """Original-format single files (core/models/loading.py).

    `markers`: key fragments that mark the family's checkpoints; `rank`: the order
    families are tried in (lower first: the most specific, whose keys include another
    family's); `layout_of`: the family whose single files have this layout too
    (Kontext's are FLUX.1's); `problems(config, prediction_type)`: --stage check
    warnings about what diffusers' default configs for a usable file mean.
    `checkpoint_text_encoders`: the merged model as one original-layout checkpoint
    (merged.safetensors), each text encoder's (component folder, key prefix, "clip" |
    "open_clip"); empty: no such layout, and merge writes merged/ alone."""

    markers: tuple[str, ...] = ()
    rank: int = 100
    layout_of: str = ""
    problems: Callable[[str, str], list[Any]] | None = None
    checkpoint_text_encoders: tuple[tuple[str, str, str], ...] = ()


def class_tokenizer(cls: str, folder: Path, bang_padded: bool) -> Any:
    """random:<family>'s tokenizer of the class `cls` its model_index.json names: the
    tiny T5 one, the real byte-level ByT5 (no files to fetch), else the tiny CLIP one,
    padding with "!" where `bang_padded` (OpenCLIP's in the real models) and with
    end-of-text otherwise; written to `folder` and loaded."""
    if cls.startswith("T5"):
        from core.models.tiny.t5 import t5_tokenizer

        return t5_tokenizer(folder)[0]
    if cls == "ByT5Tokenizer":
        from transformers import ByT5Tokenizer

        return ByT5Tokenizer()
    from core.models.tiny.clip import EOS_TOKEN, clip_tokenizer

    return clip_tokenizer(folder, pad_token="!" if bang_padded else EOS_TOKEN)


@dataclass(frozen=True)
class RandomSpec:
    """`random:<family>`: the full-size model built offline with random weights
    (core/models/full_size/build.py), so the check estimates real sizes.

    `scheduler`: the scheduler class training uses (None: the one model_index.json
    names); `bang_padded_tokenizers`: CLIP tokenizers that pad with "!" as OpenCLIP's do;
    `tokenizer(cls, folder, bang_padded)`: each tokenizer of the class `cls`, written to
    `folder` and loaded (`class_tokenizer` by default; a family whose real model has
    another tokenizer, as a Qwen2 one with its template, gives its own); `settings(c)`:
    the family's Components as `load` makes them (its subclass and own settings), from
    the shared ones a random model is built as (without a pipeline)."""

    scheduler: str | None = None
    bang_padded_tokenizers: tuple[str, ...] = ()
    tokenizer: Callable[[str, Path, bool], Any] = class_tokenizer
    settings: Callable[[Components], Components] | None = None


@dataclass(frozen=True)
class MemorySpec:
    """What the memory estimate (core/memory/) needs to know beyond the configs.

    `extra_text_tokens`: tokens attended beside the padded max_sequence_length (SD3's
    CLIP tokens); `latent_packing`: the latent patch the family packs before the
    transformer (Flux-style 2x2, core/models/flow.py's pack_2x2: 2);
    `activation_layout(config)`: a transformer config the MMDiT activation formula
    cannot read as is -> (MMDiT-shaped config, patch size); `extra_stream(config,
    shape)`: a second token stream the denoiser runs beside the image tokens (LTX-2's
    audio) -> (its MMDiT-shaped config, its step shape), estimated with the MMDiT
    formula at the family's text tokens, a token per latent; `text_encoder_kind`: "llm"
    where a text encoder is a decoder language model (read at the family's text
    length, not its context window), "" otherwise."""

    extra_text_tokens: int = 0
    latent_packing: int = 1
    activation_layout: Callable[[dict[str, Any]], tuple[dict[str, Any], int]] | None = None
    extra_stream: Callable[[dict[str, Any], Any], tuple[dict[str, Any], Any]] | None = None
    text_encoder_kind: str = ""


@dataclass(frozen=True)
class ValidationSpec:
    """How validation samples with the family's pipeline.

    `list_prompt_embeds`: the pipeline takes a list of per-prompt embeds (Z-Image);
    `mask_kwarg`: the keyword the text mask goes in (Chroma), or None;
    `negative_prompt_note`: why it draws without a negative prompt, as the check's
    warning ends it ("" : it uses one); `distilled`: a distilled checkpoint's (steps,
    guidance) for validation.model, None where none is known."""

    list_prompt_embeds: bool = False
    mask_kwarg: str | None = None
    negative_prompt_note: str = ""
    distilled: tuple[int, float] | None = None
