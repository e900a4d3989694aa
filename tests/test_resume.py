"""Resuming after the datasets changed: the trainer says so in its log and events rather
than silently starting the epoch again (the trainer run directly, one process)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, small_config, write_shapes

from core.config import save_config
from core.runs.folder import RunFolder

pytestmark = pytest.mark.slow


def train(config: Path, workspace: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run([PYTHON, "-m", "core.train.main", "--config", str(config),
                           "--workspace", str(workspace), *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_resume_after_the_dataset_layout_changed_says_so(tmp_path: Path,
                                                         tiny_workspace: Path):
    cfg = small_config(tmp_path, datasets=2, images=4)
    cfg.train.batch_size = 1
    cfg.train.max_steps = 3
    cfg.train.eval_every = 1000
    cfg.validation.every = 1000
    cfg.validation.prompts = []
    config = tmp_path / "run.toml"
    save_config(cfg, config)
    train(config, tiny_workspace)  # 8 steps an epoch: the checkpoint at 3 is mid-epoch

    write_shapes(tmp_path / "data1", 6)  # dataset d1 grows from 4 to 6 images
    cfg.train.max_steps = 4
    save_config(cfg, config)
    done = train(config, tiny_workspace, "--resume", "latest")

    run = RunFolder(Path(cfg.output.dir))
    warning = ("warning: the dataset layout changed since checkpoint step_000003 (datasets "
               "changed: 'd1' items 4 -> 6): the position saved in epoch 0 no longer "
               "applies, so training continues from the start of epoch 1 (the step count "
               "goes on from 3)")
    assert warning in done.stdout.splitlines()
    events = [json.loads(line) for line in run.events.read_text().splitlines()]
    resumes = [e for e in events if e["type"] == "resume"]
    assert len(resumes) == 1
    assert (resumes[0]["step"], resumes[0]["epoch"]) == (3, 1)
    assert resumes[0]["message"] == warning.removeprefix("warning: ")
    assert [e["epoch"] for e in events if e["type"] == "step"][-1] == 1
