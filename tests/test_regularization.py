"""Regularization images (prior preservation): datasets.N.regularization marks class
images, train.prior_loss_weight weighs their loss, the check shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import small_config, train_in_process


def _two(tmp: Path, images: int = 2):
    cfg = small_config(tmp, datasets=2, images=images)
    cfg.datasets[1].regularization = True
    return cfg


def test_check_summary_and_histogram_show_the_class_images(tmp_path: Path):
    from core.check import run_check
    from ui.tab_dataset import histogram_rows

    cfg = _two(tmp_path, images=3)
    cfg.datasets[1].repeats = 2
    report = run_check(cfg, tmp_path, estimate=False)
    lines = report.lines()
    assert "dataset 'd1': 3 image(s) (regularization images)" in lines
    assert "dataset 'd0': 3 image(s)" in lines
    assert any(line.startswith("regularization: 6 class image(s) per epoch beside 3 "
                               "training image(s)") for line in lines), lines
    plot = histogram_rows(report)
    column = plot.value["columns"].index("dataset")
    assert {row[column] for row in plot.value["data"]} == {"d0", "d1 (regularization)"}


def _losses_and_datasets(tmp: Path, monkeypatch, weight: float
                         ) -> tuple[list[float], list[str], list[float]]:
    """A 4-step in-process run of _two(tmp) at prior_loss_weight `weight`: each step's
    loss, the dataset its batch came from (the trainer's own batch plans, recorded on their
    way into micro_step) and the family's loss before the trainer weighed it."""
    from core.config import save_config
    from core.models.registry import get_family
    from core.train import loop

    cfg = _two(tmp)
    cfg.train.prior_loss_weight = weight
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 4, 100, 100
    cfg.validation.prompts = []
    cfg.launch.cpu = True
    save_config(cfg, tmp / "config.toml")
    datasets: list[str] = []
    unweighted: list[float] = []
    micro_step, family = loop.micro_step, get_family("sd15")
    loss = family.loss

    def recording_step(setup, cfg, batch_plan):
        datasets.append(batch_plan.dataset_id)
        return micro_step(setup, cfg, batch_plan)

    def recording_loss(*args, **kwargs):
        value = loss(*args, **kwargs)
        unweighted.append(value.item())
        return value

    monkeypatch.setattr(loop, "micro_step", recording_step)
    monkeypatch.setattr(family, "loss", recording_loss)
    assert train_in_process(tmp / "config.toml", tmp) == 0
    events = (Path(cfg.output.dir) / "events.jsonl").read_text().splitlines()
    losses = [e["loss"] for e in map(json.loads, events) if e["type"] == "step"]
    assert len(losses) == len(datasets) == 4 and sorted(datasets) == ["d0", "d0", "d1", "d1"]
    return losses, datasets, unweighted[:4]  # the steps' (the final eval's come after)


def test_prior_loss_weight_zero_zeroes_exactly_the_class_images_steps(tmp_path: Path,
                                                                      monkeypatch):
    losses, datasets, _ = _losses_and_datasets(tmp_path, monkeypatch, 0.0)
    # each step is one dataset's batch: the class images' (d1) weigh 0, the others' not
    assert [loss == 0.0 for loss in losses] == [d == "d1" for d in datasets], (losses,
                                                                               datasets)


def test_prior_loss_weight_two_doubles_the_class_images_loss(tmp_path: Path, monkeypatch):
    losses, datasets, unweighted = _losses_and_datasets(tmp_path, monkeypatch, 2.0)
    for d, got, plain in zip(datasets, losses, unweighted, strict=True):
        assert got == pytest.approx(2 * plain if d == "d1" else plain, rel=1e-5), (
            datasets, losses, unweighted)
