"""Wan 2.2 TI2V-5B on tiny:wan_ti2v (CPU, seconds each): the folder is TI2V-shaped (the
48-channel residual VAE at 16x, expand_timesteps) and loads as TI2V from that flag; the
training objective is the one WanPipeline's per-token-timestep path gives, written out
here from pipeline_wan.py's own lines; a LoRA step changes the weights and the loss, and
its files reload in WanPipeline and sample what the trained model samples; validation
gives frames of the asked size; the image-conditioned and two-expert TI2V folders are
refused; a short run on clips caches, trains and validates."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import train_in_process
from test_family_wan import PROMPTS, add_lora, batch_of, clip, two_clip_config

from core.config import save_config
from core.models import loading
from core.models.families.wan.family import FAMILY as WAN
from core.models.families.wan.ti2v import WanTI2VComponents
from core.models.tiny import resolve_model_path, tiny_family

Z = 48  # TI2V-5B's latent channels
SPATIAL = 16  # its VAE's spatial factor (2x2 pixel patches, then 8x)


@pytest.fixture(scope="module")
def folder(tiny_workspace: Path) -> Path:
    return Path(resolve_model_path("tiny:wan_ti2v", tiny_workspace))


def reference_pipeline(folder: Path):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_timestep(latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """WanPipeline.__call__'s per-token timestep for `latents` at one t, its lines as
    written there (diffusers 0.42, pipeline_wan.py, `if self.config.expand_timesteps`)."""
    mask = torch.ones(latents.shape, dtype=torch.float32, device=latents.device)
    temp_ts = (mask[0][0][:, ::2, ::2] * t).flatten()
    return temp_ts.unsqueeze(0).expand(latents.shape[0], -1)


class TimestepSpy:
    """The `timestep` every forward of a module was given (a forward pre-hook)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.seen: list[torch.Tensor] = []
        self.handle = module.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self.seen.append(kwargs["timestep"].detach().clone())

    def remove(self) -> None:
        self.handle.remove()


def test_tiny_wan_ti2v_is_ti2v_shaped_and_loads_as_ti2v(folder: Path) -> None:
    assert tiny_family("wan_ti2v") == "wan"
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline" and index["expand_timesteps"] is True
    c = WAN.load(str(folder))
    assert isinstance(c, WanTI2VComponents)
    vae = c.vae.config
    assert (vae.z_dim, vae.is_residual, vae.patch_size) == (Z, True, 2)
    assert (vae.scale_factor_spatial, vae.scale_factor_temporal) == (SPATIAL, 4)
    assert len(vae.latents_mean) == len(vae.latents_std) == Z
    assert (c.denoiser.config.in_channels, c.denoiser.config.out_channels) == (Z, Z)
    latents = WAN.encode_images(c, clip(1, 9))
    assert latents.shape == (1, Z, 3, 64 // SPATIAL, 64 // SPATIAL)
    assert 0.3 < float(latents.std()) < 3.0  # the tiny VAE's statistics are calibrated


def test_training_loss_matches_the_pipelines_per_token_timesteps(folder: Path) -> None:
    """Text from WanPipeline.encode_prompt, latents normalised as the pipeline
    un-normalises them, each sample through the transformer with the timestep tensor the
    pipeline builds for it, velocity target noise - latents, per-item MSE, batch mean."""
    pipe = reference_pipeline(folder)
    px = clip(2, 5)
    sigmas = torch.tensor([0.3, 0.9])
    with torch.no_grad():
        embeds, _ = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=False,
                                       max_sequence_length=512, device=torch.device("cpu"))
        vae = pipe.vae
        mean = torch.tensor(vae.config.latents_mean).view(1, Z, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, Z, 1, 1, 1)
        x = (vae.encode(px).latent_dist.mode() - mean) / std
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
        s = sigmas.view(-1, 1, 1, 1, 1)
        noisy = (1 - s) * x + s * noise
        # the pipeline gives all samples of a call one t: one call per sample
        timesteps = [pipeline_timestep(noisy[i:i + 1], sigmas[i] * 1000) for i in range(2)]
        want = torch.cat([pipe.transformer(hidden_states=noisy[i:i + 1], timestep=timesteps[i],
                                           encoder_hidden_states=embeds[i:i + 1],
                                           return_dict=False)[0] for i in range(2)])
        want_loss = ((want - (noise - x)) ** 2).reshape(2, -1).mean(1).mean()
    assert timesteps[0].shape == (1, 2 * 2 * 2)  # 2 latent frames x (4 / 2) x (4 / 2)

    c = WAN.load(str(folder))
    texts = WAN.encode_prompts(c, PROMPTS)
    latents = WAN.encode_images(c, px)
    torch.testing.assert_close(latents, x, rtol=1e-5, atol=1e-5)
    sample = WAN.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    spy = TimestepSpy(c.denoiser)
    try:
        with torch.no_grad():
            pred = WAN.predict(c, sample, batch_of(texts, latents))
    finally:
        spy.remove()
    (given,) = spy.seen
    torch.testing.assert_close(given, torch.cat(timesteps), rtol=0, atol=1e-3)
    assert given.dtype == torch.float32
    torch.testing.assert_close(pred, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(WAN.loss(c, pred, sample), want_loss, rtol=1e-5, atol=1e-6)


def generate(pipe, embeds: torch.Tensor) -> torch.Tensor:
    out = pipe(prompt_embeds=embeds, negative_prompt_embeds=torch.zeros_like(embeds),
               height=64, width=64, num_frames=5, num_inference_steps=2,
               generator=torch.Generator().manual_seed(0), output_type="np")
    return torch.as_tensor(out.frames)


def test_a_lora_step_changes_the_loss_and_its_files_reload_in_wan_pipeline(
        folder: Path, tmp_path: Path) -> None:
    c = WAN.load(str(folder))
    add_lora(c)
    lora = {n: p for n, p in c.denoiser.named_parameters() if "lora_" in n}
    before = {n: p.detach().clone() for n, p in lora.items()}
    texts = WAN.encode_prompts(c, PROMPTS)
    latents = WAN.encode_images(c, clip(2, 5))
    batch = batch_of(texts, latents)
    sample = WAN.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(lora.values(), lr=1e-3)
    loss = WAN.loss(c, WAN.predict(c, sample, batch), sample)
    loss.backward()
    assert all(p.grad is not None and torch.count_nonzero(p.grad) for p in lora.values())
    optimizer.step()
    assert all(not torch.equal(before[n], p) for n, p in lora.items())
    with torch.no_grad():
        after = WAN.loss(c, WAN.predict(c, sample, batch), sample)
    assert float(after) < float(loss.detach())

    paths = WAN.save_lora(c, tmp_path / "lora")
    embeds = texts[0]["prompt_embeds"][None].detach()
    with torch.no_grad():
        trained = torch.as_tensor(np.array(WAN.validation_pipeline(c)(
            prompt_embeds=embeds, negative_prompt_embeds=torch.zeros_like(embeds), height=64,
            width=64, num_frames=5, num_inference_steps=2,
            generator=torch.Generator().manual_seed(0)).frames[0][0]))
        pipe = reference_pipeline(folder)
        base = generate(pipe, embeds)
        pipe.load_lora_weights(str(paths["diffusers"].parent))
        loaded = generate(pipe, embeds)
        pipe.unload_lora_weights()
        pipe.load_lora_weights(str(paths["comfyui"]))
        comfy = generate(pipe, embeds)
    assert (loaded - base).abs().max() > 1e-3
    torch.testing.assert_close(comfy, loaded, atol=1e-4, rtol=1e-4)
    # the reloaded LoRA samples what the trained model samples (first frame, 8-bit)
    first = torch.as_tensor((loaded[0, 0].numpy() * 255).round().clip(0, 255))
    assert (first - trained.float()).abs().max() <= 1


def test_validation_samples_frames_of_the_asked_size_with_per_token_timesteps(
        folder: Path) -> None:
    c = WAN.load(str(folder))
    embeds = WAN.encode_prompts(c, PROMPTS[:1])[0]["prompt_embeds"][None]
    pipe = WAN.validation_pipeline(c)
    assert pipe.config.expand_timesteps is True
    # what a merge or a full fine-tune saves keeps it (pipelines.py's `components`)
    assert pipe.components["expand_timesteps"] is True
    spy = TimestepSpy(c.denoiser)
    try:
        out = pipe(prompt_embeds=embeds, negative_prompt_embeds=torch.zeros_like(embeds),
                   height=64, width=32, num_frames=9, num_inference_steps=2,
                   guidance_scale=4.0, generator=torch.Generator().manual_seed(0))
    finally:
        spy.remove()
    assert len(out.frames[0]) == 9 and out.frames[0][0].size == (32, 64)
    assert out.images[0] is out.frames[0][0]
    # 3 latent frames x (64 / 16 / 2) x (32 / 16 / 2) tokens, one timestep each
    assert spy.seen and all(t.shape == (1, 3 * 2 * 1) for t in spy.seen)


def test_ti2v_image_to_video_and_two_expert_folders_are_refused(folder: Path) -> None:
    from diffusers import WanImageToVideoPipeline, WanPipeline

    pipe = reference_pipeline(folder)
    parts = {k: getattr(pipe, k) for k in ("tokenizer", "text_encoder", "vae", "scheduler",
                                           "transformer")}
    i2v = WanImageToVideoPipeline(**parts, expand_timesteps=True)
    with pytest.raises(loading.ModelLoadError, match="TI2V image-to-video.*does not train"):
        WAN._components_from_pipeline(i2v, "ti2v-i2v", "fp")
    two = WanPipeline(**parts, transformer_2=pipe.transformer, boundary_ratio=0.9,
                      expand_timesteps=True)
    with pytest.raises(loading.ModelLoadError, match="two-expert.*expand_timesteps"):
        WAN._components_from_pipeline(two, "ti2v-two", "fp")


def test_a_short_run_on_clips_caches_48_channels_trains_and_validates(
        tmp_path: Path, tiny_workspace: Path) -> None:
    from safetensors import safe_open

    cfg = two_clip_config(tmp_path, "tiny:wan_ti2v", 5)
    ds = cfg.datasets[0]
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    with safe_open(str(Path(ds.vae_cache) / "a.mp4.safetensors"), "pt") as fh:
        assert fh.get_slice("latents").get_shape() == [Z, 2, ds.resolution // SPATIAL,
                                                       ds.resolution // SPATIAL]
    run = Path(cfg.output.dir)
    losses = [e["loss"] for e in map(json.loads, (run / "events.jsonl").read_text()
                                     .splitlines()) if e["type"] == "step"]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    assert (run / "lora/pytorch_lora_weights.safetensors").is_file()
    assert (run / "validation/step_000002/00.mp4").is_file()
