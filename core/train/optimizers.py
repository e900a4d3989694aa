"""train.optimizer: the class each name builds, from which package, with which of the
train.optimizer_* keys, and the schedule-free switch to averaged weights.

The table is core/config/optimizers.py (data, no heavy import: which module and class
each name builds, the package to install, the arguments it always gets), so the config
check can say which keys an optimizer ignores without importing torch; this module
imports and builds from it.

Each keeps its whole state in `state_dict()` (a schedule-free one its z and averaging
weight, one that estimates its step size its estimate d, in the parameter groups), so
checkpoints resume exactly.
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
    if "betas" in defaults and (beta1 or beta2):  # two betas or three: the first two
        betas = list(defaults["betas"])
        betas[0] = beta1 or betas[0]
        betas[1] = beta2 or betas[1]
        kwargs["betas"] = tuple(betas)
    elif "beta1" in defaults and beta1:  # no first moment unless asked
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
