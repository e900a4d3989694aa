"""Loss masks (datasets.N.masks): matched by stem, cached at latent resolution beside the
latents with the image's own crop, invalidated with the mask file, applied to the loss."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import small_config, train_in_process

from core.cache.dataset import cached_datasets
from core.cache.stage import build_caches
from core.data.collate import collate
from core.models.base import NoiseSample


def _image(path: Path, size: tuple[int, int]) -> None:
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    path.with_suffix(".txt").write_text("a picture", encoding="utf-8")


def _mask(path: Path, size: tuple[int, int], white_x: tuple[int, int]) -> None:
    """Black, with white columns white_x[0] <= x < white_x[1]."""
    from PIL import Image, ImageDraw

    path.parent.mkdir(parents=True, exist_ok=True)
    mask = Image.new("L", size, 0)
    if white_x[1] > white_x[0]:
        ImageDraw.Draw(mask).rectangle((white_x[0], 0, white_x[1] - 1, size[1]), fill=255)
    mask.save(path)


def _config(tmp: Path):
    """One 128x64 image, centre-cropped to a 64x64 bucket: pixels 32..95 are kept."""
    cfg = small_config(tmp, images=1)
    for p in (tmp / "data0").iterdir():
        p.unlink()
    _image(tmp / "data0/wide.png", (128, 64))
    cfg.datasets[0].bucketing = False
    cfg.datasets[0].masks = str(tmp / "masks")
    return cfg


def _loaded(cfg, family, comps):
    report = build_caches(cfg, family, comps)
    return report, cached_datasets(cfg, report.plan)[0]


def test_mask_follows_the_images_crop_and_zeroes_the_right_halfs_gradient(tmp_path: Path,
                                                                          tiny_sd15):
    import torch

    family, comps = tiny_sd15
    cfg = _config(tmp_path)
    # White on x in [32, 64) of the original: after the centre crop (x 32..95) exactly the
    # left half of the 64 px bucket, so latent columns 0-3 of 8.
    _mask(tmp_path / "masks/wide.jpg", (128, 64), (32, 64))
    report, dataset = _loaded(cfg, family, comps)
    assert report.masks.written == 1 and report.stale_masks == 1
    item = dataset.load(0)
    mask = item["loss_mask"]
    assert mask.shape == (1, *item["latents"].shape[-2:]) == (1, 8, 8)
    expected = torch.zeros(1, 8, 8)
    expected[..., :4] = 1.0
    assert torch.allclose(mask, expected, atol=0.02), mask

    batch = collate([item])
    target = torch.randn_like(batch["latents"])
    prediction = torch.zeros_like(target, requires_grad=True)
    sample = NoiseSample(noisy=target, timesteps=torch.tensor([10]), target=target,
                         mask=batch["loss_mask"])
    loss = family.loss(comps, prediction, sample)
    loss.backward()
    assert torch.all(prediction.grad[..., 4:] == 0)  # the ignored half teaches nothing
    assert torch.all(prediction.grad[..., :4] != 0)
    # normalised by the mask's area: the mean over the learned half only
    assert loss.item() == pytest.approx((target[..., :4] ** 2).mean().item(), rel=1e-4)


def test_all_black_mask_gives_loss_zero_not_nan(tiny_sd15):
    import torch

    family, comps = tiny_sd15
    target = torch.randn(2, 4, 8, 8)
    prediction = torch.zeros_like(target, requires_grad=True)
    mask = torch.zeros(2, 1, 8, 8)
    mask[1] = 1.0  # the second item learns everything
    sample = NoiseSample(noisy=target, timesteps=torch.tensor([10, 20]), target=target,
                         mask=mask)
    loss = family.loss(comps, prediction, sample)
    loss.backward()
    assert torch.isfinite(prediction.grad).all()
    assert torch.all(prediction.grad[0] == 0)
    assert loss.item() == pytest.approx((target[1] ** 2).mean().item() / 2, rel=1e-5)
    black = NoiseSample(noisy=target, timesteps=torch.tensor([10, 20]), target=target,
                        mask=torch.zeros(2, 1, 8, 8))
    assert family.loss(comps, prediction, black).item() == 0.0


@pytest.mark.parametrize("name, frames", [("flux", None), ("wan", 3)])
def test_flow_family_loss_learns_the_white_half_only(name: str, frames: int | None,
                                                     tiny_workspace: Path):
    """The flow objective (core/models/flow.py) applies the mask as sd15's does, with the
    family's own sample and loss weights; a video's one mask weighs every frame."""
    import torch

    from core.models.objectives import FlowTraining
    from core.models.registry import get_family
    from core.models.tiny import materialize_tiny

    family = get_family(name)
    comps = family.load(str(materialize_tiny(name, tiny_workspace)))
    comps.flow = FlowTraining(loss_weighting="sigma_sqrt")  # weights and mask together
    channels = comps.vae.config.get("latent_channels") or comps.vae.config.z_dim
    shape = (2, channels, *(() if frames is None else (frames,)), 8, 8)
    latents = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    sample = family.noise_and_target(comps, latents, generator=torch.Generator().manual_seed(1))
    assert sample.weights is not None and not torch.all(sample.weights == 1)
    sample.mask = torch.zeros(2, 1, 8, 8)
    sample.mask[..., :4] = 1.0
    prediction = torch.zeros_like(sample.target, requires_grad=True)
    loss = family.loss(comps, prediction, sample)
    loss.backward()
    grad = prediction.grad
    assert torch.all(grad[..., 4:] == 0)  # every frame: the black half teaches nothing
    assert torch.all(grad[..., :4] != 0)
    per_item = (sample.target[..., :4] ** 2).reshape(2, -1).mean(dim=1)
    assert loss.item() == pytest.approx((per_item * sample.weights).mean().item(), rel=1e-5)

    sample.mask = torch.zeros(2, 1, 8, 8)
    prediction.grad = None
    black = family.loss(comps, prediction, sample)
    black.backward()
    assert black.item() == 0.0 and torch.all(prediction.grad == 0)


def test_changed_mask_rebuilds_the_mask_only(tmp_path: Path, tiny_sd15):
    family, comps = tiny_sd15
    cfg = _config(tmp_path)
    _mask(tmp_path / "masks/wide.png", (128, 64), (32, 64))
    _, dataset = _loaded(cfg, family, comps)
    before = dataset.load(0)["loss_mask"]
    again = build_caches(cfg, family, comps)
    assert (again.stale_masks, again.stale_vae) == (0, 0)
    _mask(tmp_path / "masks/wide.png", (128, 64), (64, 96))  # now the right half
    mask_file = tmp_path / "masks/wide.png"
    os.utime(mask_file, ns=(mask_file.stat().st_atime_ns, mask_file.stat().st_mtime_ns + 10**9))
    report, dataset = _loaded(cfg, family, comps)
    assert (report.masks.written, report.vae.written) == (1, 0)
    after = dataset.load(0)["loss_mask"]
    assert after[..., 4:].min() > 0.98 and after[..., :4].max() < 0.02
    assert not (before == after).all()
    assert not list((tmp_path / "cache").rglob(".tmp-*"))  # written to temp, renamed


def test_masks_match_by_relative_path_not_by_stem(tmp_path: Path, tiny_sd15):
    """a/x.png and b/x.png share a stem: each takes the mask in its own subfolder."""
    family, comps = tiny_sd15
    cfg = small_config(tmp_path, images=1)
    for p in (tmp_path / "data0").iterdir():
        p.unlink()
    cfg.datasets[0].masks = str(tmp_path / "masks")
    for sub, white in (("a", (0, 32)), ("b", (32, 64))):
        _image(tmp_path / f"data0/{sub}/x.png", (64, 64))
        _mask(tmp_path / f"masks/{sub}/x.png", (64, 64), white)
    report, dataset = _loaded(cfg, family, comps)
    assert report.masks.written == 2 and not [p for p in report.problems if "no mask" in
                                              p.message]
    masks = {Path(item["path"]).parent.name: item["loss_mask"]
             for item in map(dataset.load, range(2))}
    assert masks["a"][..., :4].min() > 0.98 and masks["a"][..., 4:].max() < 0.02
    assert masks["b"][..., 4:].min() > 0.98 and masks["b"][..., :4].max() < 0.02


def test_image_without_a_mask_is_named_and_trains_unmasked(tmp_path: Path, tiny_sd15):
    family, comps = tiny_sd15
    cfg = small_config(tmp_path, images=2)
    cfg.datasets[0].masks = str(tmp_path / "masks")
    _mask(tmp_path / "masks/img_000.png", (64, 64), (0, 32))
    report, dataset = _loaded(cfg, family, comps)
    named = [str(p) for p in report.problems if "no mask for" in p.message]
    assert len(named) == 1 and "datasets.0.masks" in named[0]
    assert "img_001.png" in named[0] and "trains unmasked" in named[0]
    batch = collate([dataset.load(0), dataset.load(1)])
    assert batch["loss_mask"][0, ..., 4:].max() < 0.02
    assert batch["loss_mask"][1].min() == 1.0  # the image without a mask: all learned


def test_eval_losses_stay_unmasked(tmp_path: Path, tiny_sd15):
    """The eval compares captions over the whole image: all-black masks leave its losses
    as they are without the masks (a masked eval would read 0)."""
    import torch

    from core.train.evaluation import build_eval_set, evaluate

    family, comps = tiny_sd15
    cfg = small_config(tmp_path, images=2)
    cfg.datasets[0].masks = str(tmp_path / "masks")
    for i in range(2):
        _mask(tmp_path / f"masks/img_{i:03d}.png", (64, 64), (0, 0))
    _, dataset = _loaded(cfg, family, comps)
    eval_set = build_eval_set(family, comps, [dataset], 2, 2)
    assert all(batch["loss_mask"].max() == 0 for batch in eval_set.batches)
    masked = evaluate(family, comps, eval_set, "cpu", torch.float32)
    for batch in (*eval_set.batches, *eval_set.shuffled):
        del batch["loss_mask"]
    plain = evaluate(family, comps, eval_set, "cpu", torch.float32)
    assert masked["loss"] > 0 and masked == plain


def test_training_on_all_black_masks_has_loss_zero_at_every_step(tmp_path: Path):
    from core.config import save_config

    cfg = small_config(tmp_path, images=2)
    cfg.datasets[0].masks = str(tmp_path / "masks")
    for i in range(2):
        _mask(tmp_path / f"masks/img_{i:03d}.png", (64, 64), (0, 0))
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 2, 100, 100
    cfg.validation.prompts = []
    cfg.launch.cpu = True
    save_config(cfg, tmp_path / "config.toml")
    assert train_in_process(tmp_path / "config.toml", tmp_path) == 0
    events = (Path(cfg.output.dir) / "events.jsonl").read_text().splitlines()
    losses = [e["loss"] for e in map(json.loads, events) if e["type"] == "step"]
    assert losses == [0.0, 0.0]
