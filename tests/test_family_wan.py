"""Wan on its tiny random model (CPU, seconds each): the training loss against a
written-out use of diffusers' classes as WanPipeline runs them, the UMT5 text as the
pipeline pads it, video and image latents, the shifted sigma draw, LoRA files that reload
in diffusers (the ComfyUI one through diffusers' converter of original Wan names), frames
from validation (Wan 2.2's two experts: tests/test_family_wan22.py; TI2V-5B:
tests/test_family_wan_ti2v.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.data.collate import collate
from core.models.families.wan.family import FAMILY as WAN
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle moving left", "a blue square"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-wan")
    build_tiny_folder("wan", out, seed=0)
    return out


def clip(n: int, frames: int, size: int = 64, seed: int = 0) -> torch.Tensor:
    """Smooth random clips [n, 3, frames, size, size] in [-1, 1]."""
    coarse = torch.rand(n * frames, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    px = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear")
    return (px * 2 - 1).view(n, frames, 3, size, size).transpose(1, 2)


def batch_of(texts: list[dict], latents: torch.Tensor) -> dict:
    return collate([{**t, "latents": latents[i], "path": f"{i}.mp4", "caption": ""}
                    for i, t in enumerate(texts)])


def two_clip_config(tmp_path: Path, model: str, frames: int):
    """A config training `model` (a tiny Wan) 2 steps on two captioned 9-frame clips,
    `frames` frames a sample, validating one prompt as a `frames`-frame video at step 2."""
    from conftest import small_config

    from core.data.video import write_synthetic_clip

    cfg = small_config(tmp_path, images=1, family="wan")
    cfg.model.path = model
    clips = tmp_path / "clips"
    clips.mkdir()
    for name, color, direction in (("a", "red", "right"), ("b", "blue", "left")):
        made = write_synthetic_clip(clips / f"{name}.mp4", color=color, direction=direction,
                                    frames=9, fps=16)
        (clips / f"{name}.txt").write_text(f"a {made.color} {made.shape} moving {direction}")
    ds = cfg.datasets[0]
    ds.images, ds.frames, ds.fps = str(clips), frames, 0.0
    cfg.train.max_steps = cfg.train.eval_every = cfg.validation.every = 2
    cfg.validation.prompts, cfg.validation.frames = ["a red square moving right"], frames
    return cfg


def add_lora(c, rank: int = 4) -> None:
    """A LoRA on the family's targets with lora_B non-zero, so it changes the output."""
    from peft import LoraConfig

    c.denoiser.add_adapter(LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights="gaussian",
                                      target_modules=WAN.lora_target_modules()))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in c.denoiser.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def test_training_loss_matches_the_pipeline_written_out(folder: Path) -> None:
    """Text as WanPipeline._get_t5_prompt_embeds builds it, latents normalised as the
    pipeline un-normalises them, the rectified-flow mix and velocity target, t = 1000 sigma."""
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(str(folder), local_files_only=True)
    px = clip(2, 5)
    sigmas = torch.tensor([0.3, 0.9])
    with torch.no_grad():
        tokens = pipe.tokenizer(PROMPTS, padding="max_length", max_length=512, truncation=True,
                                return_tensors="pt")
        hidden = pipe.text_encoder(tokens.input_ids, tokens.attention_mask).last_hidden_state
        real = tokens.attention_mask.sum(1)
        embeds = torch.stack([torch.cat([h[:n], h.new_zeros(512 - n, h.shape[1])])
                              for h, n in zip(hidden, real, strict=True)])
        vae = pipe.vae
        mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
        x = (vae.encode(px).latent_dist.mode() - mean) / std
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
        s = sigmas.view(-1, 1, 1, 1, 1)
        want = pipe.transformer(hidden_states=(1 - s) * x + s * noise, timestep=sigmas * 1000,
                                encoder_hidden_states=embeds, return_dict=False)[0]
        want_loss = ((want - (noise - x)) ** 2).reshape(2, -1).mean(1).mean()

    c = WAN.load(str(folder))
    texts = WAN.encode_prompts(c, PROMPTS)
    latents = WAN.encode_images(c, px)
    assert latents.shape == (2, 16, 2, 8, 8)  # 5 frames -> 1 + 4 / 4
    sample = WAN.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    with torch.no_grad():
        pred = WAN.predict(c, sample, batch_of(texts, latents))
    torch.testing.assert_close(pred, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(WAN.loss(c, pred, sample), want_loss, rtol=1e-5, atol=1e-6)


def test_text_is_padded_with_zeros_and_the_mask_marks_the_real_tokens(folder: Path) -> None:
    c = WAN.load(str(folder))
    short, other = WAN.encode_prompts(c, PROMPTS)
    n = int(short["prompt_mask"].sum())
    assert short["prompt_embeds"].shape == (512, 32) and 0 < n < 512
    assert short["prompt_embeds"][n:].abs().sum() == 0
    assert short["prompt_embeds"][:n].abs().sum(dim=1).min() > 0
    assert int(other["prompt_mask"].sum()) != n


def test_images_are_one_frame_and_clips_compress_four_times_in_time(folder: Path) -> None:
    c = WAN.load(str(folder))
    image = clip(2, 1)[:, :, 0]
    latents = WAN.encode_images(c, image)
    assert latents.shape == (2, 16, 1, 8, 8)
    assert 0.5 < float(latents.std()) < 2.0  # the tiny VAE's statistics are calibrated
    torch.testing.assert_close(WAN.encode_images(c, image), latents)  # cache-stable
    assert WAN.encode_images(c, clip(1, 9)).shape == (1, 16, 3, 8, 8)


def test_sigmas_are_uniform_shifted_by_the_schedulers_flow_shift(folder: Path) -> None:
    c = WAN.load(str(folder))
    assert c.noise_scheduler.config.flow_shift == 3.0
    latents = torch.zeros(4000, 16, 1, 2, 2)
    sample = WAN.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0),
                                  noise=torch.zeros_like(latents))
    sigma = sample.timesteps / 1000
    # shift 3: sigma' = 3u / (1 + 2u), whose median (u = 1/2) is 0.75
    assert float(sigma.median()) == pytest.approx(0.75, abs=0.02)


def test_lora_files_reload_in_diffusers_the_comfyui_one_by_wan_names(folder: Path,
                                                                        tmp_path: Path) -> None:
    from diffusers import WanPipeline
    from safetensors import safe_open

    trained = WAN.load(str(folder))
    add_lora(trained)
    texts = WAN.encode_prompts(trained, PROMPTS)
    latents = WAN.encode_images(trained, clip(2, 5))
    s = WAN.noise_and_target(trained, latents, generator=torch.Generator().manual_seed(0))
    WAN.loss(trained, WAN.predict(trained, s, batch_of(texts, latents)), s).backward()
    lora = {n: p for n, p in trained.denoiser.named_parameters() if "lora_" in n}
    assert len(lora) == 2 * 8  # both attentions' q/k/v/out of the one block
    assert all(p.grad is not None and torch.count_nonzero(p.grad) for p in lora.values())

    paths = WAN.save_lora(trained, tmp_path / "lora")
    with safe_open(str(paths["comfyui"]), "pt") as fh:
        keys = set(fh.keys())
    assert "diffusion_model.blocks.0.self_attn.q.lora_A.weight" in keys
    assert "diffusion_model.blocks.0.cross_attn.o.alpha" in keys

    embeds = texts[0]["prompt_embeds"][None].detach()

    def generate(pipe) -> torch.Tensor:
        out = pipe(prompt_embeds=embeds, negative_prompt_embeds=torch.zeros_like(embeds),
                   height=64, width=64, num_frames=5, num_inference_steps=2,
                   generator=torch.Generator().manual_seed(0), output_type="np").frames
        return torch.as_tensor(out)

    pipe = WanPipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    base = generate(pipe)
    pipe.load_lora_weights(str(paths["diffusers"]))
    with_lora = generate(pipe)
    assert (with_lora - base).abs().max() > 1e-3
    pipe.unload_lora_weights()
    pipe.load_lora_weights(str(paths["comfyui"]))
    torch.testing.assert_close(generate(pipe), with_lora, atol=1e-4, rtol=1e-4)


def test_validation_pipeline_gives_frames_and_the_first_as_the_image(folder: Path) -> None:
    c = WAN.load(str(folder))
    embeds = WAN.encode_prompts(c, PROMPTS[:1])[0]["prompt_embeds"][None]
    out = WAN.validation_pipeline(c)(
        prompt_embeds=embeds, negative_prompt_embeds=torch.zeros_like(embeds), height=64,
        width=48, num_frames=9, num_inference_steps=2, guidance_scale=4.0,
        generator=torch.Generator().manual_seed(0))
    assert len(out.frames[0]) == 9 and out.frames[0][0].size == (48, 64)
    assert out.images[0] is out.frames[0][0]
