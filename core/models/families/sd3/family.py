"""Stable Diffusion 3 / 3.5: MMDiT transformer, CLIP-L + CLIP-G + T5, flow matching.

Text, as StableDiffusion3Pipeline.encode_prompt builds it (that method is called): the
penultimate hidden states of both CLIPs (77 tokens each, padded to 77) are concatenated
along features, zero-padded to T5's width and concatenated along the sequence with T5's
states (padded to `max_sequence_length` = 256, the pipeline default): L = 77 + 256.
The pooled embedding is both CLIPs' projected pooled outputs concatenated. A model saved
without its T5 (text_encoder_3 missing) loads with text_encoder_3=None and the pipeline's
zero T5 states, which the mask marks as padding.

Flow matching and LoRA details: see flow.py. The tiny model: tiny.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.models import loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, RandomSpec, SingleFileSpec
from core.models.components import extended
from core.models.flow import FlowFamily
from core.models.modules import unwrap
from core.models.routing import RoutingSpec, Slot

# diffusers' train_dreambooth_lora_sd3.py default: both streams' attention projections.
LORA_TARGETS = [
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
    "attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v",
]


@dataclass
class SD3Components(Components):
    """A loaded SD3: whether its T5 encoder was loaded (a folder may leave it out)."""

    has_t5: bool = False


def random_settings(c: Components) -> SD3Components:
    """random:sd3 as `load` gives it: T5 is loaded where it was built (the third)."""
    return extended(c, SD3Components, has_t5=len(c.text_encoders) == 3)


class SD3Family(FlowFamily):
    name = "sd3"
    block_lists = ("transformer_blocks",)
    # train.token_routing: a block takes (hidden_states, encoder_hidden_states, temb) and
    # gives (encoder_hidden_states, hidden_states); positions are added before the
    # blocks, so there is no rotary table to narrow.
    routing = RoutingSpec(hidden=Slot(0, "hidden_states"), output=1)
    # Original-format single files and diffusers folders (core/models/loading.py).
    single_file = SingleFileSpec(markers=("joint_blocks.",), rank=40)
    pipeline_prefix = "StableDiffusion3"
    text_encoder_count = 3
    pipeline_class_name = "StableDiffusion3Pipeline"
    # A file of the transformer alone (ComfyUI's diffusion-model files, bf16, fp8 or
    # fp8_scaled); a checkpoint bundling the text encoders loads as a whole pipeline.
    transformer_class_name = "SD3Transformer2DModel"
    single_file_default_config = "stabilityai/stable-diffusion-3.5-medium"
    whole_checkpoints = True
    max_sequence_length = 256
    memory = MemorySpec(extra_text_tokens=77)  # the CLIP tokens attended beside T5's
    # OpenCLIP's tokenizer pads with "!"
    random = RandomSpec(bang_padded_tokenizers=("tokenizer_2",), settings=random_settings)

    # ------------------------------------------------------------ loading

    def _pretrained_components(self, path: str, kind: loading.SourceKind) -> dict[str, Any]:
        """SD3 folders without the (large) T5 reload only with both parts set to None."""
        if kind == "folder" and not (Path(path) / "text_encoder_3").is_dir():
            return {"text_encoder_3": None, "tokenizer_3": None}
        return {}

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        encoders = [pipe.text_encoder, pipe.text_encoder_2]
        tokenizers = [pipe.tokenizer, pipe.tokenizer_2]
        if pipe.text_encoder_3 is not None:
            encoders.append(pipe.text_encoder_3)
            tokenizers.append(pipe.tokenizer_3)
        return SD3Components(
            family=self.name, source=source, fingerprint=fp, vae=pipe.vae,
            denoiser=pipe.transformer, text_encoders=encoders, tokenizers=tokenizers,
            noise_scheduler=pipe.scheduler, has_t5=pipe.text_encoder_3 is not None)

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [77 + 256, D_t5], prompt_mask, pooled_prompt_embeds."""
        import torch

        pipe = self.validation_pipeline(c)
        msl = self.sequence_length(c)
        with torch.no_grad():
            embeds, _, pooled, _ = pipe.encode_prompt(
                prompt=prompts, prompt_2=None, prompt_3=None, device=c.vae.device,
                do_classifier_free_guidance=False, max_sequence_length=msl)
        clip_mask = c.tokenizers[0](prompts, padding="max_length",
                                    max_length=pipe.tokenizer_max_length, truncation=True,
                                    return_tensors="pt").attention_mask.bool()
        if c.has_t5:
            t5_mask = c.tokenizers[2](prompts, padding="max_length", max_length=msl,
                                      truncation=True, return_tensors="pt").attention_mask.bool()
        else:
            t5_mask = torch.zeros(len(prompts), msl, dtype=torch.bool)
        mask = torch.cat([clip_mask, t5_mask], dim=1)
        return [{"prompt_embeds": embeds[i], "prompt_mask": mask[i],
                 "pooled_prompt_embeds": pooled[i]} for i in range(len(prompts))]

    def text_length(self, c: Components) -> int:
        clip_len = getattr(c.tokenizers[0], "model_max_length", 77)
        return clip_len + self.sequence_length(c)

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """The transformer's velocity for the batch; the text mask is not given to it
        (SD3 attends to all 333 text tokens, as in the pipeline)."""
        self.check_text_length(batch, self.text_length(c))
        model = c.denoiser
        dtype = unwrap(model).dtype
        device = sample.noisy.device
        return model(
            hidden_states=sample.noisy.to(dtype),
            timestep=sample.timesteps.to(device),
            encoder_hidden_states=batch["prompt_embeds"].to(device, dtype),
            pooled_projections=batch["pooled_prompt_embeds"].to(device, dtype),
            return_dict=False)[0]

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        extra = ["ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2",
                 "proj_out"]
        return LORA_TARGETS + (extra if scope == "all" else [])

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """A StableDiffusion3Pipeline sharing the loaded modules (its own scheduler)."""
        from diffusers import StableDiffusion3Pipeline

        has_t5 = c.has_t5
        pipe = StableDiffusion3Pipeline(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c),
            vae=c.vae, text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            text_encoder_2=c.text_encoders[1], tokenizer_2=c.tokenizers[1],
            text_encoder_3=c.text_encoders[2] if has_t5 else None,
            tokenizer_3=c.tokenizers[2] if has_t5 else None)
        pipe.set_progress_bar_config(disable=True)
        return pipe


FAMILY = SD3Family()
