"""Regularization images (prior preservation): datasets.N.regularization marks class
images, train.prior_loss_weight weighs their loss, the check shows them."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_prior_loss_weight_scales_the_class_images_steps(tmp_path: Path):
    from core.config import save_config

    cfg = _two(tmp_path)
    cfg.train.prior_loss_weight = 0.0
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 4, 100, 100
    cfg.validation.prompts = []
    cfg.launch.cpu = True
    save_config(cfg, tmp_path / "config.toml")
    assert train_in_process(tmp_path / "config.toml", tmp_path) == 0
    events = (Path(cfg.output.dir) / "events.jsonl").read_text().splitlines()
    losses = [e["loss"] for e in map(json.loads, events) if e["type"] == "step"]
    # each step is one dataset's batch: the class images' steps weigh 0, the others not
    assert len(losses) == 4
    assert sorted(loss == 0.0 for loss in losses) == [False, False, True, True], losses
