"""FLUX.3's validation pipeline: a genuine Flux3ModularPipeline (Flux3DistilledModularPipeline
for a step-distilled checkpoint), built as diffusers documents a modular pipeline: its auto
blocks less the prompt upsampler (`folder.blocks_for`), `init_pipeline()`, then
`update_components(...)` with the loaded modules. So `load_lora_weights` (its
Flux3LoraLoaderMixin), `fuse_lora` and `save_pretrained` are diffusers' own, and merge
writes a folder with modular_model_index.json that `ModularPipeline.from_pretrained` loads.

The one block swapped in: the text encoder step becomes `GivenTextStep`, a subclass of
diffusers' step that also takes `prompt_embeds` / `negative_prompt_embeds` (the cache's,
as validation passes them) and uses them as given, and otherwise encodes the prompt as
diffusers' step does. Its components are the step's (text_encoder, tokenizer), so the
pipeline still carries and saves them; the saved index names the same blocks class
(Flux3AutoBlocks), so the folder loads with the stock blocks. It also reads validation's
`guidance_scale`, which the base pipeline takes through its guider
(ClassifierFreeGuidance: uncond + g (cond - uncond), on above 1): it sets the guider's
scale. The distilled blocks have no guider and no negative prompt (16 steps, no
classifier-free guidance); there both are ignored.

The call returns diffusers' PipelineState, whose `.images` are the decoded PIL images.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from core.models.families.flux3.folder import TextProcessor, blocks_for


@functools.cache
def given_text_step(distilled: bool) -> Any:
    """GivenTextStep over the base's or the distilled text encoder step (built once)."""
    from diffusers.modular_pipelines.flux3.encoders import (
        Flux3DistilledTextEncoderStep,
        Flux3TextEncoderStep,
    )
    from diffusers.modular_pipelines.modular_pipeline_utils import InputParam

    base = Flux3DistilledTextEncoderStep if distilled else Flux3TextEncoderStep

    class GivenTextStep(base):  # type: ignore[valid-type, misc]
        """The text encoder step, taking the embeddings when they are given."""

        @property
        def inputs(self) -> list[Any]:
            # the prompt is optional here: the embeddings may come instead
            own = [dataclasses.replace(p, required=False) if p.name == "prompt" else p
                   for p in super().inputs]
            extra = [InputParam("prompt_embeds"), InputParam("guidance_scale")]
            if not distilled:
                extra.append(InputParam("negative_prompt_embeds"))
            return [*own, *extra]

        def __call__(self, components: Any, state: Any) -> Any:
            block_state = self.get_block_state(state)
            guider = getattr(components, "guider", None)
            if guider is not None and block_state.guidance_scale is not None:
                guider.guidance_scale = float(block_state.guidance_scale)
            if block_state.prompt_embeds is None:
                return super().__call__(components, state)
            self.set_block_state(state, block_state)
            return components, state

    return GivenTextStep


def validation_pipeline(c: Any, transformer: Any, scheduler: Any) -> Any:
    """The modular pipeline over the loaded modules (see the module docstring); a text
    encoder left out (validation drops it: the prompts are encoded) stays unset."""
    from diffusers import ClassifierFreeGuidance

    blocks = blocks_for(c.is_distilled)
    blocks.sub_blocks["text_encoder"] = given_text_step(c.is_distilled)()
    pipe = blocks.init_pipeline()
    parts: dict[str, Any] = {"transformer": transformer, "vae": c.vae, "scheduler": scheduler}
    if c.text_encoders and c.text_encoders[0] is not None:
        parts.update(text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0])
    if not c.is_distilled:
        parts["guider"] = ClassifierFreeGuidance()
    pipe.update_components(**parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def processor(tokenizer: Any) -> Any:
    """What diffusers' text step calls `tokenizer`: a loaded tokenizer wrapped, or a
    processor (which has `.tokenizer` already) as it is."""
    return tokenizer if hasattr(tokenizer, "tokenizer") else TextProcessor(tokenizer)
