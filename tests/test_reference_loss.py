"""Every family's training loss against a written-out reference (issue 14, part 2).

For a fixed tiny model, batch (two 64x96 px images, two captions), latent sample, noise and
timesteps, the loss is computed twice:
- through the project, as the trainer does it (core/train/loop.py, evaluation.py):
  family.load, encode_images, encode_prompts, collate, noise_and_target(timesteps=,
  noise=), predict, loss;
- by a reference written out here with diffusers/transformers classes only, loaded
  component by component as the official training scripts load them, following
    sd15, sd2:  examples/text_to_image/train_text_to_image.py
    sdxl:       examples/text_to_image/train_text_to_image_sdxl.py
    sd3:        examples/dreambooth/train_dreambooth_lora_sd3.py
    flux:       examples/dreambooth/train_dreambooth_lora_flux.py
  (text encoding, VAE scaling/shift, noising, packing, ids, target and loss weighting),
  calling nothing from the project.
The two must agree to float32 round-off; intermediate tensors are compared first, so a
failure names the stage that differs. One non-default knob per objective is checked too
(min-SNR gamma, the script's --prediction_type, SD3 loss weightings, Flux guidance), and
the flow families' random sigma draws against the scripts' timestep sampling.

Where the project chooses differently from a script's default, the reference is given
the project's value explicitly, and the comment says so:
- SD3: --precondition_outputs=0 (the script's default 1 compares x0 = x_t - sigma * v
  with the latents, i.e. the flow loss times sigma^2; diffusers PR #8917 made it optional
  because rectified flow trains better without it, and the Flux script dropped it), and
  T5 at the pipeline's 256 tokens (the script's --max_sequence_length defaults to 77).
- Flux: --guidance_scale=1.0 (the script's default 3.5; see core/models/families/flux/family.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from core.data.collate import collate
from core.models.registry import get_family
from core.models.tiny import resolve_model_path
from core.train.batches import to_device

PROMPTS = ["a red circle on a white background", "two small blue squares, side by side"]
LATENT_SEED = 11  # the VAE posterior sample (the scripts' latent_dist.sample())
NOISE_SEED = 12
DDPM_TIMESTEPS = [50, 600]  # SNR 19.7 and 0.19 on the SD schedule: either side of gamma 5
FLOW_INDICES = [200, 750]  # into the flow scheduler's timesteps, as the scripts index them
SD3_T5_LENGTH = 256  # the pipeline's default, which the project trains at
FLUX_T5_LENGTH = 512
HEIGHT, WIDTH = 64, 96  # the batch's pixel size
# SDXL's per-item micro-conditioning, as the cache records it: (h, w), (top, left), (h, w).
SDXL_SIZES = [((96, 80), (8, 4), (HEIGHT, WIDTH)), ((64, 128), (0, 32), (HEIGHT, WIDTH))]
SNR_GAMMAS = [5.0, 0.1]  # the scripts' recommended --snr_gamma; one below both SNRs
WEIGHTINGS = ["sigma_sqrt", "cosmap"]  # the flow scripts' --weighting_scheme post-weights
TOL = {"rtol": 1e-5, "atol": 1e-6}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def pixels() -> torch.Tensor:
    """Two fixed images in [-1, 1], HEIGHT x WIDTH, with some structure (not pure
    noise). Not square, so a transposed packing or id grid cannot go unnoticed."""
    rows = torch.linspace(-1, 1, HEIGHT)[:, None].expand(HEIGHT, WIDTH)
    cols = torch.linspace(-1, 1, WIDTH)[None, :].expand(HEIGHT, WIDTH)
    base = torch.stack([cols, rows, -cols * rows])
    grain = torch.rand(2, 3, HEIGHT, WIDTH, generator=gen(5)) * 2 - 1
    return (torch.stack([base, base.flip(-1)]) * 0.8 + 0.2 * grain).clamp(-1, 1)


def fixed_noise(shape: Any) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=gen(NOISE_SEED))


@pytest.fixture(scope="module")
def tiny(tiny_workspace: Path) -> Callable[[str], str]:
    """The session workspace's tiny models (built once per session, on first use)."""
    paths: dict[str, str] = {}

    def path(family: str) -> str:
        if family not in paths:
            paths[family] = str(resolve_model_path(f"tiny:{family}", tiny_workspace))
        return paths[family]

    return path


# ---------------------------------------------------------------- the project side


def project_run(family: str, path: str, timesteps: Any, *,
                extra: list[dict[str, Any]] | None = None,
                adjust: Callable[[Any, Any], None] | None = None) -> dict[str, Any]:
    """The trainer's path for one batch at fixed timesteps and noise (evaluation.py's
    call), with the latents sampled from the posterior as the scripts sample them.
    "loss" is at the default settings; "loss_with" recomputes it for a knob."""
    fam = get_family(family)
    c = fam.load(path)
    if adjust is not None:
        adjust(fam, c)
    latents = fam.encode_images(c, pixels(), generator=gen(LATENT_SEED))
    texts = fam.encode_prompts(c, PROMPTS)
    items = [{"latents": latents[i], **texts[i], "path": f"img_{i}.png", "caption": PROMPTS[i],
              **(extra[i] if extra else {})} for i in range(len(PROMPTS))]
    batch = to_device(collate(items), "cpu", torch.float32)

    def noise_and_target() -> Any:
        return fam.noise_and_target(c, batch["latents"], timesteps=timesteps,
                                    noise=fixed_noise(latents.shape))

    sample = noise_and_target()
    prediction = fam.predict(c, sample, batch)

    def loss_with(min_snr_gamma: float = 0.0) -> Any:
        """The loss after a knob changed: flow weightings are read by noise_and_target
        (its sample carries the weights), min-SNR gamma by loss."""
        again = noise_and_target()
        torch.testing.assert_close(again.noisy, sample.noisy, rtol=0, atol=0)
        return fam.loss(c, prediction.float(), again, min_snr_gamma)

    return {"latents": batch["latents"], "prompt_embeds": batch["prompt_embeds"],
            "pooled": batch.get("pooled_prompt_embeds"), "noisy": sample.noisy,
            "target": sample.target, "prediction": prediction,
            "loss": fam.loss(c, prediction.float(), sample), "loss_with": loss_with}


def assert_agree(ours: dict[str, Any], ref: dict[str, Any]) -> None:
    """Stage by stage, so a failure says where the two paths part."""
    for key in ("latents", "prompt_embeds", "pooled", "noisy", "target", "prediction", "loss"):
        if ref.get(key) is None:
            assert ours.get(key) is None, key
            continue
        torch.testing.assert_close(ours[key].float(), ref[key].float(), **TOL,
                                   msg=lambda m, k=key: f"{k}: {m}")


# ---------------------------------------------------------------- train_text_to_image(_sdxl).py


def clip_tokens(tokenizer: Any) -> torch.Tensor:
    return tokenizer(PROMPTS, max_length=tokenizer.model_max_length, padding="max_length",
                     truncation=True, return_tensors="pt").input_ids


def ddpm_loss(noise_scheduler: Any, model_pred: torch.Tensor, target: torch.Tensor,
              timesteps: torch.Tensor, snr_gamma: float | None) -> torch.Tensor:
    """The scripts' loss: plain MSE, or Min-SNR-gamma weighted per item."""
    from diffusers.training_utils import compute_snr
    from torch.nn import functional as F

    if snr_gamma is None:
        return F.mse_loss(model_pred.float(), target.float(), reduction="mean")
    snr = compute_snr(noise_scheduler, timesteps)
    mse_loss_weights = torch.stack([snr, snr_gamma * torch.ones_like(timesteps)], dim=1).min(
        dim=1)[0]
    if noise_scheduler.config.prediction_type == "epsilon":
        mse_loss_weights = mse_loss_weights / snr
    elif noise_scheduler.config.prediction_type == "v_prediction":
        mse_loss_weights = mse_loss_weights / (snr + 1)
    assert not torch.allclose(mse_loss_weights, torch.ones_like(mse_loss_weights))
    loss = F.mse_loss(model_pred.float(), target.float(), reduction="none")
    loss = loss.mean(dim=list(range(1, len(loss.shape)))) * mse_loss_weights
    return loss.mean()


def ddpm_losses(noise_scheduler: Any, model_pred: torch.Tensor, target: torch.Tensor,
                timesteps: torch.Tensor) -> dict[str, Any]:
    """"loss" without --snr_gamma, "losses" {gamma: loss} with it."""
    return {"loss": ddpm_loss(noise_scheduler, model_pred, target, timesteps, None),
            "losses": {g: ddpm_loss(noise_scheduler, model_pred, target, timesteps, g)
                       for g in SNR_GAMMAS}}


def ddpm_noising(noise_scheduler: Any, latents: torch.Tensor, timesteps: torch.Tensor,
                 prediction_type: str | None) -> tuple[torch.Tensor, ...]:
    """noisy latents and target, as both UNet scripts build them."""
    noise = fixed_noise(latents.shape)
    noisy = noise_scheduler.add_noise(latents, noise, timesteps)
    if prediction_type is not None:  # the scripts' --prediction_type
        noise_scheduler.register_to_config(prediction_type=prediction_type)
    if noise_scheduler.config.prediction_type == "epsilon":
        target = noise
    elif noise_scheduler.config.prediction_type == "v_prediction":
        target = noise_scheduler.get_velocity(latents, noise, timesteps)
    else:
        raise ValueError(noise_scheduler.config.prediction_type)
    return noisy, target


@torch.no_grad()
def reference_sd(path: str, timesteps: list[int], prediction_type: str | None = None
                 ) -> dict[str, Any]:
    """train_text_to_image.py's training step (sd15, sd2)."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    noise_scheduler = DDPMScheduler.from_pretrained(path, subfolder="scheduler")
    tokenizer = CLIPTokenizer.from_pretrained(path, subfolder="tokenizer")
    text_encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder")
    vae = AutoencoderKL.from_pretrained(path, subfolder="vae")
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet")

    latents = vae.encode(pixels()).latent_dist.sample(generator=gen(LATENT_SEED))
    latents = latents * vae.config.scaling_factor
    t = torch.tensor(timesteps, dtype=torch.long)
    noisy_latents, target = ddpm_noising(noise_scheduler, latents, t, prediction_type)
    encoder_hidden_states = text_encoder(clip_tokens(tokenizer), return_dict=False)[0]
    model_pred = unet(noisy_latents, t, encoder_hidden_states, return_dict=False)[0]
    return {"latents": latents, "prompt_embeds": encoder_hidden_states, "noisy": noisy_latents,
            "target": target, "prediction": model_pred,
            **ddpm_losses(noise_scheduler, model_pred, target, t)}


@torch.no_grad()
def reference_sdxl(path: str, timesteps: list[int]) -> dict[str, Any]:
    """train_text_to_image_sdxl.py's training step: encode_prompt (penultimate hidden
    states of both encoders, the last one's pooled projection) and compute_time_ids."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    noise_scheduler = DDPMScheduler.from_pretrained(path, subfolder="scheduler")
    tokenizers = [CLIPTokenizer.from_pretrained(path, subfolder=s)
                  for s in ("tokenizer", "tokenizer_2")]
    text_encoders = [CLIPTextModel.from_pretrained(path, subfolder="text_encoder"),
                     CLIPTextModelWithProjection.from_pretrained(path, subfolder="text_encoder_2")]
    vae = AutoencoderKL.from_pretrained(path, subfolder="vae")
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet")

    prompt_embeds_list = []
    for tokenizer, text_encoder in zip(tokenizers, text_encoders, strict=True):
        out = text_encoder(clip_tokens(tokenizer), output_hidden_states=True, return_dict=False)
        pooled_prompt_embeds = out[0]  # "ALWAYS the pooled output of the final text encoder"
        prompt_embeds_list.append(out[-1][-2])
    prompt_embeds = torch.concat(prompt_embeds_list, dim=-1)

    model_input = vae.encode(pixels()).latent_dist.sample(generator=gen(LATENT_SEED))
    model_input = model_input * vae.config.scaling_factor
    t = torch.tensor(timesteps, dtype=torch.long)
    noisy_model_input, target = ddpm_noising(noise_scheduler, model_input, t, None)
    add_time_ids = torch.cat([torch.tensor([list(orig + crop + size)], dtype=torch.float32)
                              for orig, crop, size in SDXL_SIZES])
    unet_added_conditions = {"time_ids": add_time_ids, "text_embeds": pooled_prompt_embeds}
    model_pred = unet(noisy_model_input, t, prompt_embeds,
                      added_cond_kwargs=unet_added_conditions, return_dict=False)[0]
    return {"latents": model_input, "prompt_embeds": prompt_embeds,
            "pooled": pooled_prompt_embeds, "noisy": noisy_model_input, "target": target,
            "prediction": model_pred, **ddpm_losses(noise_scheduler, model_pred, target, t)}


@pytest.mark.parametrize(("family", "prediction_type"), [
    ("sd15", None),
    ("sd15", "v_prediction"),  # the script's --prediction_type; the project's model.prediction_type
    ("sd2", None),  # v-prediction from its scheduler config
    ("sdxl", None),
])
def test_unet_family_loss_matches_diffusers_script(tiny: Callable[[str], str], family: str,
                                                   prediction_type: str | None) -> None:
    """Also min-SNR-gamma (train.min_snr_gamma; the scripts' --snr_gamma): epsilon's
    min(snr, gamma) / snr, v-prediction's min(snr, gamma) / (snr + 1)."""
    path = tiny(family)

    def adjust(fam: Any, c: Any) -> None:
        fam.set_prediction_type(c, prediction_type or "auto")

    extra = None
    if family == "sdxl":
        extra = [{"original_size": o, "crop_top_left": cr, "target_size": s}
                 for o, cr, s in SDXL_SIZES]
        ref = reference_sdxl(path, DDPM_TIMESTEPS)
    else:
        ref = reference_sd(path, DDPM_TIMESTEPS, prediction_type)
    ours = project_run(family, path, DDPM_TIMESTEPS, extra=extra, adjust=adjust)
    assert_agree(ours, ref)
    for gamma, loss in ref["losses"].items():
        torch.testing.assert_close(ours["loss_with"](gamma), loss, **TOL,
                                   msg=lambda m, g=gamma: f"min_snr_gamma {g}: {m}")
    if family == "sd2" or prediction_type == "v_prediction":  # the target is not the noise
        assert not torch.allclose(ref["target"], fixed_noise(ref["target"].shape))


# ---------------------------------------------------------------- train_dreambooth_lora_sd3/flux.py


def flow_sigmas(noise_scheduler_copy: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """timesteps = scheduler.timesteps[indices] and get_sigmas(timesteps), as both scripts
    turn their sampled indices into the scheduler's (shifted, for SD3) sigmas."""
    timesteps = noise_scheduler_copy.timesteps[FLOW_INDICES]
    schedule_timesteps = noise_scheduler_copy.timesteps
    step_indices = [(schedule_timesteps == t).nonzero().item() for t in timesteps]
    sigma = noise_scheduler_copy.sigmas[step_indices].flatten()
    return timesteps, sigma.reshape(-1, 1, 1, 1)


def flow_loss(model_pred: torch.Tensor, target: torch.Tensor, sigmas: torch.Tensor,
              weighting_scheme: str) -> torch.Tensor:
    """The scripts' "Compute regular loss" with compute_loss_weighting_for_sd3."""
    from diffusers.training_utils import compute_loss_weighting_for_sd3

    weighting = compute_loss_weighting_for_sd3(weighting_scheme=weighting_scheme, sigmas=sigmas)
    loss = torch.mean(
        (weighting.float() * (model_pred.float() - target.float()) ** 2).reshape(
            target.shape[0], -1), 1)
    return loss.mean()


def flow_losses(model_pred: torch.Tensor, target: torch.Tensor, sigmas: torch.Tensor
                ) -> dict[str, Any]:
    """"loss" unweighted (--weighting_scheme logit_normal or none: the weights are ones),
    "losses" {scheme: loss} for the post-weighting schemes."""
    return {"loss": flow_loss(model_pred, target, sigmas, "none"),
            "losses": {w: flow_loss(model_pred, target, sigmas, w) for w in WEIGHTINGS}}


def t5_embeds(path: str, tokenizer_dir: str, encoder_dir: str, length: int) -> torch.Tensor:
    """_encode_prompt_with_t5: padded to max_sequence_length, no attention mask."""
    from transformers import T5EncoderModel, T5Tokenizer

    tokenizer = T5Tokenizer.from_pretrained(path, subfolder=tokenizer_dir)
    text_encoder = T5EncoderModel.from_pretrained(path, subfolder=encoder_dir)
    ids = tokenizer(PROMPTS, padding="max_length", max_length=length, truncation=True,
                    add_special_tokens=True, return_tensors="pt").input_ids
    return text_encoder(ids)[0]


def vae_latents(path: str) -> torch.Tensor:
    """(latent_dist.sample() - shift_factor) * scaling_factor, as both flow scripts."""
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(path, subfolder="vae")
    model_input = vae.encode(pixels()).latent_dist.sample(generator=gen(LATENT_SEED))
    return (model_input - vae.config.shift_factor) * vae.config.scaling_factor


@torch.no_grad()
def reference_sd3(path: str) -> dict[str, Any]:
    """train_dreambooth_lora_sd3.py's step with --precondition_outputs=0 and
    --max_sequence_length=256 (see the module docstring)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection, CLIPTokenizer

    noise_scheduler_copy = FlowMatchEulerDiscreteScheduler.from_pretrained(
        path, subfolder="scheduler")
    transformer = SD3Transformer2DModel.from_pretrained(path, subfolder="transformer")

    clip_prompt_embeds_list, clip_pooled_prompt_embeds_list = [], []
    for sub in ("", "_2"):  # _encode_prompt_with_clip
        tokenizer = CLIPTokenizer.from_pretrained(path, subfolder=f"tokenizer{sub}")
        text_encoder = CLIPTextModelWithProjection.from_pretrained(path,
                                                                   subfolder=f"text_encoder{sub}")
        ids = tokenizer(PROMPTS, padding="max_length", max_length=77, truncation=True,
                        return_tensors="pt").input_ids
        out = text_encoder(ids, output_hidden_states=True)
        clip_pooled_prompt_embeds_list.append(out[0])
        clip_prompt_embeds_list.append(out.hidden_states[-2])
    clip_prompt_embeds = torch.cat(clip_prompt_embeds_list, dim=-1)
    pooled_prompt_embeds = torch.cat(clip_pooled_prompt_embeds_list, dim=-1)
    t5_prompt_embed = t5_embeds(path, "tokenizer_3", "text_encoder_3", SD3_T5_LENGTH)
    clip_prompt_embeds = torch.nn.functional.pad(
        clip_prompt_embeds, (0, t5_prompt_embed.shape[-1] - clip_prompt_embeds.shape[-1]))
    prompt_embeds = torch.cat([clip_prompt_embeds, t5_prompt_embed], dim=-2)

    model_input = vae_latents(path)
    noise = fixed_noise(model_input.shape)
    timesteps, sigmas = flow_sigmas(noise_scheduler_copy)
    noisy_model_input = (1.0 - sigmas) * model_input + sigmas * noise
    model_pred = transformer(hidden_states=noisy_model_input, timestep=timesteps,
                             encoder_hidden_states=prompt_embeds,
                             pooled_projections=pooled_prompt_embeds, return_dict=False)[0]
    target = noise - model_input
    return {"latents": model_input, "prompt_embeds": prompt_embeds, "pooled": pooled_prompt_embeds,
            "noisy": noisy_model_input, "target": target, "prediction": model_pred,
            "timesteps": timesteps, **flow_losses(model_pred, target, sigmas)}


def pack(x: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H/2 * W/2, C * 4]: 2x2 patches, row-major (FluxPipeline's)."""
    b, c, h, w = x.shape
    x = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(x: torch.Tensor, c: int, h: int, w: int) -> torch.Tensor:
    b = x.shape[0]
    x = x.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, h, w)


def image_ids(h: int, w: int) -> torch.Tensor:
    """[h/2 * w/2, 3]: (0, row, column) of each packed patch."""
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3)


@torch.no_grad()
def reference_flux(path: str, guidance_scale: float) -> dict[str, Any]:
    """train_dreambooth_lora_flux.py's step: CLIP's pooled output, T5 at 512, packed
    latents with image ids, zero text ids, the guidance value, unpacked prediction."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextModel, CLIPTokenizer

    noise_scheduler_copy = FlowMatchEulerDiscreteScheduler.from_pretrained(
        path, subfolder="scheduler")
    transformer = FluxTransformer2DModel.from_pretrained(path, subfolder="transformer")
    tokenizer = CLIPTokenizer.from_pretrained(path, subfolder="tokenizer")
    clip = CLIPTextModel.from_pretrained(path, subfolder="text_encoder")
    ids = tokenizer(PROMPTS, padding="max_length", max_length=77, truncation=True,
                    return_tensors="pt").input_ids
    pooled_prompt_embeds = clip(ids, output_hidden_states=False).pooler_output
    prompt_embeds = t5_embeds(path, "tokenizer_2", "text_encoder_2", FLUX_T5_LENGTH)
    text_ids = torch.zeros(prompt_embeds.shape[1], 3)

    model_input = vae_latents(path)
    b, c, h, w = model_input.shape
    noise = fixed_noise(model_input.shape)
    timesteps, sigmas = flow_sigmas(noise_scheduler_copy)
    noisy_model_input = (1.0 - sigmas) * model_input + sigmas * noise
    assert transformer.config.guidance_embeds  # the tiny model is FLUX.1-dev shaped
    guidance = torch.tensor([guidance_scale]).expand(b)
    model_pred = transformer(hidden_states=pack(noisy_model_input), timestep=timesteps / 1000,
                             guidance=guidance, pooled_projections=pooled_prompt_embeds,
                             encoder_hidden_states=prompt_embeds, txt_ids=text_ids,
                             img_ids=image_ids(h, w), return_dict=False)[0]
    model_pred = unpack(model_pred, c, h, w)
    target = noise - model_input
    return {"latents": model_input, "prompt_embeds": prompt_embeds, "pooled": pooled_prompt_embeds,
            "noisy": noisy_model_input, "target": target, "prediction": model_pred,
            "timesteps": timesteps, **flow_losses(model_pred, target, sigmas)}


@pytest.mark.parametrize(("family", "guidance"), [("sd3", None), ("flux", 1.0), ("flux", 3.5)])
def test_flow_family_loss_matches_diffusers_script(tiny: Callable[[str], str],
                                                   monkeypatch: pytest.MonkeyPatch, family: str,
                                                   guidance: float | None) -> None:
    """Also the loss weightings (FlowFamily.loss_weighting; the scripts'
    --weighting_scheme sigma_sqrt / cosmap) and, for Flux, the guidance value: 1.0, what
    the project trains with, and 3.5, the script's default."""
    path = tiny(family)
    ref = reference_sd3(path) if family == "sd3" else reference_flux(path, guidance)

    def adjust(fam: Any, c: Any) -> None:
        if guidance is not None:
            c.guidance = guidance

    ours = project_run(family, path, ref["timesteps"], adjust=adjust)
    assert_agree(ours, ref)
    for weighting, loss in ref["losses"].items():
        # A knob the trainer may set on the family instance; monkeypatch restores it.
        monkeypatch.setattr(get_family(family), "loss_weighting", weighting)
        torch.testing.assert_close(ours["loss_with"](), loss, **TOL,
                                   msg=lambda m, w=weighting: f"{w} weighting: {m}")
        assert not torch.allclose(loss, ref["loss"])


def test_flux_guidance_reaches_the_transformer(tiny: Callable[[str], str]) -> None:
    """The guidance value changes the prediction, so the 3.5 case above could fail."""
    path = tiny("flux")
    low, high = (reference_flux(path, g)["prediction"] for g in (1.0, 3.5))
    assert (low - high).abs().max() > 1e-4


# ---------------------------------------------------------------- random sigma draws


@pytest.mark.parametrize(("family", "scheme"), [("sd3", "logit_normal"), ("sd3", "uniform"),
                                                ("flux", "logit_normal"), ("flux", "uniform")])
def test_random_sigmas_follow_the_scripts_sampling(tiny: Callable[[str], str],
                                                   monkeypatch: pytest.MonkeyPatch, family: str,
                                                   scheme: str) -> None:
    """Sigmas drawn by noise_and_target (no timesteps given) have the distribution the
    scripts' compute_density_for_timestep_sampling -> scheduler.timesteps[indices] ->
    get_sigmas gives: SD3's scheduler shift (3.0) applied, Flux's dynamic-shift
    scheduler unshifted. (The scripts index the descending schedule, so their u maps
    to sigma 1 - u; logit-normal with mean 0 and uniform are symmetric, so the laws
    agree. With a logit_mean other than 0 they would be mirror images: the project
    draws sigma = sigmoid(N(mean, std)) as the SD3 paper does.)"""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.training_utils import compute_density_for_timestep_sampling

    n = 20000
    path = tiny(family)
    fam = get_family(family)
    c = fam.load(path)
    monkeypatch.setattr(fam, "timestep_sampling", scheme)
    sample = fam.noise_and_target(c, torch.zeros(n, 1, 1, 1), generator=gen(1))
    ours = sample.timesteps / 1000

    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler")
    u = compute_density_for_timestep_sampling(
        weighting_scheme={"uniform": "none"}.get(scheme, scheme), batch_size=n,
        logit_mean=0.0, logit_std=1.0, mode_scale=1.29, generator=gen(2))
    indices = (u * scheduler.config.num_train_timesteps).long()
    theirs = scheduler.sigmas[indices]

    quantiles = torch.linspace(0.05, 0.95, 19)
    torch.testing.assert_close(torch.quantile(ours, quantiles),
                               torch.quantile(theirs, quantiles), rtol=0, atol=0.02)
