"""Trainer set-up pieces that need no model: clear errors for options that cannot run."""

from __future__ import annotations

import importlib.util

import pytest

from core.config import Config
from core.train.setup import TrainingError, make_optimizer


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None,
                    reason="bitsandbytes is installed here")
def test_adamw8bit_without_bitsandbytes_says_what_to_do():
    import torch

    cfg = Config()
    cfg.train.optimizer = "adamw8bit"
    with pytest.raises(TrainingError, match="needs bitsandbytes: pip install bitsandbytes"):
        make_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)


def test_adamw_uses_the_configured_rate_and_decay():
    import torch

    cfg = Config()
    cfg.train.learning_rate, cfg.train.weight_decay = 3e-4, 0.05
    optimizer = make_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)
    assert optimizer.param_groups[0]["lr"] == 3e-4
    assert optimizer.param_groups[0]["weight_decay"] == 0.05
