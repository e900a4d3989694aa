"""LTX-2 image-to-video (model.ltx2_mode = "image_to_video") on the tiny random model
(CPU): the training loss against LTX2ImageToVideoPipeline's own conditioning written out
(its prepare_latents' first-frame latents and conditioning mask, the per-token video
timestep, only the frames after the first stepped), the key's place in the config, the
check and the form, validation from the prompt's first image as the pipeline samples it,
and a short run from clips to a LoRA and a video with sound."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from test_family_ltx2 import FRAMES, PROMPTS, SIZE, batch_of, clip, clip_config, tone

from core.config import Config, apply_override, dumps_config
from core.config.checks import validate_config
from core.config.schema import ModelConfig
from core.models.families.ltx2.family import FAMILY as LTX2
from core.models.families.ltx2.objective import EVAL_AUDIO_SEED
from core.models.tiny import build_tiny_folder

I2V = "image_to_video"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-ltx2")
    build_tiny_folder("ltx2", out, seed=0)
    return out


@pytest.fixture(scope="module")
def loaded(folder: Path):
    """tiny:ltx2 set up for an image-to-video run, as the trainer's configure_run does."""
    c = LTX2.load(str(folder))
    cfg = Config()
    cfg.model.family, cfg.model.ltx2_mode = "ltx2", I2V
    LTX2.configure_run(c, cfg)
    return c


def eight_bit(px: torch.Tensor) -> torch.Tensor:
    """Pixels as a dataset gives them: 8-bit values mapped to [-1, 1]."""
    return ((px + 1) * 127.5).round().clamp(0, 255) / 127.5 - 1


def pil(frame: torch.Tensor):
    from PIL import Image

    array = ((frame + 1) * 127.5).round().byte().permute(1, 2, 0).numpy()
    return Image.fromarray(np.ascontiguousarray(array))


def test_the_training_loss_is_the_image_to_video_pipelines_objective(folder: Path,
                                                                     loaded) -> None:
    """Each clip's first frame, given to the pipeline as its image, is what the clean
    first latent frame holds; the transformer gets the pipeline's inputs (timestep 0 on
    the first frame's tokens, t elsewhere and for the audio and sigma); the loss is the
    MSE of the frames after the first plus the audio MSE."""
    from diffusers import LTX2ImageToVideoPipeline

    pipe = LTX2ImageToVideoPipeline.from_pretrained(str(folder), local_files_only=True)
    c = loaded
    px, sigmas = eight_bit(clip(2, FRAMES, seed=4)), torch.tensor([0.3, 0.9])
    texts = LTX2.encode_prompts(c, PROMPTS)
    latents = LTX2.encode_images(c, px)
    audio = list(LTX2.audio.encode(c, tone(FRAMES / 24).repeat(2, 1, 1), FRAMES, 24.0))
    noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(3))
    sample = LTX2.noise_and_target(c, latents, timesteps=sigmas * 1000, noise=noise)
    with torch.no_grad():
        pred = LTX2.predict(c, sample, batch_of(texts, latents, audio))
        got_loss = LTX2.loss(c, pred, sample)

        # LTX2ImageToVideoPipeline.__call__ step 4 with image_crf=0 (training clips are
        # compressed already), then prepare_latents: the image's latents on frame 0
        images = torch.cat([pipe.video_processor.preprocess(pil(px[i, :, 0]), height=SIZE,
                                                            width=SIZE) for i in range(2)])
        init, mask = pipe.prepare_latents(images, 2, 128, SIZE, SIZE, FRAMES, 0.0,
                                          torch.float32, "cpu",
                                          torch.Generator().manual_seed(3))
        x = pipe._normalize_latents(pipe.vae.encode(px).latent_dist.mode(),
                                    pipe.vae.latents_mean, pipe.vae.latents_std,
                                    pipe.vae.config.scaling_factor)
        s = sigmas.view(-1, 1, 1)
        # frame 0 as prepare_latents leaves it (the image); the others noised at sigma
        hidden = mask[..., None] * init + (1 - mask[..., None]) * (
            (1 - s) * pipe._pack_latents(x) + s * pipe._pack_latents(noise))
        t = sigmas * 1000
        embeds, text_mask = pipe._get_gemma_prompt_embeds(PROMPTS, max_sequence_length=1024)
        video_text, audio_text, text_mask = pipe.connectors(embeds, text_mask,
                                                            padding_side="left")
        clean_audio = torch.stack(audio)
        audio_noise = torch.randn(clean_audio.shape,
                                  generator=torch.Generator().manual_seed(EVAL_AUDIO_SEED))
        video, audio_out = pipe.transformer(
            hidden_states=hidden, audio_hidden_states=(1 - s) * clean_audio + s * audio_noise,
            encoder_hidden_states=video_text, audio_encoder_hidden_states=audio_text,
            timestep=t.unsqueeze(-1) * (1 - mask), audio_timestep=t, sigma=t,
            encoder_attention_mask=text_mask, audio_encoder_attention_mask=text_mask,
            num_frames=2, height=2, width=2, fps=24.0, audio_num_frames=clean_audio.shape[1],
            use_cross_timestep=True, return_dict=False)
        want = pipe._unpack_latents(video, 2, 2, 2)
        # the pipeline steps noise_pred_video[:, :, 1:] only
        video_mse = ((want - (noise - x))[:, :, 1:] ** 2).reshape(2, -1).mean(1)
        audio_mse = ((audio_out - (audio_noise - clean_audio)) ** 2).reshape(2, -1).mean(1)
    assert mask.shape == (2, 8) and mask[:, :4].eq(1).all() and mask[:, 4:].eq(0).all()
    torch.testing.assert_close(pipe._pack_latents(x)[:, :4], init[:, :4], rtol=1e-4,
                               atol=1e-4)  # the causal VAE: the clip's frame 0 = the image
    torch.testing.assert_close(sample.noisy[:, :, 0], latents[:, :, 0])
    torch.testing.assert_close(pred, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_loss, (video_mse + audio_mse).mean(), rtol=1e-4,
                               atol=1e-5)
    text_to_video = dataclasses.replace(c, first_image=False)
    plain = LTX2.noise_and_target(text_to_video, latents, timesteps=sigmas * 1000,
                                  noise=noise)
    assert not torch.allclose(plain.noisy[:, :, 0], latents[:, :, 0])


def test_a_one_frame_item_trains_nothing_but_keeps_the_graph(loaded) -> None:
    latents = LTX2.encode_images(loaded, clip(1, 1)[:, :, 0])
    sample = LTX2.noise_and_target(loaded, latents, generator=torch.Generator().manual_seed(0))
    pred = torch.randn(latents.shape, requires_grad=True)
    loss = LTX2.loss(loaded, pred, sample)
    loss.backward()
    assert float(loss.detach()) == 0.0 and pred.grad is not None


def test_the_mode_is_an_ltx2_key_saved_shown_and_checked_for_ltx2_only(tmp_path: Path) -> None:
    from conftest import small_config

    from ui.form import family_tags, shown_for
    from ui.state import section_specs

    spec = next(s for s in section_specs("model") if s.name == "ltx2_mode")
    assert shown_for(family_tags(spec), "ltx2") and not shown_for(family_tags(spec), "wan")
    cfg = Config()
    apply_override(cfg, "model.family=ltx2")
    apply_override(cfg, f"model.ltx2_mode={I2V}")
    assert f'ltx2_mode = "{I2V}"' in dumps_config(cfg)
    assert LTX2.first_image.takes_first_image(cfg.model)
    assert not LTX2.first_image.takes_first_image(ModelConfig(family="ltx2"))
    cfg.model.family = "wan"
    (refused,) = [p for p in validate_config(cfg) if p.where == "model.ltx2_mode"]
    assert refused.level == "error" and "ltx2 key" in refused.message

    cfg = small_config(tmp_path, images=1, family="ltx2")
    cfg.model.ltx2_mode = I2V
    cfg.datasets[0].frames, cfg.datasets[0].fps = 1, 24.0
    (stills,) = LTX2.config_problems(cfg)
    assert stills.where == "datasets.0.frames" and stills.level == "error"
    assert "use 9 or more frames" in stills.message


def test_first_images_are_checked_and_named_for_text_to_video(tmp_path: Path,
                                                              tiny_workspace: Path) -> None:
    """One readable image per prompt in image_to_video; in text_to_video the key is
    ignored with a warning that says which setting would use it."""
    from PIL import Image

    from core.check import run_check

    cfg = clip_config(tmp_path)
    first = tmp_path / "first.png"
    Image.new("RGB", (64, 64), (20, 200, 40)).save(first)
    cfg.validation.control_images = [str(first)]

    def said() -> list[tuple[str, str]]:
        return [(p.level, p.message) for p in run_check(cfg, tiny_workspace, estimate=False)
                .problems if p.where == "validation.control_images"]

    ((level, message),) = said()
    assert level == "warning" and 'set model.ltx2_mode = "image_to_video"' in message
    cfg.model.ltx2_mode = I2V
    assert said() == []
    cfg.validation.control_images = [str(tmp_path / "missing.png")]
    ((level, message),) = said()
    assert level == "error" and "missing.png does not exist" in message


def test_validation_samples_what_the_pipeline_samples_from_the_first_image(
        folder: Path, loaded) -> None:
    """From the cached text and the prompt's first image (first_image.validation_kwargs),
    the frames and sound of LTX2ImageToVideoPipeline from the prompt; without an image,
    the fixed synthetic one, which gives another video."""
    from diffusers import LTX2ImageToVideoPipeline
    from PIL import Image

    image = Image.new("RGB", (SIZE, SIZE), (250, 10, 10))
    common = {"height": SIZE, "width": SIZE, "num_frames": FRAMES, "num_inference_steps": 2}
    pipe = LTX2ImageToVideoPipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    want = pipe(image=image, prompt=PROMPTS[0], generator=torch.Generator().manual_seed(0),
                output_type="np", **common)
    prompt, negative = LTX2.encode_prompts(loaded, [PROMPTS[0], ""])
    texts = {"prompt_embeds": prompt["prompt_embeds"][None],
             "prompt_attention_mask": prompt["prompt_mask"][None],
             "negative_prompt_embeds": negative["prompt_embeds"][None],
             "negative_prompt_attention_mask": negative["prompt_mask"][None]}
    validation = LTX2.validation_pipeline(loaded)
    assert isinstance(validation, LTX2ImageToVideoPipeline)

    def sample(**given):
        return validation(**texts, **common, generator=torch.Generator().manual_seed(0),
                          **given)

    out = sample(**LTX2.first_image.validation_kwargs([image], SIZE))
    got = np.stack([np.asarray(f, dtype=np.float32) for f in out.frames[0]])
    assert np.abs(got - (want.frames[0] * 255).round()).max() <= 1
    torch.testing.assert_close(out.audio, want.audio.float(), atol=1e-4, rtol=1e-4)
    synthetic = np.stack([np.asarray(f, dtype=np.float32) for f in sample().frames[0]])
    assert np.abs(synthetic - got).max() > 1.0


def test_a_short_run_trains_and_validates_a_video_with_sound(tmp_path: Path,
                                                             tiny_workspace: Path) -> None:
    import av
    from conftest import check_in_process, train_in_process
    from PIL import Image
    from test_family_wan_i2v import first_frames_differ, two_first_images

    from core.config import save_config

    cfg = clip_config(tmp_path)
    cfg.model.ltx2_mode = I2V
    first = tmp_path / "first.png"
    Image.new("RGB", (64, 64), (20, 200, 40)).save(first)
    two_first_images(cfg, first)  # the same prompt and seed from each
    cfg.validation.before_training = True  # a grid: first image | before | after
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"), "--workspace",
                            str(tiny_workspace))
    assert done.returncode == 0 and "control_images" not in done.stdout, done.stdout
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    run = Path(cfg.output.dir)
    assert (run / "lora/pytorch_lora_weights.safetensors").is_file()
    with av.open(str(run / "validation/step_000002/00.mp4")) as container:
        assert container.streams.video[0].frames == FRAMES
        assert [s.codec_context.name for s in container.streams.audio] == ["aac"]
    assert first_frames_differ(run / "validation/step_000002"), "the first image is used"
    with Image.open(run / "validation/grid.png") as grid:
        pixels = np.asarray(grid.convert("RGB"))
    assert (pixels == (20, 200, 40)).all(-1).any(), "the grid shows the first image"
