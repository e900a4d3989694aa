"""Resuming after the datasets changed: the trainer says so in its log and events rather
than silently starting the epoch again (the trainer run in-process, one process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import small_config, train_in_process, write_shapes

from core.config import save_config
from core.runs.folder import RunFolder

pytestmark = pytest.mark.slow


def train(config: Path, workspace: Path, capsys: pytest.CaptureFixture, *extra: str) -> str:
    """The trainer in-process; what it printed."""
    capsys.readouterr()
    assert train_in_process(config, workspace, *extra) == 0
    return capsys.readouterr().out


def test_resume_after_the_dataset_layout_changed_says_so(tmp_path: Path, tiny_workspace: Path,
                                                         capsys: pytest.CaptureFixture):
    cfg = small_config(tmp_path, datasets=2, images=4)
    cfg.train.batch_size = 1
    cfg.train.max_steps = 3
    cfg.train.eval_every = 1000
    cfg.validation.every = 1000
    cfg.validation.prompts = []
    config = tmp_path / "run.toml"
    save_config(cfg, config)
    train(config, tiny_workspace, capsys)  # 8 steps an epoch: the checkpoint at 3 is mid-epoch

    write_shapes(tmp_path / "data1", 6)  # dataset d1 grows from 4 to 6 images
    cfg.train.max_steps = 4
    save_config(cfg, config)
    printed = train(config, tiny_workspace, capsys, "--resume", "latest")

    run = RunFolder(Path(cfg.output.dir))
    warning = ("warning: the dataset layout changed since checkpoint step_000003 (datasets "
               "changed: 'd1' items 4 -> 6): the position saved in epoch 0 no longer "
               "applies, so training continues from the start of epoch 1 (the step count "
               "goes on from 3)")
    assert warning in printed.splitlines()
    events = [json.loads(line) for line in run.events.read_text().splitlines()]
    resumes = [e for e in events if e["type"] == "resume"]
    assert len(resumes) == 1
    assert (resumes[0]["step"], resumes[0]["epoch"]) == (3, 1)
    assert resumes[0]["message"] == warning.removeprefix("warning: ")
    assert [e["epoch"] for e in events if e["type"] == "step"][-1] == 1
