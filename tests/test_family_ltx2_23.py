"""LTX-2.3 and LTX-2.5 in the ltx2 family. LTX-2.3 on its tiny random model, tiny:ltx23
(CPU, seconds each): recognised from its configs, the training loss against diffusers'
classes as LTX2Pipeline runs them (per-modality connector projections at each stream's
width, sigma-read prompt modulation), validation with the guidance the pipeline suggests
for 2.3 (audio CFG, STG, modality guidance), a short run from clips to LoRA files that
reload in diffusers and a video with its 48 kHz sound, and random:ltx2:2.3's estimate.
LTX-2.5 is refused at `--stage check` and at load, naming the folder and why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_family_ltx2 import FRAMES, PROMPTS, SIZE, batch_of, clip, clip_config, tone

from core.models.families.ltx2 import versions
from core.models.families.ltx2.family import FAMILY as LTX2
from core.models.families.ltx2.objective import EVAL_AUDIO_SEED
from core.models.tiny import build_tiny_folder

FAMILY_DIR = Path(__file__).resolve().parents[1] / "core/models/families/ltx2"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-ltx23")
    build_tiny_folder("ltx23", out, seed=0)
    return out


@pytest.fixture(scope="module")
def loaded(folder: Path):
    return LTX2.load(str(folder))


def test_the_configs_say_which_ltx2_it_is(folder: Path, loaded) -> None:
    """tiny:ltx23 and random:ltx2:2.3 are 2.3, tiny:ltx2 and random:ltx2 2.0; the cached
    text splits where each version's video connector output ends (LTX-2.0's 3840-wide
    caption channels, not its transformer's 4096-wide cross_attention_dim)."""
    assert versions.folder_version(folder) == versions.V23
    assert versions.source_version("tiny:ltx23") == versions.V23
    assert versions.source_version("tiny:ltx2") == versions.V20
    assert versions.source_version("random:ltx2:2.3") == versions.V23
    assert versions.source_version("Lightricks/LTX-2.3") == versions.V23
    assert type(loaded.vocoder).__name__ == "LTX2VocoderWithBWE"
    for name, version in (("full_size", versions.V20), ("full_size_2.3", versions.V23)):
        assert versions.folder_version(FAMILY_DIR / name) == version
        transformer = json.loads((FAMILY_DIR / name / "transformer/config.json").read_text())
        connectors = json.loads((FAMILY_DIR / name / "connectors/config.json").read_text())
        video_out = (connectors["video_connector_num_attention_heads"]
                     * connectors["video_connector_attention_head_dim"])
        assert versions.video_text_width(transformer) == video_out
    text = LTX2.encode_prompts(loaded, PROMPTS[:1])[0]["prompt_embeds"]
    assert text.shape == (1024, 32 + 16)  # each stream's own width


def test_training_loss_matches_the_pipeline_written_out(folder: Path, loaded) -> None:
    """Item 0 has audio, item 1 none (pure noise at t = 1000); the transformer gets
    what LTX2Pipeline gives an LTX-2.3 one, sigma included."""
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
        got = LTX2.loss(c, LTX2.predict(c, sample, batch_of(texts, latents, [audio, None])),
                        sample)
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
        video_mse = ((pipe._unpack_latents(video, 2, 2, 2) - (noise - x)) ** 2)
        video_mse = video_mse.reshape(2, -1).mean(1)
        audio_mse = ((audio_out[0] - (audio_noise[0] - audio)) ** 2).mean()
    assert video_text.shape[-1] == 32 and audio_text.shape[-1] == 16
    torch.testing.assert_close(torch.stack([t["prompt_embeds"] for t in texts]),
                               torch.cat([video_text, audio_text], dim=-1))
    want = (video_mse[0] + audio_mse + video_mse[1]) / 2
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def frames_of(out) -> torch.Tensor:
    return torch.tensor(np.stack([np.stack([np.asarray(f) for f in video])
                                  for video in out.frames]))


def test_validation_samples_with_the_guidance_suggested_for_2_3(folder: Path, loaded) -> None:
    """From the cached text at validation.guidance_scale 3.0, the video is LTX2Pipeline's
    from the prompt with the 2.3 suggestions spelled out (audio CFG 7, STG 1 at the last
    block of this one-block model, modality guidance 3, rescale 0.7); a draw without
    CFG (guidance 1.0, a distilled model's) adds none of them."""
    from diffusers import LTX2Pipeline

    config = loaded.denoiser.config
    assert versions.suggested_guidance(config, 1.0) == {}
    assert versions.suggested_guidance(json.loads(
        (FAMILY_DIR / "full_size/transformer/config.json").read_text()), 3.0) == {}
    pipe = LTX2Pipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    common = {"height": SIZE, "width": SIZE, "num_frames": FRAMES, "num_inference_steps": 2,
              "guidance_scale": 3.0}
    suggested = {"audio_guidance_scale": 7.0, "stg_scale": 1.0, "audio_stg_scale": 1.0,
                 "modality_scale": 3.0, "audio_modality_scale": 3.0,
                 "guidance_rescale": 0.7, "spatio_temporal_guidance_blocks": [0]}
    want = pipe(prompt=PROMPTS[0], output_type="np", **common, **suggested,
                generator=torch.Generator().manual_seed(0))
    plain = pipe(prompt=PROMPTS[0], output_type="np", **common,
                 generator=torch.Generator().manual_seed(0))
    prompt, negative = LTX2.encode_prompts(loaded, [PROMPTS[0], ""])
    out = LTX2.validation_pipeline(loaded)(
        prompt_embeds=prompt["prompt_embeds"][None],
        prompt_attention_mask=prompt["prompt_mask"][None],
        negative_prompt_embeds=negative["prompt_embeds"][None],
        negative_prompt_attention_mask=negative["prompt_mask"][None], **common,
        generator=torch.Generator().manual_seed(0))
    got, want_video = frames_of(out).float(), torch.as_tensor(want.frames) * 255
    assert (got - want_video.round().reshape(got.shape)).abs().max() <= 1
    assert (torch.as_tensor(plain.frames) - torch.as_tensor(want.frames)).abs().max() > 1e-3
    torch.testing.assert_close(out.audio, want.audio.float(), atol=1e-4, rtol=1e-4)
    assert out.audio_sample_rate == 48000  # the bandwidth extender's


@pytest.mark.slow  # about 45 s on a loaded 2-core machine: the build, the run, 3 draws
def test_a_short_run_trains_saves_loras_that_reload_and_validates(
        tmp_path: Path, tiny_workspace: Path, folder: Path) -> None:
    import av
    from conftest import train_in_process
    from diffusers import LTX2Pipeline

    from core.config import save_config

    cfg = clip_config(tmp_path)
    cfg.model.path = "tiny:ltx23"
    cfg.validation.guidance_scale = versions.VIDEO_GUIDANCE_23
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    run = Path(cfg.output.dir)
    with av.open(str(run / "validation/step_000002/00.mp4")) as container:
        assert container.streams.video[0].frames == FRAMES
        assert [s.codec_context.name for s in container.streams.audio] == ["aac"]
    pipe = LTX2Pipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    keys = {"prompt": PROMPTS[0], "height": SIZE, "width": SIZE, "num_frames": FRAMES,
            "num_inference_steps": 2, "output_type": "np", "guidance_scale": 1.0}
    base = pipe(**keys, generator=torch.Generator().manual_seed(0)).frames
    pipe.load_lora_weights(str(run / "lora/pytorch_lora_weights.safetensors"))
    tuned = pipe(**keys, generator=torch.Generator().manual_seed(0)).frames
    pipe.unload_lora_weights()
    pipe.load_lora_weights(str(run / "lora/lora_comfyui.safetensors"))
    comfy = pipe(**keys, generator=torch.Generator().manual_seed(0)).frames
    assert np.abs(tuned - base).max() > 0
    np.testing.assert_allclose(comfy, tuned, atol=1e-4)


def ltx25_folder(root: Path) -> Path:
    """The configs of an LTX-2.5 diffusers folder (no weights): a Gemma 4 text encoder,
    the distilled transformer/ beside the dev transformer_full/, a diffusion decoder and
    a duration head in model_index.json."""
    folder = root / "LTX-2.5-local"
    index = json.loads((FAMILY_DIR / "full_size_2.3/model_index.json").read_text())
    index.update(diffusion_decoder=["diffusers", "LTX2VideoDiffusionDecoderModel"],
                 duration_head=["ltx2", "LTX2DurationHead"],
                 text_encoder=["transformers", "Gemma4UnifiedForConditionalGeneration"])
    transformer = json.loads((FAMILY_DIR / "full_size_2.3/transformer/config.json").read_text())
    transformer.update(ff_bias=False, use_keyframes_abs_pos_embedding=True)
    for sub in ("transformer", "transformer_full"):
        (folder / sub).mkdir(parents=True)
        (folder / sub / "config.json").write_text(json.dumps(transformer))
    (folder / "text_encoder").mkdir()
    (folder / "text_encoder/config.json").write_text(json.dumps({"model_type": "gemma4_unified"}))
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def test_ltx_2_5_is_refused_at_check_and_load_naming_the_folder(tmp_path: Path) -> None:
    from conftest import check_in_process, small_config

    from core.config import save_config
    from core.config.checks import validate_config
    from core.models.loading import ModelLoadError

    folder = ltx25_folder(tmp_path)
    assert versions.folder_version(folder) == versions.V25
    cfg = small_config(tmp_path, images=1, family="ltx2")
    cfg.model.path = str(folder)
    errors = [p for p in validate_config(cfg) if p.where == "model.path"]
    assert [p.level for p in errors] == ["error"]
    for words in (str(folder), "LTX-2.5", "transformer_full/", "Gemma 4", "LTX-2.3"):
        assert words in errors[0].message
    with pytest.raises(ModelLoadError, match="LTX-2.5"):
        LTX2.load(str(folder))  # refused before any weights are read
    assert versions.model_problems("Lightricks/LTX-2.5")  # a hub id, by its name
    modular_only = tmp_path / "modular"
    modular_only.mkdir()
    (modular_only / "modular_model_index.json").write_text(
        json.dumps({"_class_name": "LTX25ModularPipeline"}))
    assert versions.folder_version(modular_only) == versions.V25
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"))
    assert done.returncode != 0 and "Traceback" not in done.stdout + done.stderr
    assert "transformer_full/" in done.stdout + done.stderr
