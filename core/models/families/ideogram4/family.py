"""Ideogram 4 (ideogram-ai/ideogram-v4): Ideogram4Transformer2DModel, a single-stream DiT
over one packed [text][image] sequence (text.py), a Qwen3-VL text encoder whose 13 tapped
layers are concatenated per token, FLUX.2's AutoencoderKLFlux2 with 2x2 patches
normalised by its batch-norm statistics, flow matching. The pipeline ships two
transformers: `transformer` (conditional: text + image) and `unconditional_transformer`
(image only, zeroed text), blended each step (asymmetric classifier-free guidance).

What trains: the conditional `transformer`, as diffusers' train_dreambooth_lora_ideogram4
.py trains it; the unconditional one is never loaded for training (`load` passes None for
it) and is loaded frozen, on first use, only for validation (`Companion`), which samples
with Ideogram4Pipeline's own loop (`_Validation` hands it the cached text).

Latents: the VAE posterior mode, packed 2x2 in Ideogram 4's channel order (text.py
`patchify`) and normalised with the VAE's bn statistics -> [B, 4C, H/16, W/16] (128
channels for the real VAE), as the script's patchify_latents and latents_bn_mean/std.

Objective (the script's, and the pipeline's schedule): sigma ~ sigmoid(N(mu, 1.5)) with
the resolution-aware mean mu = logit_mean (0) + 0.5 * log(H * W / 512^2) of the sample's
pixel size (the pipeline's `_resolution_aware_mu`; its sampling schedule is the same
logit-normal, so training and sampling agree), no further shift; noisy = (1 - sigma) x +
sigma n; the transformer is given model time t = 1 - sigma (0 noise, 1 data) and predicts
x - n. `predict` returns its negation, so the target stays the shared n - x (the same
squared error). Loss weighting: none (the script's logit_normal scheme weights 1).

Guidance: the model has no guidance input; validation.guidance_scale is the pipeline's
constant `guidance_scale` (v = g * v_cond + (1 - g) * v_uncond); there is no negative
prompt (the unconditional transformer takes no text).

LoRA: the script's default targets, every block's to_q, to_k, to_v, to_out.0 and the
SwiGLU w1, w2, w3 (both scopes). ComfyUI 0.29.0 has Ideogram 4 (comfy/ldm/ideogram4,
model_base.Ideogram4) with no diffusers-name table, so its file uses the model's own
names (comfyui_keys.py): q/k/v fused into attention.qkv, to_out.0 as attention.o.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.models import loading
from core.models.base import Components, NoiseSample
from core.models.capabilities import MemorySpec, RandomSpec, SingleFileSpec, ValidationSpec
from core.models.comfyui_names import Fused, ModuleNames, save_fused_comfy
from core.models.components import extended
from core.models.flow import FlowFamily
from core.models.geometry import Geometry
from core.models.modules import unwrap
from core.models.objectives import SIGMA_EPS, FlowTraining, sample_sigmas, standard_noise

PIPELINE = "Ideogram4Pipeline"
# diffusers' train_dreambooth_lora_ideogram4.py default (its --lora_layers).
LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "w1", "w2", "w3"]
LOGIT_STD = 1.5  # the script's --logit_std and the pipeline's `std`
CONFIG_LOGIT_STD = 1.0  # train.logit_std's default (core/config/schema.py)
COMFY_NAMES = ModuleNames(blocks={"layers": ("layers", {
    "attention.to_out.0": "attention.o", "feed_forward.w1": "feed_forward.w1",
    "feed_forward.w2": "feed_forward.w2", "feed_forward.w3": "feed_forward.w3"})})
COMFY_FUSED = (Fused("layers", "attention.qkv",
                     ("attention.to_q", "attention.to_k", "attention.to_v")),)


@dataclass
class Ideogram4Components(Components):
    """A loaded Ideogram 4: the frozen unconditional transformer validation loads
    (`Companion`)."""

    companion: Any = None


def random_tokenizer(cls: str, folder: Path, bang_padded: bool) -> Any:
    """random:ideogram4's Qwen3-VL tokenizer: the tiny build's."""
    from core.models.families.ideogram4.tiny import vl_tokenizer

    return vl_tokenizer(folder)


def random_settings(c: Components) -> Ideogram4Components:
    """random:ideogram4 as `load` gives it: a companion built from the conditional
    transformer's config."""
    return extended(c, Ideogram4Components, companion=Companion(c.source, None))


class Ideogram4Family(FlowFamily):
    name = "ideogram4"
    geometry = Geometry(latent_channels=32)  # FLUX.2's 32-channel VAE
    block_lists = ("layers",)
    pipeline_prefix = "Ideogram4"
    text_encoder_count = 1
    pipeline_class_name = PIPELINE
    # ComfyUI's diffusion-model file (bf16, fp8, fp8_scaled) of the conditional
    # transformer, mapped by original.py; model.config gives the rest, the unconditional
    # transformer included.
    transformer_class_name = "Ideogram4Transformer2DModel"
    # comfy/model_detection.py's key
    single_file = SingleFileSpec(markers=("embed_image_indicator.",), rank=50)
    single_file_default_config = "ideogram-ai/ideogram-v4"
    # The longest prompt the text cache takes (the pipeline pads to 2048, its default;
    # only the real tokens are kept, text.py).
    max_sequence_length = 2048
    memory = MemorySpec(latent_packing=2, text_encoder_kind="llm")  # Qwen3-VL
    logit_std = LOGIT_STD
    validation = ValidationSpec(negative_prompt_note=(
        "Ideogram 4 guides with its unconditional transformer, which takes no text: there "
        "is no negative prompt"))
    random = RandomSpec(tokenizer=random_tokenizer, settings=random_settings)

    # ------------------------------------------------------------ loading

    def _pretrained_components(self, path: str, kind: loading.SourceKind) -> dict[str, Any]:
        """The unconditional transformer is left out: it is validation's (Companion)."""
        return {"unconditional_transformer": None}

    def transformer_names(self, state: dict[str, Any]) -> dict[str, Any]:
        from core.models.families.ideogram4.original import diffusers_names

        return diffusers_names(state)

    def load(self, path: str, *, dtype: Any = None, device: Any = "cpu",
             config: str | None = None) -> Components:
        """A diffusers folder or hub id, or a single file of the conditional transformer
        with the rest (the unconditional one too) from model.config."""
        from core.models.families.ideogram4.folder import describe, missing_components

        rest = (config or self.single_file_default_config
                if loading.classify_source(path) == "file" else path)
        missing, _ = missing_components(rest)
        if missing:
            raise loading.ModelLoadError(rest, describe("", missing).lstrip())
        c = super().load(path, dtype=dtype, device=device, config=config)
        return extended(c, Ideogram4Components,
                        companion=Companion(rest, loading.resolve_dtype(dtype)))

    def config_problems(self, cfg: Any) -> list[Any]:
        """A folder missing a component (model.config's beside a single file: an error
        for one training loads; a warning for the unconditional transformer, which
        validation and merge need); a kind ComfyUI cannot read for Ideogram 4 (its q/k/v
        cannot be fused)."""
        from core.models.families.ideogram4.folder import describe, missing_components
        from core.problems import error, warning

        out = []
        path, where = str(cfg.model.path), "model.path"
        if path.endswith(".safetensors") and cfg.model.config:
            path, where = str(cfg.model.config), "model.config"
        missing, for_validation = missing_components(path)
        if missing:
            out.append(error(where, describe(path, missing)))
        elif for_validation:
            out.append(warning(where, describe(path, for_validation) + ": "
                               "validation images and --stage merge need it"))
        if cfg.train.method == "lora" and cfg.train.lora_kind != "lora":
            out.append(warning("train.lora_kind", f"{cfg.train.lora_kind}'s q/k/v cannot be "
                               "fused into the qkv weight ComfyUI's Ideogram 4 holds, so "
                               "lora_comfyui.safetensors keeps diffusers' names, which "
                               "ComfyUI does not map for it; train lora for ComfyUI"))
        return out

    def configure_run(self, c: Components, cfg: Any) -> None:
        """The unconditional transformer is quantized as the denoiser (model.quantize)."""
        if c.companion is not None:
            c.companion.quantize = cfg.model.quantize

    # ------------------------------------------------------------ text and images

    def encode_prompts(self, c: Components, prompts: list[str]) -> list[dict[str, Any]]:
        """Per prompt: prompt_embeds [L, 13 x hidden] (its real tokens, text.py) and an
        all-True mask; collate pads a batch to its longest."""
        import torch

        from core.models.families.ideogram4.text import encode_text

        out = []
        for prompt in prompts:
            e = encode_text(c.text_encoders[0], c.tokenizers[0], prompt,
                            self.sequence_length(c)).to(c.text_encoders[0].dtype)
            out.append({"prompt_embeds": e,
                        "prompt_mask": torch.ones(e.shape[0], dtype=torch.bool,
                                                  device=e.device)})
        return out

    def encode_images(self, c: Components, pixels: Any, generator: Any = None) -> Any:
        """Normalised packed latents [B, 4C, H/16, W/16]: the posterior mode without a
        generator, a posterior sample with one."""
        import torch

        from core.models.families.ideogram4.text import patchify

        vae = c.vae
        with torch.no_grad():
            dist = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist
            latents = dist.mode().float()
            if generator is not None:
                latents = latents + dist.std.float() * standard_noise(
                    latents.shape, generator, latents.device)
        packed = patchify(latents)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(packed.device, torch.float32)
        var = vae.bn.running_var.view(1, -1, 1, 1).to(packed.device, torch.float32)
        return ((packed - mean) / torch.sqrt(var + vae.config.batch_norm_eps)).to(vae.dtype)

    # ------------------------------------------------------------ training

    def train_shift(self, c: Components) -> float:
        """No static shift: the resolution-aware mean replaces it (module docstring)."""
        return 1.0

    def flow_settings(self, c: Components) -> FlowTraining:
        """FlowFamily's, except that train.logit_std at the config's default (1.0, which
        the run always passes) means this family's own, the script's 1.5."""
        import dataclasses

        s = super().flow_settings(c)
        if c.flow is not None and c.flow.logit_std == CONFIG_LOGIT_STD:
            return dataclasses.replace(s, logit_std=LOGIT_STD)
        return s

    def pixel_size(self, c: Components, latents: Any) -> tuple[int, int]:
        """(height, width) in pixels of packed latents [B, D, gh, gw]: the VAE's 8x (the
        script's vae_scale_factor) times the 2x2 patch."""
        scale = self.geometry.spatial_compression * 2
        return latents.shape[-2] * scale, latents.shape[-1] * scale

    def noise_and_target(self, c: Components, latents: Any, generator: Any = None,
                         timesteps: Any = None, noise: Any = None,
                         noise_offset: float = 0.0) -> NoiseSample:
        """FlowFamily's sample, the sigmas drawn at this resolution's mean when not given."""
        if timesteps is None and not noise_offset:
            from core.models.families.ideogram4.text import resolution_mu

            s = self.flow_settings(c)
            mu = resolution_mu(s.logit_mean, *self.pixel_size(c, latents))
            sigmas = sample_sigmas(latents.shape[0], generator, latents.device,
                                   s.timestep_sampling, mu, s.logit_std, s.shift,
                                   s.mode_scale).clamp(SIGMA_EPS, 1.0 - SIGMA_EPS)
            n_train = int(c.noise_scheduler.config.get("num_train_timesteps", 1000))
            timesteps = sigmas * n_train
        return super().noise_and_target(c, latents, generator, timesteps, noise, noise_offset)

    def predict(self, c: Components, sample: NoiseSample, batch: dict[str, Any]) -> Any:
        """n - x for the batch: the transformer's output on the image tokens, negated, at
        model time t = 1 - sigma, over the packed sequence text.py `layout` builds."""
        from core.models.families.ideogram4.text import from_tokens, layout, to_tokens

        model = c.denoiser
        dtype = unwrap(model).dtype
        noisy = sample.noisy.to(dtype)
        b, _, gh, gw = noisy.shape
        device = noisy.device
        packed = layout(batch["prompt_embeds"].to(device, dtype),
                        batch["prompt_mask"].to(device), gh, gw)
        text_len = packed.pop("text_len")
        tokens = to_tokens(noisy)
        hidden = noisy.new_zeros(b, text_len + tokens.shape[1], tokens.shape[2])
        hidden[:, text_len:] = tokens
        n_train = float(c.noise_scheduler.config.get("num_train_timesteps", 1000))
        t = 1.0 - sample.timesteps.to(device).float().reshape(-1).expand(b) / n_train
        out = model(hidden_states=hidden, timestep=t.to(dtype), return_dict=False,
                    **packed)[0]
        return -from_tokens(out[:, text_len:], gh, gw)

    def lora_target_modules(self, scope: str = "attention") -> list[str]:
        return list(LORA_TARGETS)

    def _save_comfy(self, c: Components, peft_sd: dict[str, Any], config: Any,
                    path: Path) -> Path | None:
        """ComfyUI's Ideogram 4 names (comfyui_keys.py): plain LoRA with q/k/v fused;
        other kinds keep one module per diffusers module under the model's names."""
        return save_fused_comfy(c.denoiser, peft_sd, config, path, COMFY_NAMES, COMFY_FUSED)

    # ------------------------------------------------------------ validation

    def validation_pipeline(self, c: Components) -> Any:
        """Ideogram4Pipeline on the loaded modules, sampling with the frozen unconditional
        transformer (Companion), callable with cached text (validation.py)."""
        from core.models.families.ideogram4.validation import Ideogram4Validation

        pipe = Ideogram4Validation(
            scheduler=self.validation_scheduler(c), vae=c.vae,
            text_encoder=c.text_encoders[0], tokenizer=c.tokenizers[0],
            transformer=unwrap(c.denoiser), unconditional_transformer=None)
        pipe.companion = c.companion or Companion(c.source, None)
        pipe.set_progress_bar_config(disable=True)
        return pipe


class Companion:
    """The frozen unconditional transformer, loaded on first use (validation) from the
    model's folder or hub id, in the denoiser's dtype; random:ideogram4 builds one from
    the conditional transformer's config. Shared by the copies of a Components."""

    def __init__(self, source: str, dtype: Any):
        self.source, self.dtype, self.model = source, dtype, None
        self.quantize = "none"  # model.quantize (configure_run)

    def get(self, like: Any) -> Any:
        if self.model is None:
            self.model = self._load(like)
        return self.model

    def _load(self, like: Any) -> Any:
        from diffusers import Ideogram4Transformer2DModel

        from core.models.source import model_source

        if model_source(self.source).kind == "random":
            model = Ideogram4Transformer2DModel.from_config(like.config).to(like.dtype)
        else:
            kind = loading.classify_source(self.source)
            try:
                model = Ideogram4Transformer2DModel.from_pretrained(
                    self.source, subfolder="unconditional_transformer",
                    local_files_only=(kind == "folder"), torch_dtype=self.dtype or like.dtype)
            except Exception as exc:  # noqa: BLE001 - one message naming the folder
                raise loading.ModelLoadError(
                    self.source, "has no loadable unconditional_transformer/, which "
                    f"Ideogram 4's validation samples with: {type(exc).__name__}: "
                    f"{str(exc)[:200]}") from exc
        model.requires_grad_(False)
        if self.quantize != "none":
            from core.models.quantize import quantize_frozen

            # int8/fp8 quantize on the CPU and rest there between validations (each call
            # brings it to the denoiser's device and back), so training after a validation
            # does not carry a second 9 B transformer on the GPU; nf4 cannot leave CUDA.
            rest = like.device if self.quantize == "nf4" else "cpu"
            quantize_frozen(model, self.quantize, rest)
        return model.eval()


FAMILY = Ideogram4Family()
