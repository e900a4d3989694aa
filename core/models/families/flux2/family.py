"""FLUX.2: Flux2Transformer2DModel (double + single stream), AutoencoderKLFlux2, one LLM
text encoder, flow matching. Two pipelines, picked by the folder's model_index.json:
- Flux2KleinPipeline (FLUX.2-klein 4B/9B, base or step-distilled): Qwen3ForCausalLM;
- Flux2Pipeline (FLUX.2-dev): Mistral3ForConditionalGeneration with its AutoProcessor.

Text, as each pipeline's `encode_prompt` builds it (that method is called, with the
pipeline's own defaults): the prompt in the chat template (klein: one user message,
generation prompt, thinking off; dev: the pipeline's system message + user message),
padded to `max_sequence_length` = 512, and the hidden states of three layers stacked
along features: klein (9, 18, 27), dev (10, 20, 30) -> [512, 3 x hidden]. (diffusers'
train_dreambooth_lora_flux2_klein.py defaults to (10, 20, 30), copied from the dev
script; the klein pipeline, which generates with the LoRA, uses (9, 18, 27), so training
does too.) txt_ids are the pipeline's `_prepare_text_ids` (t, h, w, l) = (0, 0, 0, l).

Latents, and what the caches hold: `encode_images` returns what the transformer trains
on, as the training scripts and `_encode_vae_image` make it: the VAE posterior mode
(mean) [B, C, H/8, W/8], patchified into 2x2 patches (`_patchify_latents`:
[B, 4C, H/16, W/16]) and normalised with the VAE's batch-norm running statistics,
(x - running_mean) / sqrt(running_var + batch_norm_eps). So the cache holds 4-D
normalised patchified latents (128 channels for the real VAE), noise is drawn in that
space (as the scripts' randn_like(model_input)), and no per-step VAE maths remains.
A cache therefore belongs to one VAE; the model fingerprint already keys it.
`predict` packs them to tokens (`_pack_latents`), builds img_ids with
`_prepare_latent_ids`, and scatters the output back with `_unpack_latents_with_ids`.

Timesteps: FLUX.2's scheduler uses dynamic shifting (at inference `compute_empirical_mu`
of the image's token count and the step count); the training scripts index the
scheduler's unshifted training sigmas, so training uses shift 1 (flow.py train_shift).
Sampling defaults to logit-normal (mean 0, std 1) where diffusers' FLUX.2 scripts default
to uniform, for the reasons flux.py gives; train.timestep_sampling = "uniform" gives theirs.

Guidance: follows the transformer config's `guidance_embeds`. FLUX.2-dev is
guidance-distilled (True): it is given `train_guidance` = 1.0, the value diffusers'
README_flux2.md passes (`--guidance_scale=1`) for dev and klein (train.guidance changes
it; the script's own default is 3.5). klein (base and
distilled) has no guidance embedding (False) and gets None. Validation: klein base uses
true classifier-free guidance with the empty prompt's embeddings as the negative;
step-distilled klein (`is_distilled` in model_index.json) and dev ignore it.

References (multi-reference editing, edit.py): datasets.N.control, control_2 and control_3
give a sample up to three reference images, cached as latents and joined after the
target's tokens as the pipelines join their `image` references; optional per dataset.

LoRA: diffusers' script targets (see LORA_TARGETS); files in flux2_lora.py.
Flow matching: see flow.py. The tiny model: tiny.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.models import comfy_file, loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import (
    EditSpec,
    MemorySpec,
    RandomSpec,
    SingleFileSpec,
    ValidationSpec,
)
from core.models.components import GuidedComponents, extended
from core.models.families.flux2 import edit as references
from core.models.flow import FlowFamily
from core.models.geometry import Geometry
from core.models.modules import freeze, unwrap
from core.models.objectives import standard_noise

KLEIN = "Flux2KleinPipeline"
DEV = "Flux2Pipeline"
# The guidance value a guidance-distilled model (FLUX.2-dev) gets in training.
TRAIN_GUIDANCE = 1.0
PIPELINES = (KLEIN, DEV)
TEXT_LAYERS = {KLEIN: (9, 18, 27), DEV: (10, 20, 30)}  # the pipelines' defaults
# The most single blocks a FLUX.2 has (dev: 48). A single block's output projection is
# `attn.to_out`, the same suffix as a double block's ModuleList, which PEFT refuses, so the
# single ones are named with their index (unmatched names are ignored by PEFT).
MAX_SINGLE_BLOCKS = 48
# diffusers' train_dreambooth_lora_flux2*.py default: the double blocks' image attention,
# the single blocks' fused qkv+mlp input and their output.
LORA_TARGETS = ["attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.to_qkv_mlp_proj",
                *[f"single_transformer_blocks.{i}.attn.to_out" for i in range(MAX_SINGLE_BLOCKS)]]
LORA_EXTRA = ["attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
              "ff.linear_in", "ff.linear_out", "ff_context.linear_in", "ff_context.linear_out",
              "proj_out"]


@dataclass
class Flux2Components(GuidedComponents):
    """A loaded FLUX.2: its pipeline class (klein's or dev's) and whether it is a
    step-distilled klein (model_index.json's is_distilled)."""

    pipeline_class: str | None = None
    is_distilled: bool = False


def random_tokenizer(cls: str, folder: Path, bang_padded: bool) -> Any:
    """random:flux2's Qwen3 tokenizer: the tiny build's."""
    from core.models.tiny.qwen3 import qwen_tokenizer

    return qwen_tokenizer(folder)


def random_settings(c: Components) -> Flux2Components:
    """random:flux2 as `load` gives it: the shipped model_index.json's pipeline class and
    distilled flag, and the guidance value."""
    from core.models.full_size.spec import model_index

    index = model_index(c.family)
    return extended(c, Flux2Components, guidance=TRAIN_GUIDANCE,
                    pipeline_class=index["_class_name"],
                    is_distilled=bool(index.get("is_distilled", False)))


class Flux2Family(FlowFamily):
    name = "flux2"
    geometry = Geometry(latent_channels=32)  # its own 32-channel VAE
    block_lists = ("transformer_blocks", "single_transformer_blocks")
    # Original-format single files and diffusers folders (core/models/loading.py).
    # before flux: FLUX.2 has double_blocks too
    single_file = SingleFileSpec(markers=("single_stream_modulation.",), rank=20)
    pipeline_prefix = "Flux2"
    diffusers_lokr = True  # its pipeline loads LoKr files (core/models/adapters.py)
    text_encoder_count = 1
    # BFL's and ComfyUI's transformer files (bf16, fp8, fp8_scaled): `_from_single_file`.
    transformer_class_name = "Flux2Transformer2DModel"
    pipeline_class_name = KLEIN  # save_lora_weights: both pipelines share Flux2LoraLoaderMixin
    max_sequence_length = 512
    # 2x2 latent patches packed before the transformer; Qwen3 (klein), Mistral3 (dev).
    memory = MemorySpec(latent_packing=2, text_encoder_kind="llm")
    train_guidance = TRAIN_GUIDANCE
    random = RandomSpec(tokenizer=random_tokenizer, settings=random_settings)
    # dev (_DevValidation) drops the negative; klein's pipeline uses it only undistilled.
    # validation.model on a step-distilled klein: 4 steps at guidance 1 (its model card)
    validation = ValidationSpec(
        negative_prompt_note=("only FLUX.2 klein base models use it (classifier-free "
                              "guidance); guidance-distilled dev and step-distilled klein "
                              "draw without it"),
        distilled=(4, 1.0))
    # Up to three reference images per sample (datasets.N.control, control_2, control_3),
    # optional: a dataset without them trains text-to-image (edit.py).
    edit = EditSpec(references=3, optional=True,
                    validation_kwargs=references.validation_kwargs)

    # ------------------------------------------------------------ loading

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None) -> Components:
        """A diffusers folder or hub id (the pipeline class its model_index.json names), or
        a single transformer .safetensors with `config` naming the diffusers folder/id
        that supplies the VAE, text encoder, tokenizer and scheduler."""
        dtype = loading.resolve_dtype(dtype)
        kind = loading.checked_source(path, self.name)
        if kind == "file":
            pipe = self._from_single_file(path, dtype, config)
        else:
            pipe = self._from_pretrained(path, kind, dtype)
        c = self._components_from_pipeline(pipe, path, loading.fingerprint(path, kind))
        freeze((c.vae, c.denoiser, *c.text_encoders), device)
        return c

    def _from_pretrained(self, path: str, kind: loading.SourceKind, dtype: Any,
                         **components: Any) -> Any:
        import diffusers

        kwargs: dict[str, Any] = dict(components)
        if dtype is not None:
            kwargs["dtype"] = dtype
        try:
            pipe = diffusers.DiffusionPipeline.from_pretrained(
                path, local_files_only=(kind == "folder"), **kwargs)
        except Exception as exc:  # noqa: BLE001 - every loader failure becomes one message
            if kind == "hub":
                raise loading.hub_error(path, "the flux2 model", exc) from exc
            raise loading.ModelLoadError(path, f"cannot load this flux2 diffusers folder: "
                                         f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        if type(pipe).__name__ not in PIPELINES:
            raise loading.ModelLoadError(path, f"holds a {type(pipe).__name__}, not a FLUX.2 "
                                         f"pipeline ({' or '.join(PIPELINES)})")
        return pipe

    def _from_single_file(self, path: str, dtype: Any, config: str | None) -> Any:
        """FLUX.2 single files (BFL's flux2-*.safetensors) hold only the transformer;
        diffusers' Flux2 pipelines have no from_single_file, so the transformer loads with
        Flux2Transformer2DModel.from_single_file and the rest from model.config."""
        from diffusers import Flux2Transformer2DModel

        if not config:
            raise loading.ModelLoadError(path, "is a FLUX.2 single-file checkpoint, which holds "
                                         "only the transformer: set model.config to the "
                                         "diffusers folder (or hub id) of the same FLUX.2 "
                                         "model, which supplies the VAE, text encoder, "
                                         "tokenizer and scheduler, or use a diffusers folder")
        transformer = loading.load_single_file_transformer(
            Flux2Transformer2DModel, path, config, self.name, dtype,
            comfy_file.read_transformer(path, dtype))
        return self._from_pretrained(config, loading.classify_source(config), dtype,
                                     transformer=transformer)

    def _components_from_pipeline(self, pipe: Any, source: str, fp: str) -> Components:
        return Flux2Components(
            family=self.name, source=source, fingerprint=fp, vae=pipe.vae,
            denoiser=pipe.transformer, text_encoders=[pipe.text_encoder],
            tokenizers=[pipe.tokenizer], noise_scheduler=pipe.scheduler,
            guidance=self.train_guidance, pipeline_class=type(pipe).__name__,
            is_distilled=bool(pipe.config.get("is_distilled", False)))

    @staticmethod
    def pipeline_kind(c: Components) -> str:
        return c.pipeline_class or KLEIN

    # ------------------------------------------------------------ text

    def text_layers(self, c: Components) -> tuple[int, ...]:
        return TEXT_LAYERS[self.pipeline_kind(c)]

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [512, 3 x hidden], prompt_mask [512] (the chat-templated
        prompt's real tokens)."""
        import torch

        pipe = self.validation_pipeline(c)
        msl = self.sequence_length(c)
        with torch.no_grad():
            embeds, _ = pipe.encode_prompt(prompt=prompts, device=c.vae.device,
                                           max_sequence_length=msl,
                                           text_encoder_out_layers=self.text_layers(c))
        mask = self._prompt_mask(c, prompts, msl)
        return [{"prompt_embeds": embeds[i], "prompt_mask": mask[i]}
                for i in range(len(prompts))]

    def _prompt_mask(self, c: Components, prompts: list[str], msl: int) -> Any:
        """The attention mask the pipeline's tokenisation gives (its templates)."""
        import torch

        tok = c.tokenizers[0]
        if self.pipeline_kind(c) == DEV:
            from diffusers.pipelines.flux2.pipeline_flux2 import SYSTEM_MESSAGE, format_input

            out = tok.apply_chat_template(
                format_input(prompts=prompts, system_message=SYSTEM_MESSAGE),
                add_generation_prompt=False, tokenize=True, return_dict=True,
                return_tensors="pt", padding="max_length", truncation=True, max_length=msl)
            return out["attention_mask"].bool()
        masks = []
        for prompt in prompts:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                           tokenize=False, add_generation_prompt=True,
                                           enable_thinking=False)
            masks.append(tok(text, return_tensors="pt", padding="max_length", truncation=True,
                             max_length=msl).attention_mask)
        return torch.cat(masks).bool()

    # ------------------------------------------------------------ images

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """Normalised patchified latents [B, 4C, H/16, W/16] (see the module docstring):
        the posterior mode without a generator, a posterior sample with one."""
        import torch
        from diffusers import Flux2KleinPipeline

        vae = c.vae
        with torch.no_grad():
            dist = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist
            latents = dist.mode().float()
            if generator is not None:
                noise = standard_noise(latents.shape, generator, latents.device)
                latents = latents + dist.std.float() * noise
        patches = Flux2KleinPipeline._patchify_latents(latents)
        mean, std = bn_statistics(vae, patches.device)
        return ((patches - mean) / std).to(vae.dtype)

    # ------------------------------------------------------------ training

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """Pack, join the cached references' tokens after the target's (edit.py), run
        the transformer with img/txt ids (and guidance when the model has a guidance
        embedding), keep the target's tokens and unpack; the text mask is not given, as
        in the pipeline."""
        import torch
        from diffusers import Flux2KleinPipeline as P

        self.check_text_length(batch, self.sequence_length(c))
        model = c.denoiser
        inner = unwrap(model)
        dtype = inner.dtype
        noisy = sample.noisy.to(dtype)
        b, _, h, w = noisy.shape
        device = noisy.device
        img_ids = P._prepare_latent_ids(noisy).to(device)
        packed = P._pack_latents(noisy)
        embeds = batch["prompt_embeds"].to(device, dtype)
        txt_ids = P._prepare_text_ids(embeds).to(device)
        guidance = None
        if inner.config.guidance_embeds:
            value = self.train_guidance if c.guidance is None else c.guidance
            guidance = torch.full((b,), float(value), device=device, dtype=torch.float32)
        hidden, ids = references.joined(batch, packed, img_ids)
        out = model(hidden_states=hidden,
                    timestep=(sample.timesteps.to(device) / 1000).to(dtype),
                    guidance=guidance, encoder_hidden_states=embeds, txt_ids=txt_ids,
                    img_ids=ids, return_dict=False)[0]
        return P._unpack_latents_with_ids(out[:, :packed.shape[1]], img_ids, h, w)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return LORA_TARGETS + (LORA_EXTRA if scope == "all" else [])

    def _save_comfy(self, c: Components, peft_sd: dict[str, Any], config: Any,
                    path: Path) -> Path | None:
        """Plain LoRA: BFL's own layout, q/k/v fused (flux2_lora.py). DoRA, LoKr and LoHa
        cannot be fused that way; they keep diffusers' module names, which ComfyUI's
        FLUX.2 (a Flux model there) maps through flux_to_diffusers, q/k/v as slices of the
        fused weight (see flux2_lora.py)."""
        from core.models.adapters import adapter_kind
        from core.models.families.flux2.lora import save_bfl_lora

        if adapter_kind(config) == "lora":
            return save_bfl_lora(peft_sd, config, path)
        return super()._save_comfy(c, peft_sd, config, path)

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """The model's pipeline class sharing the loaded modules (its own scheduler)."""
        import diffusers

        kind = self.pipeline_kind(c)
        extra = {"is_distilled": c.is_distilled} if kind == KLEIN else {}
        pipe = getattr(diffusers, kind)(
            transformer=unwrap(c.denoiser), scheduler=self.validation_scheduler(c), vae=c.vae,
            text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0], **extra)
        pipe.set_progress_bar_config(disable=True)
        return pipe if kind == KLEIN else _DevValidation(pipe)


class _DevValidation:
    """Flux2Pipeline as the validation code calls it: that pipeline has no negative
    prompt (dev is guidance-distilled), so the negative embeddings are dropped."""

    def __init__(self, pipe: Any):
        self._pipe = pipe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("negative_prompt_embeds", None)
        return self._pipe(*args, **kwargs)


def bn_statistics(vae: Any, device: Any) -> tuple[Any, Any]:
    """The VAE's latent normalisation as the pipelines read it: running mean and
    sqrt(running var + batch_norm_eps), shaped [1, 4C, 1, 1], float32."""
    import torch

    mean = vae.bn.running_mean.view(1, -1, 1, 1).to(device, torch.float32)
    var = vae.bn.running_var.view(1, -1, 1, 1).to(device, torch.float32)
    return mean, torch.sqrt(var + vae.config.batch_norm_eps)


FAMILY = Flux2Family()
