"""train.optimizer: every choice builds its class with the train.optimizer_* keys, takes
steps, checkpoints and resumes exactly; schedule-free evaluates and saves its averaged
weights and trains on bit for bit after (core/train/optimizers.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from core.config import Config, save_config, validate_config
from core.config.optimizers import OPTIMIZER_NAMES
from core.train.optimizers import averaged_weights, build_optimizer
from tests.conftest import small_config, train_in_process

# adamw8bit where bitsandbytes is installed (its recent releases step on the CPU too).
RUNNABLE = [pytest.param(name, marks=pytest.mark.skipif(
    name == "adamw8bit" and importlib.util.find_spec("bitsandbytes") is None,
    reason="bitsandbytes is not installed")) for name in OPTIMIZER_NAMES]
CLASSES = {"adamw": "AdamW", "adamw8bit": "AdamW8bit", "prodigy": "Prodigy",
           "adafactor": "Adafactor", "lion": "Lion",
           "came": "CAME", "adamw_schedulefree": "ScheduleFreeAdamW"}


def _params() -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(8, 16, generator=gen)),
            torch.nn.Parameter(torch.randn(16, generator=gen))]


def _steps(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], n: int) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()


@pytest.mark.parametrize("name", RUNNABLE)
def test_each_optimizer_is_its_class_and_takes_steps(name: str) -> None:
    train = Config().train
    train.optimizer = name
    train.learning_rate = 1.0 if name == "prodigy" else 1e-3  # prodigy's rate multiplies d
    params = _params()
    before = [p.detach().clone() for p in params]
    optimizer = build_optimizer(params, train)
    assert type(optimizer).__name__ == CLASSES[name]
    assert optimizer.param_groups[0]["lr"] == train.learning_rate
    _steps(optimizer, params, 2)
    assert all(not torch.equal(p, b) for p, b in zip(params, before, strict=True))


def test_option_keys_reach_the_optimizers() -> None:
    train = Config().train
    train.optimizer_beta1, train.optimizer_beta2, train.optimizer_eps = 0.8, 0.95, 1e-6
    train.prodigy_d_coef, train.prodigy_safeguard_warmup = 0.5, True
    groups = {}
    for name in ("adamw", "prodigy", "lion", "came", "adamw_schedulefree", "adafactor"):
        train.optimizer = name
        groups[name] = build_optimizer(_params(), train).param_groups[0]
    assert groups["adamw"]["betas"] == (0.8, 0.95) and groups["adamw"]["eps"] == 1e-6
    assert groups["prodigy"]["d_coef"] == 0.5 and groups["prodigy"]["safeguard_warmup"]
    assert groups["lion"]["betas"] == (0.8, 0.95)
    assert groups["came"]["betas"] == (0.8, 0.95, 0.9999)  # the third keeps CAME's own
    assert groups["adamw_schedulefree"]["eps"] == 1e-6
    assert groups["adafactor"]["beta1"] == 0.8 and not groups["adafactor"]["relative_step"]
    train.optimizer_beta1 = train.optimizer_beta2 = train.optimizer_eps = 0.0
    train.optimizer = "lion"  # 0 keeps the optimizer's own defaults
    assert build_optimizer(_params(), train).param_groups[0]["betas"] == (0.9, 0.99)


def test_check_names_what_an_optimizer_ignores_and_schedule_free_with_ema() -> None:
    cfg = Config()
    cfg.train.optimizer, cfg.train.optimizer_eps = "lion", 1e-6
    assert any(p.where == "train.optimizer_eps" and p.level == "warning"
               for p in validate_config(cfg))
    cfg.train.optimizer, cfg.train.ema = "adamw_schedulefree", True
    assert any(p.where == "train.ema" and p.level == "error" for p in validate_config(cfg))
    cfg.train.optimizer = "nadam"
    assert any(p.where == "train.optimizer" for p in validate_config(cfg))


def test_schedule_free_averaged_weights_inside_training_weights_exactly_after() -> None:
    train = Config().train
    train.optimizer, train.learning_rate = "adamw_schedulefree", 0.05
    params = _params()
    optimizer = build_optimizer(params, train)
    _steps(optimizer, params, 5)
    training = [p.detach().clone() for p in params]
    state = optimizer.state[params[0]]
    beta1 = optimizer.param_groups[0]["betas"][0]
    # x = y + (1/beta1 - 1)(y - z): what ScheduleFreeAdamW.eval() switches to.
    expected = training[0] + (1 / beta1 - 1) * (training[0] - state["z"])
    with averaged_weights(optimizer, params):
        torch.testing.assert_close(params[0].detach(), expected)
        assert not torch.equal(params[0], training[0])
    assert all(torch.equal(p, t) for p, t in zip(params, training, strict=True))
    assert optimizer.param_groups[0]["train_mode"]

    plain = build_optimizer(params, Config().train)  # adamw: nothing to switch
    with averaged_weights(plain, params):
        assert all(torch.equal(p, t) for p, t in zip(params, training, strict=True))


# ---------------------------------------------------------------- exact resume (the trainer)


def _run(tmp: Path, name: str, optimizer: str, max_steps: int, *extra: str,
         cfg_dir: str | None = None) -> dict[int, float]:
    """Train tiny:sd15 in this process; returns {step: loss} of this run's events."""
    folder = tmp / (cfg_dir or name)
    cfg = small_config(folder, images=4)
    cfg.output.dir = str(folder / "run")
    cfg.train.optimizer, cfg.train.max_steps = optimizer, max_steps
    cfg.train.learning_rate = 1.0 if optimizer == "prodigy" else 1e-3
    cfg.train.checkpoint_every, cfg.train.eval_every, cfg.validation.every = 2, 1, 100
    cfg.validation.prompts = []
    cfg.launch.cpu = True
    save_config(cfg, folder / "config.toml")
    assert train_in_process(folder / "config.toml", folder, *extra) == 0
    events = (Path(cfg.output.dir) / "events.jsonl").read_text().splitlines()
    return {e["step"]: e["loss"] for e in map(json.loads, events) if e["type"] == "step"}


def _record_optimizer(monkeypatch) -> list:
    """The optimizer each micro_step of the next in-process run is given (the one the loop
    really steps), unwrapped from accelerate's AcceleratedOptimizer."""
    from core.train import loop

    seen: list = []
    micro_step = loop.micro_step

    def recording(setup, cfg, batch_plan):
        seen.append(getattr(setup.optimizer, "optimizer", setup.optimizer))
        return micro_step(setup, cfg, batch_plan)

    monkeypatch.setattr(loop, "micro_step", recording)
    return seen


def test_a_prodigy_run_steps_prodigy_and_its_step_size_grows(tmp_path: Path,
                                                              tiny_workspace: Path,
                                                              monkeypatch) -> None:
    """A real tiny run steps the class train.optimizer names, with its option keys, and
    Prodigy's step size d grows from d0 (d_coef 100 lifts the first estimates above d0)."""
    seen = _record_optimizer(monkeypatch)
    cfg = small_config(tmp_path, images=4)
    cfg.train.optimizer, cfg.train.learning_rate, cfg.train.prodigy_d_coef = "prodigy", 1.0, 100
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 3, 100, 100
    cfg.validation.prompts = []
    cfg.launch.cpu = True
    save_config(cfg, tmp_path / "config.toml")
    assert train_in_process(tmp_path / "config.toml", tmp_path) == 0
    assert len(seen) == 3 and all(o is seen[0] for o in seen)
    assert type(seen[0]).__name__ == "Prodigy"
    group = seen[0].param_groups[0]
    assert group["d_coef"] == 100 and group["d"] > group["d0"], group


def _sorted_values(path: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    return torch.sort(torch.cat([t.float().flatten() for t in tensors.values()])).values


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", RUNNABLE)
def test_resume_continues_exactly_the_uninterrupted_run(tmp_path: Path, tiny_workspace: Path,
                                                        optimizer: str, monkeypatch) -> None:
    """4 steps straight vs 2 steps, a stop, and a resume to 4 (checkpoint every 2, eval
    every step, so schedule-free switches weights around each step): the same losses,
    exactly. The saved LoRA is the averaged weights for schedule-free, the trained ones
    otherwise. The straight run steps the optimizer's own class."""
    seen = _record_optimizer(monkeypatch)
    straight = _run(tmp_path, "straight", optimizer, 4)
    assert {type(o).__name__ for o in seen} == {CLASSES[optimizer]}
    first = _run(tmp_path, "parted", optimizer, 2)
    resumed = _run(tmp_path, "parted", optimizer, 4, "--resume", "latest")
    assert sorted(straight) == [1, 2, 3, 4] and sorted(resumed) == [1, 2, 3, 4]
    assert [first[s] for s in (1, 2)] == [straight[s] for s in (1, 2)]
    assert [resumed[s] for s in (3, 4)] == [straight[s] for s in (3, 4)]
    assert straight[4] != straight[1]  # it trains

    run = tmp_path / "straight" / "run"
    lora = _sorted_values(run / "lora" / "step_000002" / "pytorch_lora_weights.safetensors")
    trained = _sorted_values(run / "checkpoints" / "step_000002" / "trainable.safetensors")
    assert torch.equal(lora, trained) == (optimizer != "adamw_schedulefree")


def test_every_optimizer_has_a_complete_spec() -> None:
    """Issue 38 item 3: an optimizer added to OPTIMIZERS without its facts fails here, not
    as an estimate that guesses its memory or a help text that leaves it out."""
    from dataclasses import fields

    from core.config.optimizers import OPTIMIZERS, OPTION_DEFAULTS
    from core.config.schema import TrainConfig

    helps = {f.name: f.metadata["help"] for f in fields(TrainConfig)}
    for name, spec in OPTIMIZERS.items():
        assert spec.state_bytes > 0 and spec.help.strip() and spec.package, name
        assert f"{name} ({spec.package}; {spec.help})" in helps["optimizer"], name
        assert set(spec.keys) <= set(OPTION_DEFAULTS), name  # the check warns on the rest
        assert set(spec.options.values()) <= set(spec.keys), name
        assert spec.package in spec.missing(name) and f'"{name}"' in spec.missing(name)


def test_check_says_which_package_a_missing_optimizer_needs(monkeypatch) -> None:
    """`--stage check` names the package (pytorch-optimizer) before a run would fail on it;
    the package is installed here, so its absence is simulated."""
    import importlib.util

    from core.check import optimizer_problems

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pytorch_optimizer" else real(name, *a))
    cfg = Config()
    cfg.train.optimizer = "lion"
    [problem] = optimizer_problems(cfg)
    assert problem.where == "train.optimizer" and "pip install pytorch-optimizer" in problem.message
    cfg.train.optimizer = "adafactor"  # transformers, which is there
    assert optimizer_problems(cfg) == []
