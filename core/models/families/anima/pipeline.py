"""AnimaModularPipeline as this family loads and samples it. Imported inside family.py's
functions only: it imports diffusers at the top.

Loading (`load_pipeline`) is diffusers' documented way for a modular pipeline:
`ModularPipeline.from_pretrained(path)` reads modular_model_index.json (a local copy
loads the components found in it), then `load_components`. diffusers logs a component
that fails to load and leaves it None: here that is an error naming the folder and the
component.

Sampling with the cached text (`validation_pipeline`): an AnimaModularPipeline whose
blocks are `CachedTextBlocks`, diffusers' own Anima steps after the text encoder and the
text conditioner (text input, latents, timesteps, the guided denoising loop, decoding),
led by `CachedTextStep`, which takes the cache's conditioned embeddings (the real tokens
only) and pads them with zero rows to the conditioner's 512, as AnimaTextConditioner's
output is, and sets the guider's scale from the call's `guidance_scale`. The pipeline
holds every Anima component (the text side too, for --stage merge, which loads the LoRA
into it with AnimaLoraLoaderMixin's load_lora_weights, fuses it and saves the folder);
its config names AnimaAutoBlocks, so the saved folder loads as any Anima folder.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import AnimaModularPipeline, ModularPipeline
from diffusers.guiders import ClassifierFreeGuidance
from diffusers.modular_pipelines import ModularPipelineBlocks, SequentialPipelineBlocks
from diffusers.modular_pipelines.anima.before_denoise import (
    AnimaPrepareLatentsStep,
    AnimaSetTimestepsStep,
    AnimaTextInputStep,
)
from diffusers.modular_pipelines.anima.denoise import AnimaDenoiseStep
from diffusers.modular_pipelines.anima.encoders import AnimaTextEncoderStep
from diffusers.modular_pipelines.anima.modular_blocks_anima import AnimaDecodeStep
from diffusers.modular_pipelines.modular_pipeline_utils import (
    ComponentSpec,
    InputParam,
    OutputParam,
)

from core.models import loading
from core.models.families.anima.cosmos_shim import ensure_padding_resize

# What training loads (the denoiser, the VAE, the text side), in modular_model_index.json's
# names; the scheduler is read too (noise and validation).
COMPONENTS = ("transformer", "vae", "text_encoder", "text_conditioner", "tokenizer",
              "t5_tokenizer", "scheduler")
TEXT_ROWS = 512  # AnimaTextConditioner's min_sequence_length: its output's rows


def load_pipeline(path: str, kind: loading.SourceKind, dtype: Any,
                  transformer: Any = None) -> Any:
    """The AnimaModularPipeline of folder or hub id `path` with its components loaded
    (`transformer`: one built already, the streamed load's)."""
    ensure_padding_resize()
    pipe = loading.from_pretrained(ModularPipeline, path, kind, "the Anima modular pipeline")
    if not isinstance(pipe, AnimaModularPipeline):
        raise loading.ModelLoadError(path, f"holds a {type(pipe).__name__}, not an Anima "
                                     "modular pipeline (AnimaModularPipeline)")
    names = [n for n in COMPONENTS if not (n == "transformer" and transformer is not None)]
    kwargs: dict[str, Any] = {"local_files_only": kind == "folder"}
    if dtype is not None:
        kwargs["dtype"] = {n: dtype for n in names if "token" not in n and n != "scheduler"}
    pipe.load_components(names=names, **kwargs)
    if transformer is not None:
        pipe.update_components(transformer=transformer)
    missing = [n for n in COMPONENTS if getattr(pipe, n, None) is None]
    if missing:
        raise loading.ModelLoadError(path, f"has no loadable {', '.join(missing)} (the "
                                     "components its modular_model_index.json names): the "
                                     "download is incomplete or a component's files are "
                                     "missing; fetch it again")
    return pipe


def conditioned_text(pipe: Any, prompt: str, max_length: int) -> Any:
    """One prompt through the pipeline's own text steps (Qwen3 hidden states and T5 ids,
    then the text conditioner), alone as the pipeline encodes one prompt: [T, D], the
    rows of its T real T5 tokens (the conditioner zeroes and pads the rest)."""
    from diffusers.modular_pipelines.anima.before_denoise import AnimaTextConditioningStep

    device = pipe.text_conditioner.device
    text = AnimaTextEncoderStep.encode_prompt(
        pipe, prompt=[prompt], prepare_unconditional_embeds=False,
        max_sequence_length=max_length, device=device, dtype=pipe.text_encoder.dtype)
    embeds = AnimaTextConditioningStep._condition_prompt_embeds(
        pipe, text["qwen_prompt_embeds"], text["qwen_attention_mask"], text["t5_input_ids"],
        text["t5_attention_mask"], device, pipe.text_conditioner.dtype,
        pipe.text_conditioner.dtype)
    return embeds[0, :int(text["t5_attention_mask"].sum())]


def pad_rows(embeds: Any, rows: int = TEXT_ROWS) -> Any:
    """[B, L, D] text with zero rows appended up to `rows` (the conditioner's padding)."""
    import torch.nn.functional as F

    return F.pad(embeds, (0, 0, 0, max(0, rows - embeds.shape[1])))


class CachedTextStep(ModularPipelineBlocks):
    """The cache's conditioned embeddings in place of the text encoder and conditioner
    steps (module docstring)."""

    model_name = "anima"

    @property
    def description(self) -> str:
        return "Cached Anima text (conditioned embeddings), padded as the conditioner pads."

    @property
    def expected_components(self) -> list[ComponentSpec]:
        text = AnimaTextEncoderStep().expected_components
        from diffusers import AnimaTextConditioner

        return [*text, ComponentSpec("text_conditioner", AnimaTextConditioner)]

    @property
    def inputs(self) -> list[InputParam]:
        return [InputParam("prompt_embeds", required=True, type_hint=torch.Tensor),
                InputParam("negative_prompt_embeds", type_hint=torch.Tensor),
                InputParam("guidance_scale", type_hint=float)]

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [OutputParam("prompt_embeds", type_hint=torch.Tensor),
                OutputParam("negative_prompt_embeds", type_hint=torch.Tensor)]

    @torch.no_grad()
    def __call__(self, components: Any, state: Any) -> tuple[Any, Any]:
        block_state = self.get_block_state(state)
        block_state.prompt_embeds = pad_rows(block_state.prompt_embeds)
        if block_state.negative_prompt_embeds is not None:
            block_state.negative_prompt_embeds = pad_rows(block_state.negative_prompt_embeds)
        if block_state.guidance_scale is not None:
            components.update_components(guider=ClassifierFreeGuidance(
                guidance_scale=float(block_state.guidance_scale)))
        self.set_block_state(state, block_state)
        return components, state


class CachedTextBlocks(SequentialPipelineBlocks):
    """Anima's text-to-image blocks from the cached text on (module docstring)."""

    block_classes = [CachedTextStep, AnimaTextInputStep, AnimaPrepareLatentsStep,
                     AnimaSetTimestepsStep, AnimaDenoiseStep, AnimaDecodeStep]
    block_names = ["cached_text", "input", "prepare_latents", "set_timesteps", "denoise",
                   "decode"]

    @property
    def description(self) -> str:
        return "Anima text-to-image from cached conditioned text embeddings."


def validation_pipeline(modules: dict[str, Any]) -> Any:
    """An AnimaModularPipeline on CachedTextBlocks holding `modules` (None ones left
    out: validation runs without the text side)."""
    ensure_padding_resize()
    pipe = AnimaModularPipeline(blocks=CachedTextBlocks())
    pipe.update_components(**{k: v for k, v in modules.items() if v is not None})
    pipe.register_to_config(_blocks_class_name="AnimaAutoBlocks")
    pipe.set_progress_bar_config(disable=True)
    return pipe
