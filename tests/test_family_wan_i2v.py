"""Wan image-to-video on tiny:wan_i2v (CPU, seconds each): the folder loads as
WanImageToVideoPipeline with its image encoder; the training prediction is the
transformer's output conditioned exactly as the pipeline conditions sampling (its own
prepare_latents and encode_image); a saved LoRA reloads in WanImageToVideoPipeline and
changes its output; a short run on clips caches the condition beside the latents, trains,
and validates from the synthetic first frame."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import train_in_process
from test_family_wan import two_clip_config

from core.config import save_config
from core.data.collate import collate
from core.models.families.wan.family import FAMILY as WAN
from core.models.families.wan.i2v import CONDITION, IMAGE_EMBEDS, WanI2VComponents
from core.models.tiny import resolve_model_path, tiny_family

SIZE, FRAMES = 32, 5


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="module")
def folder(workspace: Path) -> Path:
    return Path(resolve_model_path("tiny:wan_i2v", workspace))


def reference_pipeline(folder: Path):
    from diffusers import WanImageToVideoPipeline

    pipe = WanImageToVideoPipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def clip_pixels(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A 5-frame clip [1, 3, 5, H, W] in [-1, 1] from 8-bit values (as the cache loads
    frames), and its first frame as uint8 [H, W, 3]."""
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (1, 3, FRAMES, SIZE, SIZE), generator=g, dtype=torch.uint8)
    return frames.float() / 127.5 - 1.0, frames[0, :, 0].permute(1, 2, 0).contiguous()


def cached_batch(c, pixels: torch.Tensor, text: dict) -> dict:
    """What the cache stores (encode_images' dict, one entry per item) and collate
    makes of it."""
    encoded = WAN.encode_images(c, pixels)
    items = [{**text, **{k: v[i] for k, v in encoded.items()}, "path": f"{i}.mp4",
              "caption": ""} for i in range(pixels.shape[0])]
    return collate(items)


def test_tiny_wan_i2v_loads_as_an_image_to_video_model(folder: Path) -> None:
    import json

    assert tiny_family("wan_i2v") == "wan"
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == (
        "WanImageToVideoPipeline")
    c = WAN.load(str(folder))
    assert isinstance(c, WanI2VComponents) and c.image_encoder is not None
    assert c.denoiser.config.in_channels == 36
    assert c.denoiser.config.image_dim == c.image_encoder.config.hidden_size
    assert not any(p.requires_grad for p in c.image_encoder.parameters())
    t2v = WAN.load(str(resolve_model_path("tiny:wan", folder.parent.parent)))
    assert not isinstance(t2v, WanI2VComponents)
    assert isinstance(WAN.encode_images(t2v, clip_pixels()[0]), torch.Tensor)
    # model_index.json names the pipeline: every cache of another Wan model is stale
    assert c.fingerprint != t2v.fingerprint


def test_the_training_prediction_is_the_pipelines_conditioning(folder: Path) -> None:
    from PIL import Image

    c = WAN.load(str(folder))
    pixels, first = clip_pixels()
    text = WAN.encode_prompts(c, ["a red square"])[0]
    batch = cached_batch(c, pixels, text)
    assert batch["latents"].shape == (1, 16, 2, SIZE // 8, SIZE // 8)
    sample = WAN.noise_and_target(c, batch["latents"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = WAN.predict(c, sample, batch)

    pipe = reference_pipeline(folder)
    image = Image.fromarray(first.numpy())
    with torch.no_grad():
        embeds = pipe.encode_image(image, torch.device("cpu"))  # CLIP hidden_states[-2]
        video = pipe.video_processor.preprocess(image, height=SIZE, width=SIZE)
        noisy, condition = pipe.prepare_latents(  # [mask, latents of [frame 0, zeros]]
            video, 1, 16, SIZE, SIZE, FRAMES, torch.float32, torch.device("cpu"),
            latents=sample.noisy)
        assert condition.shape == (1, 20, 2, SIZE // 8, SIZE // 8)
        assert (condition[:, :4, 0] == 1).all() and (condition[:, :4, 1:] == 0).all()
        want = pipe.transformer(hidden_states=torch.cat([noisy, condition], dim=1),
                                timestep=sample.timesteps,
                                encoder_hidden_states=text["prompt_embeds"][None],
                                encoder_hidden_states_image=embeds, return_dict=False)[0]
    torch.testing.assert_close(batch[CONDITION][0][None], condition[:, 4:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch[IMAGE_EMBEDS][0][None], embeds, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_an_image_item_is_conditioned_on_itself(folder: Path) -> None:
    """A still image ([B, 3, H, W], one frame): its condition is its own latents."""
    c = WAN.load(str(folder))
    pixels = clip_pixels()[0][:, :, 0]
    encoded = WAN.encode_images(c, pixels)
    assert encoded["latents"].shape == (1, 16, 1, SIZE // 8, SIZE // 8)
    torch.testing.assert_close(encoded[CONDITION], encoded["latents"])


def test_a_cache_without_the_condition_is_refused_with_the_fix(folder: Path) -> None:
    c = WAN.load(str(folder))
    text = WAN.encode_prompts(c, [""])[0]
    latents = WAN.encode_images(c, clip_pixels()[0])["latents"]
    batch = collate([{**text, "latents": latents[0], "path": "a.mp4", "caption": ""}])
    sample = WAN.noise_and_target(c, batch["latents"])
    with pytest.raises(ValueError, match="built without the image condition; delete it"):
        WAN.predict(c, sample, batch)


def generate(pipe, embeds: torch.Tensor) -> torch.Tensor:
    from core.models.video_pipeline import synthetic_image

    out = pipe(image=synthetic_image(SIZE, SIZE), prompt_embeds=embeds,
               negative_prompt_embeds=torch.zeros_like(embeds), num_inference_steps=2,
               height=SIZE, width=SIZE, num_frames=FRAMES, output_type="pt",
               generator=torch.Generator().manual_seed(0))
    return out.frames


def test_a_saved_lora_reloads_in_the_i2v_pipeline_and_changes_it(folder: Path,
                                                                 tmp_path: Path) -> None:
    from peft import LoraConfig

    c = WAN.load(str(folder))
    c.denoiser.add_adapter(LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian",
                                      target_modules=WAN.lora_target_modules()))
    with torch.no_grad():
        for name, param in c.denoiser.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    files = WAN.save_lora(c, tmp_path / "lora")
    embeds = WAN.encode_prompts(c, ["a red circle"])[0]["prompt_embeds"][None]
    pipe = reference_pipeline(folder)
    with torch.no_grad():
        base = generate(pipe, embeds)
        pipe.load_lora_weights(str(files["diffusers"].parent))
        loaded = generate(pipe, embeds)
        pipe.unload_lora_weights()
        pipe.load_lora_weights(str(files["comfyui"]))
        comfy = generate(pipe, embeds)
    assert (loaded - base).abs().max() > 1e-3
    torch.testing.assert_close(comfy, loaded, atol=1e-4, rtol=1e-4)


def first_image(tmp_path: Path) -> Path:
    from PIL import Image

    path = tmp_path / "first.png"
    Image.new("RGB", (48, 32), (20, 200, 40)).save(path)
    return path


def test_validation_control_images_give_an_i2v_model_its_first_frames(
        tmp_path: Path, workspace: Path) -> None:
    """Checked before launch: one readable image per prompt for an image-to-video model;
    ignored, with a warning, for a text-to-video one."""
    from core.check import run_check
    from core.config import Config
    from core.config.schema import ModelConfig
    from core.train.validation import control_images

    cfg = two_clip_config(tmp_path, "tiny:wan_i2v", FRAMES)
    cfg.validation.control_images = [str(first_image(tmp_path))]

    def said(cfg: Config) -> list[tuple[str, str]]:
        return [(p.level, p.message) for p in run_check(cfg, workspace, estimate=False)
                .problems if p.where == "validation.control_images"]

    assert said(cfg) == []
    (loaded,) = control_images(WAN, cfg.validation, first_image=True)
    assert loaded[0].getpixel((0, 0)) == (20, 200, 40)
    cfg.validation.control_images = [str(tmp_path / "missing.png")]
    ((level, message),) = said(cfg)
    assert level == "error" and "missing.png does not exist" in message
    cfg.validation.control_images = []
    assert said(cfg) == [], "without one the model starts from a synthetic image"
    cfg.validation.control_images = [str(first_image(tmp_path))] * 2
    ((level, message),) = said(cfg)
    assert level == "error" and "one first image per prompt" in message
    cfg.model.path = "tiny:wan"
    cfg.validation.control_images = [str(first_image(tmp_path))]
    ((level, message),) = said(cfg)
    assert level == "warning" and "is ignored: tiny:wan is a text-to-video model" in message
    folder = workspace / "models/tiny-wan_i2v"
    assert WAN.first_image.takes_first_image(ModelConfig(path=str(folder))) or \
        not folder.exists(), "a materialized folder says so too"


def two_first_images(cfg, first: Path) -> None:
    """An image-to-video run's validation: its prompt twice at one seed, the first from
    `first`, the second from `first` with its colours inverted (written beside it), so
    only the first image differs between validation's 00 and 01."""
    from PIL import Image, ImageOps

    other = first.with_name(f"{first.stem}-inverted.png")
    ImageOps.invert(Image.open(first).convert("RGB")).save(other)
    cfg.validation.prompts = [f"{cfg.validation.prompts[0]} --d 7"] * 2
    cfg.validation.control_images = [str(first), str(other)]


def first_frames_differ(round_folder: Path) -> bool:
    """Whether a validation round's 00.png and 01.png (each video's first frame)
    differ: after two_first_images, whether the first images reached the pipeline."""
    import numpy as np
    from PIL import Image

    a, b = (np.asarray(Image.open(round_folder / f"{i:02d}.png").convert("RGB"),
                       dtype=np.int16) for i in range(2))
    return int(np.abs(a - b).max()) > 2


def test_a_short_run_on_clips_caches_the_condition_trains_and_validates(
        tmp_path: Path, workspace: Path) -> None:
    import numpy as np
    from PIL import Image
    from safetensors import safe_open

    cfg = two_clip_config(tmp_path, "tiny:wan_i2v", FRAMES)
    two_first_images(cfg, first_image(tmp_path))  # the same prompt and seed from each
    cfg.validation.before_training = True  # a grid: before beside after
    ds = cfg.datasets[0]
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", workspace) == 0
    with safe_open(str(Path(ds.vae_cache) / "a.mp4.safetensors"), "pt") as fh:
        shapes = {k: fh.get_slice(k).get_shape() for k in fh.keys()}  # noqa: SIM118
    latent = [16, 2, ds.resolution // 8, ds.resolution // 8]
    assert shapes == {"latents": latent, CONDITION: latent, IMAGE_EMBEDS: [17, 32]}
    run = Path(cfg.output.dir)
    assert (run / "lora/pytorch_lora_weights.safetensors").is_file()
    assert (run / "validation/step_000002/00.mp4").is_file()
    assert first_frames_differ(run / "validation/step_000002"), "the first image is used"
    with Image.open(run / "validation/grid.png") as grid:  # first image | before | after
        pixels = np.asarray(grid.convert("RGB"))
    assert (pixels == (20, 200, 40)).all(-1).any(), "the grid shows the first image"


def test_wan22_i2v_two_experts_take_the_condition_without_image_embeds(
        tmp_path: Path) -> None:
    """A Wan 2.2 I2V A14B-shaped folder (two 36-channel experts, no image encoder): each
    sample through its timestep's expert on [noisy, mask, condition], as the pipeline
    denoises; validation samples from the synthetic first frame."""
    from PIL import Image

    from core.models.families.wan.experts import WanExperts
    from core.models.families.wan.tiny import build_pipeline

    build_pipeline(tmp_path / "wan22_i2v", 0, second_seed=3, boundary_ratio=0.9, i2v=True)
    c = WAN.load(str(tmp_path / "wan22_i2v"))
    assert isinstance(c, WanI2VComponents) and isinstance(c.denoiser, WanExperts)
    assert c.image_encoder is None
    pixels, first = clip_pixels()
    pixels = pixels.repeat(2, 1, 1, 1, 1)
    text = WAN.encode_prompts(c, ["a red square"])[0]
    batch = cached_batch(c, pixels, text)
    assert IMAGE_EMBEDS not in batch
    sample = WAN.noise_and_target(c, batch["latents"], timesteps=torch.tensor([950, 100]))
    with torch.no_grad():
        got = WAN.predict(c, sample, batch)
    pipe = reference_pipeline(tmp_path / "wan22_i2v")
    video = pipe.video_processor.preprocess(Image.fromarray(first.numpy()), height=SIZE,
                                            width=SIZE)  # one image, repeated per sample
    with torch.no_grad():
        noisy, condition = pipe.prepare_latents(video, 2, 16, SIZE, SIZE, FRAMES, torch.float32,
                                                torch.device("cpu"), latents=sample.noisy)
        hidden = torch.cat([noisy, condition], dim=1)
        want = torch.cat([expert(hidden_states=hidden[i:i + 1], timestep=sample.timesteps[i:i + 1],
                                 encoder_hidden_states=text["prompt_embeds"][None],
                                 return_dict=False)[0]
                          for i, expert in enumerate((pipe.transformer, pipe.transformer_2))])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    embeds = text["prompt_embeds"][None]
    out = WAN.validation_pipeline(c)(prompt_embeds=embeds,
                                     negative_prompt_embeds=torch.zeros_like(embeds),
                                     num_inference_steps=2, height=SIZE, width=SIZE,
                                     num_frames=FRAMES)
    assert len(out.frames[0]) == FRAMES and out.images[0].size == (SIZE, SIZE)
