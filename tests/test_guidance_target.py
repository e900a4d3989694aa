"""train.guidance_target_scale (CFG-augmented targets, issue 52 item 3): the output is read
as a prediction guided at the scale by the base's unconditional (empty caption)
prediction, and its un-guided part fits the ordinary target."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import small_config, train_in_process

from core.config import save_config, validate_config


def test_the_unguided_part_of_a_guided_prediction_is_the_conditional_one():
    """u + s·(c − u), read back at scale s with u, gives c: the guided prediction is the
    target the output fits."""
    from core.train.guidance_target import unguided

    cond, uncond = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    guided = uncond + 3.5 * (cond - uncond)
    assert torch.allclose(unguided(guided, uncond, 3.5), cond, atol=1e-5)


def _first_prediction(tmp: Path, workspace: Path, monkeypatch, **train: object) -> torch.Tensor:
    """The prediction the family's loss gets at the first step of a fresh sd15 LoRA run
    (the same noise every run: same seed and images)."""
    from core.models.registry import get_family

    cfg = small_config(tmp, images=2)
    for key, value in train.items():
        setattr(cfg.train, key, value)
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 1, 100, 100
    cfg.train.batch_size, cfg.validation.prompts, cfg.launch.cpu = 2, [], True
    save_config(cfg, tmp / "config.toml")
    family, seen = get_family("sd15"), []
    loss = family.loss

    def recording_loss(components, prediction, sample, *args, **kwargs):
        seen.append(prediction.detach().clone())
        return loss(components, prediction, sample, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(family, "loss", recording_loss)
        assert train_in_process(tmp / "config.toml", workspace) == 0
    return seen[0]


@pytest.mark.slow  # three short runs
def test_the_trained_output_is_read_back_with_the_base_unconditional_prediction(
        tmp_path: Path, tiny_workspace: Path, monkeypatch, capsys):
    """A fresh LoRA predicts what the base does: at the first step, the prediction the
    loss sees with scale 3 is (D + 2·u) / 3, with D the run's prediction without the
    scale and u the prediction for the empty caption (a run that drops every caption).
    The start-up names the scale and its extra forward."""
    plain = _first_prediction(tmp_path / "a", tiny_workspace, monkeypatch)
    guided = _first_prediction(tmp_path / "b", tiny_workspace, monkeypatch,
                               guidance_target_scale=3.0)
    empty = _first_prediction(tmp_path / "c", tiny_workspace, monkeypatch,
                              caption_dropout=1.0)
    assert not torch.allclose(plain, empty, atol=1e-4)  # the captions do condition it
    assert torch.allclose(guided, (plain + 2 * empty) / 3, atol=1e-4)
    out = capsys.readouterr().out
    assert "guidance target scale 3: the output is trained as a prediction guided by " \
           "the base's unconditional (empty caption) prediction" in out, out


def test_the_empty_caption_is_cached_for_the_scale(tmp_path: Path):
    from core.cache.plan import plan_caches

    cfg = small_config(tmp_path, images=2)
    assert "" not in [job.caption for job in plan_caches(cfg, {}).text_jobs]
    cfg.train.guidance_target_scale = 4.0
    assert "" in [job.caption for job in plan_caches(cfg, {}).text_jobs]


@pytest.mark.parametrize(("family", "scale", "message"), [
    ("sd15", 0.5, "a guided prediction's scale is above 1"),
    ("sd15", 1.0, "a guided prediction's scale is above 1"),
    ("qwen_image_edit", 4.0, "reads the control images with the prompt"),
])
def test_a_scale_that_cannot_work_is_refused_naming_the_key(tmp_path: Path, family: str,
                                                            scale: float, message: str):
    cfg = small_config(tmp_path, images=2, family=family)
    cfg.train.guidance_target_scale = scale
    problems = [p for p in validate_config(cfg) if p.where == "train.guidance_target_scale"]
    assert [p.level for p in problems] == ["error"], problems
    assert message in problems[0].message


def test_off_and_a_real_scale_pass_the_check(tmp_path: Path):
    cfg = small_config(tmp_path, images=2)
    for scale in (0.0, 4.0):
        cfg.train.guidance_target_scale = scale
        assert not [p for p in validate_config(cfg) if p.where == "train.guidance_target_scale"]


def test_the_memory_estimate_counts_the_unconditional_output(tiny_workspace: Path):
    """One more prediction-sized fp32 tensor in the training phase, named."""
    from core.config import Config, DatasetConfig, resolved
    from core.memory.estimate import estimate_memory

    def parts(scale: float) -> dict[str, int]:
        cfg = Config()
        cfg.model.family, cfg.model.path = "flux", "random:flux"
        cfg.train.guidance_target_scale = scale
        cfg.datasets.append(DatasetConfig(id="d", images="data", vae_cache="cache",
                                          resolution=512))
        estimate = estimate_memory(resolved(cfg, tiny_workspace), tiny_workspace,
                                   caches_built=True)
        return {p.name: p.bytes for p in estimate.parts}

    plain, guided = parts(0.0), parts(4.0)
    assert "unconditional base output" not in plain
    assert guided.pop("unconditional base output") > 0
    assert guided == plain
