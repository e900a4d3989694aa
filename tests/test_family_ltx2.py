"""LTX-2 on its tiny random model (CPU, seconds each): the training loss against a
written-out use of diffusers' classes as LTX2Pipeline runs them (Gemma layers through the
connectors, normalised and packed latents, one sigma for video and audio, velocity
targets), the cached text sampling what the pipeline samples from the prompt, the 8x/32x
compression, the token-count shift, LoRA files that reload in diffusers (the ComfyUI one
through diffusers' converter of LTX-2's original names), and a short headless run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from core.data.collate import collate
from core.models.families.ltx2.audio import audio_length, log_mel
from core.models.families.ltx2.family import FAMILY as LTX2
from core.models.families.ltx2.objective import EVAL_AUDIO_SEED, token_shift
from core.models.tiny import build_tiny_folder

PROMPTS = ["a red circle moving left", "a blue square"]
FRAMES, SIZE = 9, 64


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-ltx2")
    build_tiny_folder("ltx2", out, seed=0)
    return out


@pytest.fixture(scope="module")
def loaded(folder: Path):
    return LTX2.load(str(folder))


def clip(n: int, frames: int, size: int = SIZE, seed: int = 0) -> torch.Tensor:
    """Smooth random clips [n, 3, frames, size, size] in [-1, 1]."""
    coarse = torch.rand(n * frames, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
    px = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear")
    return (px * 2 - 1).view(n, frames, 3, size, size).transpose(1, 2)


def tone(seconds: float, hz: float = 440.0, rate: int = 16000) -> torch.Tensor:
    t = torch.arange(int(seconds * rate)) / rate
    return (0.5 * torch.sin(2 * math.pi * hz * t)).expand(1, 2, -1).clone()


def batch_of(texts: list[dict], latents: torch.Tensor, audio: list | None = None) -> dict:
    items = [{**t, "latents": latents[i], "path": f"{i}.mp4", "caption": ""}
             for i, t in enumerate(texts)]
    if audio is not None:
        for item, a in zip(items, audio, strict=True):
            item["audio_latents"] = a
    return collate(items)


def test_training_loss_matches_the_pipeline_written_out(folder: Path, loaded) -> None:
    """Item 0 has audio (noised at its sigma), item 1 none (pure noise at t = 1000, no
    audio loss); both through the transformer exactly as LTX2Pipeline calls it."""
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline.from_pretrained(str(folder), local_files_only=True)
    px, sigmas = clip(2, FRAMES), torch.tensor([0.3, 0.9])
    c = loaded
    texts = LTX2.encode_prompts(c, PROMPTS)
    latents = LTX2.encode_images(c, px)
    audio = LTX2.audio.encode(c, tone(FRAMES / 24), FRAMES, 24.0)[0]
    noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(3))
    sample = LTX2.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    with torch.no_grad():
        pred = LTX2.predict(c, sample, batch_of(texts, latents, [audio, None]))
        got_loss = LTX2.loss(c, pred, sample)

        embeds, mask = pipe._get_gemma_prompt_embeds(PROMPTS, max_sequence_length=1024)
        video_text, audio_text, text_mask = pipe.connectors(embeds, mask, padding_side="left")
        vae = pipe.vae
        x = pipe._normalize_latents(vae.encode(px).latent_dist.mode(), vae.latents_mean,
                                    vae.latents_std, vae.config.scaling_factor)
        s = sigmas.view(-1, 1, 1, 1, 1)
        clean_audio = torch.stack([audio, torch.zeros_like(audio)])
        audio_noise = torch.randn(clean_audio.shape,
                                  generator=torch.Generator().manual_seed(EVAL_AUDIO_SEED))
        audio_sigma = torch.tensor([0.3, 1.0])
        a_s = audio_sigma.view(-1, 1, 1)
        video, audio_out = pipe.transformer(
            hidden_states=pipe._pack_latents((1 - s) * x + s * noise),
            audio_hidden_states=(1 - a_s) * clean_audio + a_s * audio_noise,
            encoder_hidden_states=video_text, audio_encoder_hidden_states=audio_text,
            timestep=sigmas * 1000, audio_timestep=audio_sigma * 1000, sigma=sigmas * 1000,
            audio_sigma=audio_sigma * 1000, encoder_attention_mask=text_mask,
            audio_encoder_attention_mask=text_mask, num_frames=2, height=2, width=2, fps=24.0,
            audio_num_frames=audio.shape[0], use_cross_timestep=True, return_dict=False)
        want = pipe._unpack_latents(video, 2, 2, 2)
        video_mse = ((want - (noise - x)) ** 2).reshape(2, -1).mean(1)
        audio_mse = ((audio_out[0] - (audio_noise[0] - audio)) ** 2).mean()
    torch.testing.assert_close(torch.stack([t["prompt_embeds"] for t in texts]),
                               torch.cat([video_text, audio_text], dim=-1))
    torch.testing.assert_close(pred, want, rtol=1e-5, atol=1e-5)
    want_loss = (video_mse[0] + audio_mse + video_mse[1]) / 2
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)


def test_latents_compress_8x_in_time_32x_in_space_and_images_are_one_frame(loaded) -> None:
    c = loaded
    assert LTX2.encode_images(c, clip(1, 17)).shape == (1, 128, 3, 2, 2)
    image = clip(2, 1)[:, :, 0]
    latents = LTX2.encode_images(c, image)
    assert latents.shape == (2, 128, 1, 2, 2)
    assert 0.3 < float(latents.std()) < 3.0  # the tiny VAE's statistics are calibrated
    torch.testing.assert_close(LTX2.encode_images(c, image), latents)  # cache-stable
    assert LTX2.geometry.latent_frames(121) == 16 and LTX2.geometry.valid_frames(121)


def test_text_is_the_connectors_output_at_1024_tokens(loaded) -> None:
    short, other = LTX2.encode_prompts(loaded, PROMPTS)
    assert short["prompt_embeds"].shape == (1024, 32 + 32)
    assert short["prompt_mask"].dtype == torch.bool and bool(short["prompt_mask"].any())
    assert not torch.equal(short["prompt_embeds"], other["prompt_embeds"])
    assert next(loaded.connectors.parameters()).device.type == "cpu"


def test_sigmas_are_shifted_for_the_video_token_count(loaded) -> None:
    config = loaded.noise_scheduler.config
    assert token_shift(config, 1024) == pytest.approx(math.exp(0.95))
    assert token_shift(config, 4096) == pytest.approx(math.exp(2.05))
    latents = torch.zeros(4000, 128, 2, 2, 2)  # 8 tokens: below base_image_seq_len
    sample = LTX2.noise_and_target(loaded, latents, generator=torch.Generator().manual_seed(0))
    shift = token_shift(config, 8)
    # logit-normal's median u = 1/2, shifted: s u / (1 + (s - 1) u)
    median = float((sample.timesteps / 1000).median())
    assert median == pytest.approx(shift / (1 + shift), abs=0.02)


def test_audio_is_a_log_mel_at_the_vaes_rate_cut_to_the_clips_length(loaded) -> None:
    config = loaded.audio_vae.config
    assert audio_length(config, 121, 24.0) == 126  # 121 / 24 s at 25 latents a second
    mel = log_mel(tone(1.0, hz=4000.0), config)
    assert mel.shape == (1, 2, 101, config.mel_bins)  # centred frames every 160 samples
    peak = int(mel[0, 0, 50].argmax())
    assert config.mel_bins // 2 <= peak < config.mel_bins  # 4 kHz: upper half of 0-8 kHz
    latents = LTX2.audio.encode(loaded, tone(0.5), 12, 24.0)
    assert latents.shape == (1, audio_length(config, 12, 24.0), 16)
    torch.testing.assert_close(LTX2.audio.encode(loaded, tone(0.5), 12, 24.0), latents)


def add_lora(c, rank: int = 4) -> None:
    from peft import LoraConfig

    c.denoiser.add_adapter(LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights="gaussian",
                                      target_modules=LTX2.lora_target_modules()))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in c.denoiser.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def generate(pipe) -> tuple[torch.Tensor, torch.Tensor]:
    out = pipe(prompt=PROMPTS[0], height=SIZE, width=SIZE, num_frames=FRAMES,
               num_inference_steps=2, generator=torch.Generator().manual_seed(0),
               output_type="np")
    return torch.as_tensor(out.frames), out.audio


def test_lora_files_reload_in_diffusers_the_comfyui_one_by_original_names(
        folder: Path, tmp_path: Path) -> None:
    from diffusers import LTX2Pipeline
    from safetensors import safe_open

    trained = LTX2.load(str(folder))
    add_lora(trained)
    texts = LTX2.encode_prompts(trained, PROMPTS)
    latents = LTX2.encode_images(trained, clip(2, FRAMES))
    audio = list(LTX2.audio.encode(trained, tone(FRAMES / 24).repeat(2, 1, 1), FRAMES, 24.0))
    s = LTX2.noise_and_target(trained, latents, generator=torch.Generator().manual_seed(0))
    # with audio: the video-to-audio attention and the audio feed-forward reach the loss
    LTX2.loss(trained, LTX2.predict(trained, s, batch_of(texts, latents, audio)), s).backward()
    lora = {n: p for n, p in trained.denoiser.named_parameters() if "lora_" in n}
    assert len(lora) == 2 * 24  # six attentions' q/k/v/out in the one block
    assert all(p.grad is not None for p in lora.values())

    paths = LTX2.save_lora(trained, tmp_path / "lora")
    with safe_open(str(paths["comfyui"]), "pt") as fh:
        keys = set(fh.keys())
    assert "diffusion_model.transformer_blocks.0.audio_to_video_attn.to_q.lora_A.weight" in keys
    assert not any(k.endswith(".alpha") for k in keys)  # folded into B: diffusers refuses it

    pipe = LTX2Pipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    base_video, base_audio = generate(pipe)
    pipe.load_lora_weights(str(paths["diffusers"]))
    video, audio = generate(pipe)
    assert (video - base_video).abs().max() > 1e-3
    assert (audio - base_audio).abs().max() > 1e-5
    pipe.unload_lora_weights()
    pipe.load_lora_weights(str(paths["comfyui"]))
    torch.testing.assert_close(generate(pipe)[0], video, atol=1e-4, rtol=1e-4)


def test_validation_from_the_cached_text_samples_what_the_pipeline_samples(
        folder: Path, loaded) -> None:
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    want_video, want_audio = generate(pipe)
    prompt, negative = LTX2.encode_prompts(loaded, [PROMPTS[0], ""])
    out = LTX2.validation_pipeline(loaded)(
        prompt_embeds=prompt["prompt_embeds"][None],
        prompt_attention_mask=prompt["prompt_mask"][None],
        negative_prompt_embeds=negative["prompt_embeds"][None],
        negative_prompt_attention_mask=negative["prompt_mask"][None],
        height=SIZE, width=SIZE, num_frames=FRAMES, num_inference_steps=2,
        generator=torch.Generator().manual_seed(0))
    assert len(out.frames[0]) == FRAMES and out.images[0] is out.frames[0][0]
    got = torch.tensor(np.stack([np.stack([np.asarray(f) for f in video])
                                  for video in out.frames]))
    want = (want_video * 255).round().clamp(0, 255).reshape(got.shape)
    assert (got.float() - want).abs().max() <= 1
    torch.testing.assert_close(out.audio, want_audio.float(), atol=1e-4, rtol=1e-4)
    assert out.audio_sample_rate == 24000


def clip_config(tmp_path: Path):
    """tiny:ltx2 trained 2 steps on two captioned 9-frame clips at 24 fps, one prompt
    validated as a 9-frame video at step 2."""
    from conftest import small_config

    from core.data.video import write_synthetic_clip

    cfg = small_config(tmp_path, images=1, family="ltx2")
    clips = tmp_path / "clips"
    clips.mkdir()
    for name, color, direction in (("a", "red", "right"), ("b", "blue", "left")):
        made = write_synthetic_clip(clips / f"{name}.mp4", color=color, direction=direction,
                                    frames=FRAMES, fps=24)
        (clips / f"{name}.txt").write_text(f"a {made.color} {made.shape} moving {direction}")
    ds = cfg.datasets[0]
    ds.images, ds.frames, ds.fps = str(clips), FRAMES, 24.0
    cfg.train.max_steps = cfg.train.eval_every = cfg.validation.every = 2
    cfg.validation.prompts, cfg.validation.frames = ["a red square moving right"], FRAMES
    cfg.validation.fps = 24.0
    return cfg


def test_a_short_headless_run_caches_trains_saves_and_validates(tmp_path: Path,
                                                                 tiny_workspace: Path) -> None:
    import av
    from conftest import train_in_process
    from safetensors import safe_open

    from core.config import save_config

    cfg = clip_config(tmp_path)
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    with safe_open(str(Path(cfg.datasets[0].vae_cache) / "a.mp4.safetensors"), "pt") as fh:
        assert fh.get_slice("latents").get_shape() == [128, 2, 2, 2]
    run = Path(cfg.output.dir)
    assert (run / "lora/pytorch_lora_weights.safetensors").is_file()
    assert (run / "lora/lora_comfyui.safetensors").is_file()
    video = run / "validation/step_000002/00.mp4"
    with av.open(str(video)) as container:  # the generated sound rides along, as AAC
        assert container.streams.video[0].frames == FRAMES
        assert [s.codec_context.name for s in container.streams.audio] == ["aac"]


def test_the_preset_checks_clean_and_estimates_under_24_gib(tmp_path: Path) -> None:
    """presets/ltx2-lora.toml at the real sizes (random:ltx2's configs): int8, 19 swapped
    blocks and the streamed Gemma keep every phase under a 24 GB card."""
    from conftest import check_in_process, per_gpu_gib, write_shapes

    write_shapes(tmp_path / "data/mydata", 2)
    done = check_in_process("--preset", "ltx2-lora", "--workspace", str(tmp_path),
                            "--set", "model.path=random:ltx2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 15 < per_gpu_gib(done.stdout) < 22.5, done.stdout[-2000:]


def test_the_estimate_counts_the_audio_tokens_beside_the_video() -> None:
    """The audio stream's activations come on top of the video stream's, at its own
    width, growing with the clip (25 audio latents a second at 24 fps); a family
    without a second stream adds none."""
    import json

    from conftest import REPO

    from core.memory.activations import StepShape
    from core.memory.estimate import extra_stream_bytes

    config = json.loads((REPO / "core/models/families/ltx2/full_size/transformer"
                         / "config.json").read_text())
    short, long = (StepShape(16, 16, 1, 2, True, latent_frames=f) for f in (2, 16))
    assert 0 < extra_stream_bytes("ltx2", config, short) < extra_stream_bytes(
        "ltx2", config, long)
    assert extra_stream_bytes("wan", config, long) == 0


def test_the_check_names_bad_frame_counts_and_another_frame_rate(tmp_path: Path) -> None:
    from conftest import small_config

    from core.config import validate_config

    cfg = small_config(tmp_path, images=1, family="ltx2")
    cfg.datasets[0].frames, cfg.validation.frames = 10, 33
    frames = [p for p in validate_config(cfg) if p.where == "datasets.0.frames"]
    assert [p.level for p in frames] == ["error"] and "use 9 or 17" in frames[0].message
    assert LTX2.config_problems(cfg) == [], "fps = 0, the default, is the family's 24"
    cfg.datasets[0].fps = 16.0
    fps = [p for p in LTX2.config_problems(cfg) if p.where == "datasets.0.fps"]
    assert [p.level for p in fps] == ["warning"] and "24 fps" in fps[0].message
    cfg.datasets[0].fps = 24.0
    assert LTX2.config_problems(cfg) == []
