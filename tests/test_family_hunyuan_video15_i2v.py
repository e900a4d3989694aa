"""HunyuanVideo 1.5 image-to-video on its tiny random model (tiny:hunyuan_video15_i2v, CPU):
the training prediction against HunyuanVideo15ImageToVideoPipeline's own conditioning of
the first frame (its prepare_cond_latents_and_mask and encode_image), the condition cached
beside the latents, an entry without it refused with its fix, validation from the fixed
first image, and a run from clips to a LoRA and a video."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import check_in_process, small_config, train_in_process
from test_family_wan import clip
from test_family_wan_i2v import first_frames_differ, two_first_images

from core.config import save_config
from core.data.collate import collate
from core.models.registry import get_family
from core.models.tiny import build_tiny_folder

HV = get_family("hunyuan_video15")
PROMPTS = ["a red circle moving left", "a blue square"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-hunyuan_video15_i2v")
    build_tiny_folder("hunyuan_video15_i2v", out, seed=0)
    return out


@pytest.fixture(scope="module")
def loaded(folder: Path):
    return HV.load(str(folder))


def eight_bit(px: torch.Tensor) -> torch.Tensor:
    """Pixels as a dataset gives them: 8-bit values mapped to [-1, 1]."""
    return ((px + 1) * 127.5).round().clamp(0, 255) / 127.5 - 1


def pil(frame: torch.Tensor):
    from PIL import Image

    array = ((frame + 1) * 127.5).round().byte().permute(1, 2, 0).numpy()
    return Image.fromarray(np.ascontiguousarray(array))


def items_of(texts: list[dict], encoded: dict) -> dict:
    return collate([{**t, **{k: v[i] for k, v in encoded.items()}, "path": f"{i}.mp4",
                     "caption": ""} for i, t in enumerate(texts)])


@torch.no_grad()
def reference(folder: Path, px: torch.Tensor, sigmas: torch.Tensor, noise: torch.Tensor,
              latents: torch.Tensor) -> torch.Tensor:
    """The prediction as HunyuanVideo15ImageToVideoPipeline builds its transformer call
    for each clip's first frame (a PIL image at the clip's size): the condition and mask
    from prepare_cond_latents_and_mask, image_embeds from encode_image."""
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    pipe = HunyuanVideo15ImageToVideoPipeline.from_pretrained(str(folder), local_files_only=True)
    embeds, mask, glyph, glyph_mask = pipe.encode_prompt(PROMPTS, device="cpu",
                                                         batch_size=len(PROMPTS))
    s = sigmas.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * latents + s * noise
    out = []
    for i in range(len(PROMPTS)):
        image = pil(px[i, :, 0])
        cond, cond_mask = pipe.prepare_cond_latents_and_mask(
            noisy[i:i + 1], image, 1, px.shape[-2], px.shape[-1], noisy.dtype, "cpu")
        image_embeds = pipe.encode_image(image, 1, "cpu", noisy.dtype)
        out.append(pipe.transformer(
            hidden_states=torch.cat([noisy[i:i + 1], cond, cond_mask], dim=1),
            image_embeds=image_embeds, timestep=(sigmas[i:i + 1] * 1000).to(noisy.dtype),
            encoder_hidden_states=embeds[i:i + 1], encoder_attention_mask=mask[i:i + 1],
            encoder_hidden_states_2=glyph[i:i + 1], encoder_attention_mask_2=glyph_mask[i:i + 1],
            return_dict=False)[0])
    return torch.cat(out)


def test_the_prediction_matches_the_image_to_video_pipelines_conditioning(folder: Path,
                                                                         loaded) -> None:
    from core.models.families.hunyuan_video15.i2v import CONDITION, IMAGE_EMBEDS, is_i2v

    assert is_i2v(loaded)
    px, sigmas = eight_bit(clip(2, 5)), torch.tensor([0.3, 0.9])
    encoded = HV.encode_images(loaded, px)
    assert encoded["latents"].shape == (2, 32, 2, 4, 4)
    assert encoded[CONDITION].shape == (2, 32, 1, 4, 4)
    assert encoded[IMAGE_EMBEDS].shape == (2, 16, 16)  # the tiny SigLIP's 4 x 4 patches
    noise = torch.randn(encoded["latents"].shape, generator=torch.Generator().manual_seed(3))
    sample = HV.noise_and_target(loaded, encoded["latents"], timesteps=sigmas * 1000,
                                 noise=noise)
    with torch.no_grad():
        pred = HV.predict(loaded, sample, items_of(HV.encode_prompts(loaded, PROMPTS), encoded))
    want = reference(folder, px, sigmas, noise, encoded["latents"])
    torch.testing.assert_close(pred, want, rtol=1e-4, atol=1e-4)


def test_an_entry_without_the_condition_is_refused_naming_the_fix(loaded) -> None:
    latents = HV.encode_images(loaded, clip(1, 5))["latents"]
    sample = HV.noise_and_target(loaded, latents, generator=torch.Generator().manual_seed(0))
    batch = collate([{**HV.encode_prompts(loaded, PROMPTS[:1])[0], "latents": latents[0],
                      "path": "a.mp4", "caption": ""}])
    with pytest.raises(ValueError, match="delete it to rebuild"):
        HV.predict(loaded, sample, batch)


def test_validation_starts_from_the_prompts_first_image_or_a_fixed_one(loaded) -> None:
    """validation.control_images reaches the pipeline as `image` (the family's
    first_image.validation_kwargs); without it the fixed synthetic image is the start."""
    from PIL import Image

    from core.config.schema import ModelConfig

    assert HV.first_image.takes_first_image(ModelConfig(path="tiny:hunyuan_video15_i2v"))
    assert not HV.first_image.takes_first_image(ModelConfig(path="tiny:hunyuan_video15"))
    texts = HV.encode_prompts(loaded, [PROMPTS[0], ""])

    def frames(**image) -> np.ndarray:
        out = HV.validation_pipeline(loaded)(
            prompt_embeds=texts[0]["prompt_embeds"][None],
            negative_prompt_embeds=texts[1]["prompt_embeds"][None], height=64, width=64,
            num_frames=5, num_inference_steps=2, guidance_scale=4.0,
            generator=torch.Generator().manual_seed(0), **image)
        assert len(out.frames[0]) == 5 and out.images[0].size == (64, 64)
        return np.stack([np.asarray(f, dtype=np.float32) for f in out.frames[0]])

    given = HV.first_image.validation_kwargs([Image.new("RGB", (64, 64), (250, 10, 10))], 64)
    assert np.abs(frames(**given) - frames()).max() > 1.0


def test_a_run_caches_the_condition_and_trains_to_a_lora_and_a_video(
        tmp_path: Path, tiny_workspace: Path) -> None:
    from PIL import Image
    from safetensors import safe_open

    from core.data.video import probe_clip, write_synthetic_clip

    cfg = small_config(tmp_path, images=1, family="hunyuan_video15")
    cfg.model.path = "tiny:hunyuan_video15_i2v"
    clips = tmp_path / "clips"
    clips.mkdir()
    for name, color in (("a", "red"), ("b", "blue")):
        made = write_synthetic_clip(clips / f"{name}.mp4", color=color, direction="left",
                                    frames=9, fps=16)
        (clips / f"{name}.txt").write_text(f"a {made.color} {made.shape} moving left")
    ds = cfg.datasets[0]
    ds.images, ds.frames, ds.fps = str(clips), 5, 16.0  # the clips' own rate
    cfg.train.max_steps = cfg.train.eval_every = cfg.validation.every = 2
    cfg.validation.prompts, cfg.validation.frames, cfg.validation.steps = ["a red square"], 5, 2
    first = tmp_path / "first.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(first)
    two_first_images(cfg, first)  # the same prompt and seed from each
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"))
    assert done.returncode == 0 and "control_images" not in done.stdout, done.stdout
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    with safe_open(str(Path(ds.vae_cache) / "a.mp4.safetensors"), "pt") as fh:
        assert set(fh.keys()) >= {"latents", "hv15_first_frame_latents", "hv15_image_embeds"}
    run = Path(cfg.output.dir)
    assert (run / "lora/pytorch_lora_weights.safetensors").is_file()
    assert probe_clip(run / "validation/step_000002/00.mp4").frames == 5
    assert first_frames_differ(run / "validation/step_000002"), "the first image is used"
