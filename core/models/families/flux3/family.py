"""FLUX.3: Flux3Transformer2DModel (per-mode blocks, then joint single blocks), FLUX.2's
VAE (AutoencoderKLFlux2), a Qwen3-VL text encoder read at eight layers, flow matching.
diffusers ships it as modular pipelines only (Flux3ModularPipeline, and
Flux3DistilledModularPipeline for the step-distilled checkpoint), no DiffusionPipeline:
folder.py reads its folders (modular_model_index.json), validation.py builds the modular
pipeline, checks.py holds the check's problems. No diffusers training script exists for
it; the objective below is the pipeline's sampling read backwards, as for FLUX.2.

Text, as diffusers' Flux3TextEncoderStep builds it (its `_get_qwen3_vl_prompt_embeds` is
called with the step's own defaults): one prompt at a time through the chat template,
right-padded to a multiple of 80 tokens (capped at 8192), the Qwen3-VL hidden states at
(4, 8, ..., 32) stacked along features -> [L, 8 x hidden]. The transformer attends to the
padding (it takes no text mask), so the padded window is the prompt's embedding and the
cache keeps all of it (mask all True). A batch of prompts with different windows is
padded by collate (mask False) and `predict` runs each window length apart, so every
sample sees exactly its own window, as the pipeline's one-prompt calls do. txt_ids: the
step's (t, h, w, l) = (0, 0, 0, l).

Latents: as FLUX.2's (flux2/family.py `encode_images`, the same VAE and the same step in
Flux3VaeEncoderStep): posterior mode, 2x2 patchified, batch-norm normalised ->
[B, 128, H/16, W/16]. `predict` flattens them to tokens as Flux3PrepareLatentsStep does,
with its image ids (t, h, w, l) = (0, h/2, w/2, 0) (image_rope_scale 0.5), and folds
the velocity back as Flux3UnpackLatentsStep does.

Timesteps: the pipeline samples with a constant shift, 6.93 (Flux3SetTimestepsStep's
scheduler config; no dynamic shifting), on sigmas linspace(1, 1/n); training draws
sigmas logit-normally (the SD3 recipe flow.py uses for FLUX.1/FLUX.2) and shifts them by
the scheduler's shift, as SD3 trains with its static one (flow.py `train_shift`). The
transformer takes sigma itself (timesteps / 1000). Loss: MSE against noise - latents.

Guidance: the transformer has no guidance embedding (train.guidance is refused); the
base pipeline's guider is classifier-free guidance (uncond + g (cond - uncond), default
3.5), with the negative prompt's embeddings. Distilled: the step-distilled checkpoint is
a flow map (transformer config `flow_map`: it also takes the timestep each step jumps
to, 16 steps, no guidance); the check warns that training should use the base
(checks.py). Trained anyway, it is given target = timestep, the flow map's instantaneous
velocity, which is what the flow-matching target is.

LoRA: attention (to_q, to_k, to_v, to_out.0) of every block; "all" adds the
feed-forwards. Files: Flux3ModularPipeline.save_lora_weights (Flux3LoraLoaderMixin), which
its load_lora_weights reads. ComfyUI 0.29.0 has no FLUX.3 (no model in comfy/ldm, no
key map in comfy/lora.py), so no lora_comfyui.safetensors is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.models import loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, RandomSpec, SingleFileSpec, ValidationSpec
from core.models.components import extended
from core.models.families.flux2.family import Flux2Family
from core.models.flow import FlowFamily
from core.models.geometry import Geometry
from core.models.modules import freeze, unwrap

LORA_TARGETS = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"]
LORA_EXTRA = ["ff.linear_in", "ff.linear_out"]


def text_settings() -> tuple[int, int, tuple[int, ...]]:
    """(pad multiple, longest window, hidden-state taps): Flux3TextEncoderStep's."""
    from diffusers.modular_pipelines.flux3.encoders import Flux3TextEncoderStep

    step = Flux3TextEncoderStep()
    defaults = {p.name: p.default for p in step.inputs}
    return (step.pad_multiple, int(defaults["max_sequence_length"]),
            tuple(defaults["text_encoder_out_layers"]))


@dataclass
class Flux3Components(Components):
    """A loaded FLUX.3: whether it is the step-distilled flow map (its transformer config's
    `flow_map`), which validation samples with Flux3DistilledModularPipeline."""

    is_distilled: bool = False


def random_tokenizer(cls: str, folder: Path, bang_padded: bool) -> Any:
    """random:flux3's Qwen3 tokenizer: the tiny build's."""
    from core.models.tiny.qwen3 import qwen_tokenizer

    return qwen_tokenizer(folder)


def random_settings(c: Components) -> Flux3Components:
    """random:flux3 as `load` gives it: distilled where the shipped transformer config
    is a flow map."""
    from core.models.full_size.spec import component_config

    flow_map = component_config(c.family, "transformer").get("flow_map")
    return extended(c, Flux3Components, is_distilled=bool(flow_map))


class Flux3Family(FlowFamily):
    name = "flux3"
    geometry = Geometry(latent_channels=32)  # FLUX.2's 32-channel VAE
    # Forward order: the text's per-mode blocks, the image's (mode_blocks["image"], a
    # ModuleDict entry: a dotted name), the joint blocks. The reference-image blocks
    # (mode_blocks["image_cond"]) never run in text-to-image training.
    block_lists = ("txt_mode_blocks", "mode_blocks.image", "single_transformer_blocks")
    routing = None  # the joint blocks run text and image as one sequence
    # BFL's original names (diffusers' single_file_utils "flux3" marker)
    single_file = SingleFileSpec(markers=("early_stream_modulations.image.",), rank=15)
    pipeline_prefix = "Flux3"
    pipeline_class_name = "Flux3ModularPipeline"  # save_lora_weights: Flux3LoraLoaderMixin
    text_encoder_count = 1
    # The text window the memory estimate counts: a long caption's. Encoding uses the
    # pipeline's own window (text_settings: a multiple of 80, at most 8192).
    max_sequence_length = 512
    # 2x2 latent patches, packed in encode_images (as FLUX.2); Qwen3-VL reads the text.
    memory = MemorySpec(latent_packing=2, text_encoder_kind="llm")
    # validation.model on the step-distilled checkpoint: 16 steps, no guidance (its blocks)
    validation = ValidationSpec(
        negative_prompt_note=("only the FLUX.3 base uses it (classifier-free guidance); "
                              "the step-distilled checkpoint draws without it"),
        distilled=(16, 1.0))
    random = RandomSpec(tokenizer=random_tokenizer, settings=random_settings)

    encode_images = Flux2Family.encode_images  # the same VAE and normalisation

    # ------------------------------------------------------------ loading

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None, denoiser: Any = None) -> Components:
        """A FLUX.3 diffusers folder or hub id (folder.py); a single file is refused."""
        from core.models.families.flux3.folder import load_parts

        dtype = loading.resolve_dtype(dtype)
        kind = loading.checked_source(path, self.name)
        if kind == "file":
            raise loading.ModelLoadError(
                path, "is a single-file FLUX.3 checkpoint; this tool loads FLUX.3 from a "
                "diffusers folder (the one holding modular_model_index.json) or a hub id: "
                "set model.path to that")
        try:
            parts = load_parts(path, dtype, local_only=(kind == "folder"),
                               transformer=denoiser)
        except Exception as exc:  # noqa: BLE001 - every loader failure becomes one message
            if kind == "hub":
                raise loading.hub_error(path, "the flux3 model", exc) from exc
            raise loading.ModelLoadError(path, f"cannot load this FLUX.3 diffusers folder: "
                                         f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        c = Flux3Components(
            family=self.name, source=path, fingerprint=loading.fingerprint(path, kind),
            vae=parts["vae"], denoiser=parts["transformer"],
            text_encoders=[parts["text_encoder"]], tokenizers=[parts["tokenizer"]],
            noise_scheduler=parts["scheduler"],
            is_distilled=bool(parts["transformer"].config.get("flow_map", False)))
        freeze((c.vae, *([] if denoiser is not None else [c.denoiser]), *c.text_encoders),
               device)
        return c

    # ------------------------------------------------------------ text

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [L, 8 x hidden] (its padded window), prompt_mask [L]
        all True (see the module docstring)."""
        import torch
        from diffusers.modular_pipelines.flux3.encoders import Flux3TextEncoderStep

        from core.models.families.flux3.validation import processor

        pad, longest, taps = text_settings()
        encoder = c.text_encoders[0]
        out = []
        with torch.no_grad():
            for prompt in prompts:
                embeds = Flux3TextEncoderStep._get_qwen3_vl_prompt_embeds(
                    encoder, processor(c.tokenizers[0]), prompt, device=encoder.device,
                    max_sequence_length=longest, pad_multiple=pad, hidden_states_layers=taps)
                out.append({"prompt_embeds": embeds[0],
                            "prompt_mask": torch.ones(embeds.shape[1], dtype=torch.bool,
                                                      device=embeds.device)})
        return out

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """Tokens and ids as the pipeline's steps make them; each text window length run
        apart (see the module docstring); the velocity folded back to [B, C, h, w]."""
        import torch

        noisy = sample.noisy.to(unwrap(c.denoiser).dtype)
        lengths = batch["prompt_mask"].to(noisy.device).bool().sum(dim=1)
        order, outs = [], []
        for length in lengths.unique().tolist():
            rows = (lengths == length).nonzero().flatten()
            order.append(rows)
            outs.append(self._run(c, noisy[rows], sample.timesteps[rows.cpu()],
                                  batch["prompt_embeds"][rows.cpu(), :length]))
        merged = torch.cat(outs)
        return merged[torch.cat(order).argsort()]

    def _run(self, c: Components, noisy: Any, timesteps: Any, embeds: Any) -> Any:
        """One transformer call: [b, C, h, w] latents, [b, L, D] text of one length."""
        from diffusers.modular_pipelines.flux3.before_denoise import (
            Flux3PrepareLatentsStep,
            Flux3TextRoPEInputsStep,
            _prepare_image_ids,
        )

        model = c.denoiser
        inner = unwrap(model)
        b, ch, h, w = noisy.shape
        device, dtype = noisy.device, noisy.dtype
        rope_scale = Flux3PrepareLatentsStep().image_rope_scale
        embeds = embeds.to(device, dtype)
        sigma = (timesteps.to(device) / 1000).to(dtype)
        # a flow map (distilled) is asked for its instantaneous velocity: target = sigma
        target = sigma if inner.config.flow_map else None
        out = model(hidden_states=noisy.flatten(2).transpose(1, 2), encoder_hidden_states=embeds,
                    timestep=sigma, img_ids=_prepare_image_ids(h, w, rope_scale).to(device),
                    txt_ids=Flux3TextRoPEInputsStep._prepare_text_ids(embeds).to(device),
                    target_timestep=target, return_dict=False)[0]
        return out.transpose(1, 2).reshape(b, ch, h, w)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return LORA_TARGETS + (LORA_EXTRA if scope == "all" else [])

    def _save_comfy(self, c: Components, peft_sd: dict[str, Any], config: Any,
                    path: Path) -> Path | None:
        """None: ComfyUI 0.29.0 has no FLUX.3 to map a file onto (module docstring)."""
        return None

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """Flux3ModularPipeline (or the distilled one) over the loaded modules, taking the
        cache's embeddings (validation.py)."""
        from core.models.families.flux3.validation import validation_pipeline

        return validation_pipeline(c, unwrap(c.denoiser), self.validation_scheduler(c))

    def config_problems(self, cfg: Any) -> list[Any]:
        """The distilled checkpoint, a folder missing its index or a component (checks.py)."""
        from core.models.families.flux3.checks import model_problems

        return model_problems(cfg.model.path)


FAMILY = Flux3Family()
