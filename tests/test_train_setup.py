"""Trainer set-up pieces: clear errors for options that cannot run (no model), and what
prepare_data hands the loop (tiny SD1.5)."""

from __future__ import annotations

import pytest

from core.config import Config, validate_config
from core.train.setup import TrainingError, make_lr_scheduler, make_optimizer


def test_adamw8bit_without_bitsandbytes_says_what_to_do(monkeypatch):
    import sys

    import torch

    # As if not installed: the package and any of its modules an earlier test imported
    # (import_module returns a cached bitsandbytes.optim without looking at its parent).
    for name in [n for n in sys.modules if n.split(".")[0] == "bitsandbytes"] + ["bitsandbytes"]:
        monkeypatch.setitem(sys.modules, name, None)
    cfg = Config()
    cfg.train.optimizer = "adamw8bit"
    with pytest.raises(TrainingError, match="needs the bitsandbytes package, which is not "
                                            "installed: pip install bitsandbytes, or use"):
        make_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)


def test_adamw_uses_the_configured_rate_and_decay():
    import torch

    cfg = Config()
    cfg.train.learning_rate, cfg.train.weight_decay = 3e-4, 0.05
    optimizer = make_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)
    assert optimizer.param_groups[0]["lr"] == 3e-4
    assert optimizer.param_groups[0]["weight_decay"] == 0.05


def _rates(**train) -> list[float]:
    """The share of the rate each of 8 steps trains at, under train.* = `train`."""
    import torch

    cfg = Config()
    cfg.train.max_steps = 8
    for key, value in train.items():
        setattr(cfg.train, key, value)
    optimizer = make_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)
    schedule, out = make_lr_scheduler(optimizer, cfg), []
    for _ in range(8):
        out.append(schedule.get_last_lr()[0] / cfg.train.learning_rate)
        optimizer.step()
        schedule.step()
    return out


def test_each_lr_schedule_gives_its_rates():
    half = [0.0, 0.5]  # two warm-up steps
    assert _rates(lr_scheduler="constant_with_warmup", lr_warmup_steps=2) == \
        pytest.approx(half + [1.0] * 6)
    # Two cosine cycles over the 8 steps: back to the full rate at step 4.
    assert _rates(lr_scheduler="cosine_with_restarts", lr_cycles=2) == pytest.approx(
        [1.0, 0.8535534, 0.5, 0.1464466, 1.0, 0.8535534, 0.5, 0.1464466])
    # Quadratic decay after warm-up to diffusers' lr_end, 1e-7 (a share 1e-3 of 1e-4).
    end = 1e-7 / Config().train.learning_rate
    assert _rates(lr_scheduler="polynomial", lr_power=2.0, lr_warmup_steps=2) == pytest.approx(
        half + [(1 - end) * ((8 - s) / 6) ** 2 + end for s in range(2, 8)])
    assert _rates(lr_scheduler="constant", lr_warmup_steps=2) == [1.0] * 8


def test_check_names_the_lr_keys_a_schedule_ignores():
    def warned(**train) -> set[str]:
        cfg = Config()
        for key, value in train.items():
            setattr(cfg.train, key, value)
        return {p.where for p in validate_config(cfg) if p.where.startswith("train.lr_")}

    assert warned(lr_scheduler="constant", lr_warmup_steps=5) == {"train.lr_warmup_steps"}
    assert warned(lr_scheduler="constant_with_warmup", lr_warmup_steps=5) == set()
    assert warned(lr_scheduler="cosine", lr_cycles=3, lr_power=2.0) == \
        {"train.lr_cycles", "train.lr_power"}
    assert warned(lr_scheduler="cosine_with_restarts", lr_cycles=3) == set()
    assert warned(lr_scheduler="polynomial", lr_power=2.0) == set()


class _Items:
    """A dataset of `n` items that records which indices the eval set loads."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def load(self, index: int) -> dict:
        return {"index": index}


def test_eval_set_takes_every_image_of_a_dataset_smaller_than_eval_images():
    from core.train.evaluation import _pick_items

    picked = [item["index"] for item in _pick_items([_Items(3)], count=8)]
    assert picked == [0, 1, 2]  # not item 0 three times
    spread = [item["index"] for item in _pick_items([_Items(10)], count=4)]
    assert spread == [0, 2, 5, 7]


def test_resume_without_a_checkpoint_is_a_user_error_that_says_what_to_do(tmp_path):
    from core.train.resume import restore

    with pytest.raises(TrainingError, match="no checkpoint in .*checkpoints.*another output.dir"):
        restore(None, tmp_path, "latest", print)  # fails before the setup is touched


def test_prepare_data_hands_the_loop_each_datasets_repeats_probability_and_the_seed(
        tmp_path, tiny_sd15):
    """What the sampler and the caption draws get from the config (datasets.N.repeats and
    probability, train.seed, train.batch_size and grad_accum); the sampler's own tests
    start from these values."""
    from types import SimpleNamespace

    from conftest import small_config

    from core.train.setup import prepare_data

    family, comps = tiny_sd15
    cfg = small_config(tmp_path, datasets=2, images=2)
    cfg.datasets[0].repeats, cfg.datasets[1].probability = 3, 2.5
    cfg.train.seed, cfg.train.batch_size, cfg.train.grad_accum = 7, 1, 2
    cfg.train.caption_dropout = 0.1
    accelerator = SimpleNamespace(process_index=0, num_processes=1, device="cpu",
                                  wait_for_everyone=lambda: None)
    datasets, sampler, texts = prepare_data(cfg, family, comps, accelerator, lambda _: None)
    assert [ds.id for ds in datasets] == ["d0", "d1"]
    assert [(d.repeats, d.probability) for d in sampler.datasets] == [(3, 1.0), (1, 2.5)]
    assert [s.items_per_epoch for s in sampler.dataset_summaries()] == [6, 2]
    assert (sampler.seed, sampler.batch_size, sampler.grad_accum) == (7, 1, 2)
    assert (texts.seed, texts.dropout) == (7, 0.1)
