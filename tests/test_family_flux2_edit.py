"""FLUX.2 multi-reference edits (issue 52 item 5) on the tiny klein: the training
prediction with 1 and 2 references is the one Flux2KleinPipeline's denoising loop makes
(each reference encoded by its `prepare_image_latents`, packed and joined after the
target's tokens with ids t = 10, 20, the output cut back to the target's tokens);
validation draws with the references as the pipeline's `image`; a run on pairs with two
control folders caches both references and trains; references are optional (a flux2
dataset without control folders checks and trains text-to-image) and a validation entry
with more images than the family takes is refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import small_config
from test_edit_pairs import check, paired_config, second_control, train_pairs
from test_models_flow import batch_text, pixels

from core.models.capabilities import control_latents
from core.models.registry import get_family
from core.models.tiny import resolve_model_path

FLUX2 = get_family("flux2")
PROMPTS = ["make it blue", "put the circle beside the square"]


@pytest.fixture(scope="module")
def folder(tiny_workspace: Path) -> Path:
    return Path(resolve_model_path("tiny:flux2", tiny_workspace))


def _pipeline_prediction(pipe, sample, embeds, refs: list[torch.Tensor]) -> torch.Tensor:
    """Flux2KleinPipeline.__call__'s transformer input, per batch item (the pipeline
    repeats one set of references over its batch): its prepare_latents' ids, its
    prepare_image_latents of the item's references, torch.cat of both, the transformer,
    `noise_pred[:, :latents.size(1)]`, `_unpack_latents_with_ids`."""
    out = []
    for i in range(sample.noisy.shape[0]):
        latents, latent_ids = pipe.prepare_latents(
            1, 8, 64, 64, torch.float32, "cpu", None, latents=sample.noisy[i:i + 1])
        image_latents, image_ids = pipe.prepare_image_latents(
            [r[i:i + 1] for r in refs], 1, None, "cpu", torch.float32)
        assert sorted(image_ids[0, :, 0].unique().tolist()) == [10 * (k + 1)
                                                               for k in range(len(refs))]
        assert latent_ids[0, :, 0].eq(0).all()
        text_ids = pipe._prepare_text_ids(embeds[i:i + 1])
        noise_pred = pipe.transformer(
            hidden_states=torch.cat([latents, image_latents], dim=1),
            timestep=sample.timesteps[i:i + 1] / 1000, guidance=None,
            encoder_hidden_states=embeds[i:i + 1], txt_ids=text_ids,
            img_ids=torch.cat([latent_ids, image_ids], dim=1), return_dict=False)[0]
        noise_pred = noise_pred[:, :latents.size(1)]
        out.append(pipe._unpack_latents_with_ids(noise_pred, latent_ids, 4, 4))
    return torch.cat(out)


def _batch(c, refs: list[torch.Tensor]) -> dict:
    batch = batch_text(FLUX2.encode_prompts(c, PROMPTS))
    batch["control_latents"] = list(control_latents(FLUX2, c, refs)["control_latents"])
    return batch


@pytest.mark.parametrize("count", [1, 2])
def test_prediction_is_the_pipeline_loop_written_out(folder: Path, count: int) -> None:
    from diffusers import Flux2KleinPipeline

    c = FLUX2.load(str(folder))
    pipe = Flux2KleinPipeline.from_pretrained(str(folder), local_files_only=True)
    refs = [pixels(2, seed=2 + k) for k in range(count)]
    sample = FLUX2.noise_and_target(c, FLUX2.encode_images(c, pixels(2, seed=1)),
                                    generator=torch.Generator().manual_seed(0))
    batch = _batch(c, refs)
    assert batch["control_latents"][0].shape == (count, 32, 4, 4)
    with torch.no_grad():
        got = FLUX2.predict(c, sample, batch)
        want = _pipeline_prediction(pipe, sample, batch["prompt_embeds"], refs)
        plain = FLUX2.predict(c, sample, {"prompt_embeds": batch["prompt_embeds"]})
        # The last reference is read too: another one changes the prediction.
        other = FLUX2.predict(c, sample, _batch(c, [*refs[:-1], pixels(2, seed=9)]))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert (got - plain).abs().max() > 1e-3, "the references are read, not ignored"
    assert (other - got).abs().max() > 1e-3


def test_validation_draws_with_the_references(folder: Path) -> None:
    """validation_kwargs hands the pipeline each prompt's images at the validation area;
    with them the draw differs from the prompt alone; an empty entry draws from text."""
    from PIL import Image

    c = FLUX2.load(str(folder))
    images = [Image.new("RGB", (96, 64), (200, 30, 30)), Image.new("RGB", (64, 64), "blue")]
    kwargs = FLUX2.edit.validation_kwargs(images, 64)
    # 96x64 at 64x64's area would be 64x48, below the pipeline's 64-pixel side: grown.
    assert [im.size for im in kwargs["image"]] == [(96, 64), (64, 64)]
    assert [im.size for im in FLUX2.edit.validation_kwargs(images, 128)["image"]] == [
        (144, 96), (128, 128)]
    assert FLUX2.edit.validation_kwargs([], 64) == {}
    # Beyond the pipeline's 8:1, centre-cropped to 8:1.
    strips = [Image.new("RGB", (1000, 50)), Image.new("RGB", (30, 1000))]
    assert [im.size for im in FLUX2.edit.validation_kwargs(strips, 64)["image"]] == [
        (512, 64), (64, 512)]
    assert FLUX2.edit.validation_kwargs(strips, 1024)["image"][0].size == (2816, 352)
    pipe = FLUX2.validation_pipeline(c)

    def draw(**extra) -> torch.Tensor:
        out = pipe(prompt=PROMPTS[0], num_inference_steps=2, height=64, width=64,
                   output_type="np", generator=torch.Generator().manual_seed(0), **extra)
        return torch.from_numpy(out.images[0])

    with torch.no_grad():
        plain, one, two = draw(), draw(image=kwargs["image"][:1]), draw(**kwargs)
    assert one.shape == (64, 64, 3)
    assert (one - plain).abs().max() > 1e-3 and (two - one).abs().max() > 1e-3


def test_a_run_on_pairs_with_two_references_trains(tmp_path: Path,
                                                   tiny_workspace: Path) -> None:
    from PIL import Image
    from safetensors import safe_open

    cfg = paired_config(tmp_path, "flux2")
    cfg.validation.prompts = ["make it red", "a circle"]
    cfg.validation.control_images.append("")  # the second prompt: from its text alone
    second_control(cfg, tmp_path)
    cache = train_pairs(cfg, tmp_path, tiny_workspace)
    with safe_open(str(cache / "img_000.png.safetensors"), "pt") as fh:
        assert fh.get_slice("control_latents").get_shape() == [2, 32, 4, 4]
        assert fh.metadata()["control1_source"].endswith("control_2/img_000.jpg")
    run = Path(cfg.output.dir)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["type"] == "step"]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    for name in ("00.png", "01.png"):  # with references, and from the prompt alone
        assert Image.open(run / "validation/step_000002" / name).size == (64, 64)
    assert (run / "validation/grid.png").is_file()


def test_references_are_optional_and_at_most_three(tmp_path: Path) -> None:
    """A flux2 dataset without control folders checks as text-to-image (no error on the
    empty control, validation without control images); a validation entry naming four
    images is refused, naming the key; control_2 without control is refused."""
    cfg = small_config(tmp_path, images=4, family="flux2")
    cfg.validation.prompts = ["a red circle"]
    assert not cfg.datasets[0].control and not cfg.validation.control_images
    done = check(cfg, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "control" not in done.stdout
    cfg.validation.control_images = [""]  # one prompt drawn from its text alone
    done = check(cfg, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    image = str(tmp_path / "data0" / "img_000.png")
    cfg.validation.control_images = ["|".join([image] * 4)]
    cfg.datasets[0].control_2 = str(tmp_path / "data0")
    done = check(cfg, tmp_path)
    assert done.returncode == 2
    assert ("error: validation.control_images: entry 1 names 4 images, but flux2 takes 3 "
            "per prompt") in done.stdout
    assert "error: datasets.0.control_2: is set but datasets.0.control is empty" in done.stdout
