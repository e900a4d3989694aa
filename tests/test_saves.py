"""Intermediate LoRAs (lora/step_NNNNNN/) and the trackers (TensorBoard, W&B), on real
trainer runs of a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import small_config, train_in_process

from core.config import save_config


def _train(tmp: Path, workspace: Path, **settings) -> Path:
    """A tiny sd15 LoRA run, trainer only and in-process: 4 images at batch 2, so 2 steps
    an epoch."""
    cfg = small_config(tmp, images=4)
    cfg.validation.prompts = ["a red circle"]
    cfg.validation.every = 1000
    for key, value in settings.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    save_config(cfg, tmp / "run.toml")
    assert train_in_process(tmp / "run.toml", workspace) == 0
    return Path(cfg.output.dir)


def _events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == kind]


@pytest.mark.slow
def test_checkpoints_and_epoch_ends_leave_loadable_loras_and_tensorboard(
        tmp_path: Path, tiny_workspace: Path, capsys):
    from safetensors.torch import load_file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = _train(tmp_path, tiny_workspace, train__max_steps=7,
                     train__checkpoint_every=3, train__keep_checkpoints=1,
                     train__save_every_epochs=2, train__eval_every=3)
    # Checkpoints at 3, 6 and the last step 7; epochs end at 2, 4, 6: every 2nd is step 4.
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000007"]
    saved = sorted(p.name for p in (run_dir / "lora").iterdir() if p.is_dir())
    assert saved == ["step_000003", "step_000004", "step_000006", "step_000007"]
    events = _events(run_dir, "lora_saved")
    assert [e["step"] for e in events] == [3, 4, 6, 7]
    final = load_file(run_dir / "lora/pytorch_lora_weights.safetensors")
    for event in events:
        files = sorted(Path(p).name for p in event["paths"])
        assert files == ["lora_kohya.safetensors", "pytorch_lora_weights.safetensors"]
        tensors = [load_file(p) for p in event["paths"]]
        assert all(t for t in tensors)
    last = load_file(run_dir / "lora/step_000007/pytorch_lora_weights.safetensors")
    first = load_file(run_dir / "lora/step_000003/pytorch_lora_weights.safetensors")
    assert all((last[k] == final[k]).all() for k in final)  # no EMA: the final weights
    assert any((first[k] != final[k]).any() for k in final)

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    acc.Reload()
    tags = acc.Tags()
    assert [s.step for s in acc.Scalars("train/loss")] == list(range(1, 8))
    assert [s.step for s in acc.Scalars("train/lr")] == list(range(1, 8))
    # No step-0 eval: train.eval_before_training is off by default.
    assert [s.step for s in acc.Scalars("eval/loss")] == [3, 6, 7]
    assert [s.step for s in acc.Scalars("eval/loss_shuffled")] == [3, 6, 7]
    eval_events = _events(run_dir, "eval")
    assert acc.Scalars("eval/loss")[-1].value == pytest.approx(eval_events[-1]["loss"], 1e-5)
    by_t = [t for t in tags["scalars"] if t.startswith("eval/by_t/")]
    assert len(by_t) == len(eval_events[0]["by_t"]) > 0
    assert [i.step for i in acc.Images("validation/00")] == [7]

    # What the CLI summary and the UI (Runs tab, Training tab) show of it.
    from core.headless import summarize_run
    from ui.render import lora_rows, tensorboard_markdown

    capsys.readouterr()  # the trainer's own output
    summarize_run(run_dir, "done", tiny_workspace)
    out = capsys.readouterr().out
    assert f"tensorboard --logdir {run_dir / 'tensorboard'}" in out
    assert "4 saves, steps 3 to 7" in out
    rows = lora_rows(run_dir, str)
    assert [r[0] for r in rows] == [7, 6, 4, 3]
    assert rows[0][2] == "lora_kohya.safetensors, pytorch_lora_weights.safetensors"
    assert f"tensorboard --logdir {run_dir / 'tensorboard'}" in tensorboard_markdown(run_dir)


@pytest.mark.slow
def test_tensorboard_off_writes_no_folder(tmp_path: Path, tiny_workspace: Path):
    run_dir = _train(tmp_path, tiny_workspace, train__max_steps=2,
                     train__checkpoint_every=1000, logging__tensorboard=False)
    assert (run_dir / "lora/pytorch_lora_weights.safetensors").is_file()
    assert not (run_dir / "tensorboard").exists()
    from ui.render import tensorboard_markdown

    assert tensorboard_markdown(run_dir) == ""
    assert [p.name for p in (run_dir / "lora").iterdir() if p.is_dir()] == ["step_000002"]


def test_wandb_project_without_wandb_is_a_check_error(tmp_path: Path, monkeypatch):
    import importlib.util

    from core.check import run_check

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    cfg = small_config(tmp_path, images=2)
    cfg.logging.wandb_project = "my-project"
    report = run_check(cfg, tmp_path, estimate=False)
    found = [p for p in report.problems if p.where == "logging.wandb_project"]
    assert len(found) == 1 and found[0].level == "error" and not report.ok
    assert "pip install wandb" in found[0].message and "wandb login" in found[0].message
    cfg.logging.wandb_project = ""
    assert not [p for p in run_check(cfg, tmp_path, estimate=False).problems
                if p.where.startswith("logging.")]


def test_sampler_says_when_a_step_ends_an_epoch():
    from core.data.sampler import MultiDatasetSampler, SourceDataset
    from core.train.saves import epoch_save_due

    sampler = MultiDatasetSampler([SourceDataset("a", [(64, 64)] * 5)], batch_size=2,
                                  grad_accum=2)  # 3 micro-batches, filled to 4: 2 steps
    batches = iter(sampler)
    ends = []
    for step in range(1, 7):
        for _ in range(2):
            next(batches)
        ends.append((step, sampler.epoch, sampler.epoch_complete))
    assert [s for s, _, done in ends if done] == [2, 4, 6]
    due = [s for s, epoch, done in ends if epoch_save_due(2, epoch, done)]
    assert due == [4]
