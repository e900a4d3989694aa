"""train.optimizer: which class each name builds, from which package, with which of the
train.optimizer_* keys, and the schedule-free switch to averaged weights.

The table is core/config/optimizers.py (data, no heavy import), so the config check can
say which keys an optimizer ignores without importing torch.

- adamw: torch.optim.AdamW. adamw8bit: bitsandbytes' AdamW8bit (on CUDA, and on the CPU
  since bitsandbytes 0.45).
- prodigy, lion, came, adamw_schedulefree: pytorch-optimizer (one maintained package, only
  numpy and torch as dependencies) Prodigy, Lion, CAME and ScheduleFreeAdamW.
- adafactor: transformers' Adafactor driven by train.learning_rate (relative_step,
  scale_parameter and warmup_init off: the usual setting for fine-tuning with an
  external rate and schedule).

Each keeps its whole state in `state_dict()` (schedule-free its z and averaging weight,
Prodigy its step-size estimate d, in the parameter groups), so checkpoints resume exactly.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator
from typing import Any

from core.config.optimizers import OPTIMIZERS


class OptimizerUnavailable(Exception):
    """The optimizer's package is not installed; the message says what to install."""


def optimizer_class(name: str) -> Any:
    spec = OPTIMIZERS[name]
    try:
        return getattr(importlib.import_module(spec.module), spec.cls)
    except ImportError:
        raise OptimizerUnavailable(f"train.optimizer: {spec.missing(name)}") from None


def optimizer_kwargs(name: str, train: Any, cls: Any) -> dict[str, Any]:
    """Constructor arguments from the train section: rate, weight decay, and the option
    keys this optimizer reads; an option left at 0 keeps the class's own default."""
    spec = OPTIMIZERS[name]
    kwargs: dict[str, Any] = {"lr": train.learning_rate, "weight_decay": train.weight_decay,
                              **spec.fixed}
    defaults = {k: p.default for k, p in inspect.signature(cls).parameters.items()}
    beta1, beta2 = train.optimizer_beta1, train.optimizer_beta2
    if "betas" in defaults and (beta1 or beta2):  # CAME has three betas: the first two
        betas = list(defaults["betas"])
        betas[0] = beta1 or betas[0]
        betas[1] = beta2 or betas[1]
        kwargs["betas"] = tuple(betas)
    elif "beta1" in defaults and beta1:  # Adafactor: no first moment unless asked
        kwargs["beta1"] = beta1
    if "optimizer_eps" in spec.keys and train.optimizer_eps:
        kwargs["eps"] = train.optimizer_eps
    kwargs.update({arg: getattr(train, key) for arg, key in spec.options.items()})
    return kwargs


def build_optimizer(groups: Any, train: Any) -> Any:
    cls = optimizer_class(train.optimizer)
    return cls(groups, **optimizer_kwargs(train.optimizer, train, cls))


def _inner(optimizer: Any) -> Any:
    """The optimizer under accelerate's AcceleratedOptimizer, if wrapped."""
    return getattr(optimizer, "optimizer", optimizer)


def is_schedule_free(optimizer: Any) -> bool:
    """A schedule-free optimizer trains one iterate and evaluates another (train()/eval())."""
    inner = _inner(optimizer)
    return callable(getattr(inner, "eval", None)) and callable(getattr(inner, "train", None))


@contextlib.contextmanager
def averaged_weights(optimizer: Any, params: list[Any]) -> Iterator[None]:
    """For a schedule-free optimizer: the averaged weights (its eval mode) inside, for
    eval, validation and saved LoRAs/models; afterwards the training weights bit for bit
    (a snapshot, since eval() then train() round-trips through floating point, and a
    resumed run must continue from exactly the weights the uninterrupted one has).
    Any other optimizer: nothing changes."""
    if not is_schedule_free(optimizer):
        yield
        return
    import torch

    keep = [p.detach().clone() for p in params]
    _inner(optimizer).eval()
    try:
        yield
    finally:
        _inner(optimizer).train()
        with torch.no_grad():
            for param, saved in zip(params, keep, strict=True):
                param.copy_(saved)
