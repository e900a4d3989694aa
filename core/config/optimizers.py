"""The optimizer catalogue: one OptimizerSpec per train.optimizer name, the only place an
optimizer's facts live. The class it builds (module, class, the package to install and
the message when it is missing), the train.optimizer_* keys it reads and the constructor
arguments they fill, the arguments it always gets, its state bytes per trained weight
(the memory estimate), its help text (the schema's train.optimizer help, so the form
and docs/config.md) and the rules the check applies to it. The option keys' own fields
(`OPTION_FIELDS`, declared in the schema's train section) are here too, as their help
names the optimizers that read them: no other module names an optimizer. Data only, no
heavy import, so the schema's choices and the config check read it without torch;
core/train/optimizers.py builds from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.fields import _f

BETAS = ("optimizer_beta1", "optimizer_beta2")
ADAM = (*BETAS, "optimizer_eps")


@dataclass(frozen=True)
class OptimizerSpec:
    module: str
    cls: str
    package: str  # what to pip install when the import fails
    keys: tuple[str, ...]  # the train.* option keys it reads
    state_bytes: float  # optimizer state per trained weight, for the memory estimate
    help: str  # what the train.optimizer help says of it, after its package
    fixed: dict[str, Any] = field(default_factory=dict)  # constructor arguments always given
    # constructor argument -> the train.* key that fills it as it is (no "0 = default")
    options: dict[str, str] = field(default_factory=dict)
    # train.* key -> what it means for this optimizer, in that key's help
    notes: dict[str, str] = field(default_factory=dict)
    # The optimizer of the same updates with less state, which the memory advice names
    # for a full fine-tune that does not fit.
    lighter: str = ""
    # It trains one iterate and evaluates another (schedule-free): train.ema is refused
    # and a decaying train.lr_scheduler warned of.
    averages_weights: bool = False
    # train.learning_rate multiplies a step size it estimates itself: a rate below 0.1
    # is warned of.
    estimates_step: bool = False

    def missing(self, name: str) -> str:
        """The refusal when the package is not installed (the check and the trainer)."""
        return (f"\"{name}\" needs the {self.package} package, which is not installed: "
                f"pip install {self.package}, or use optimizer \"{DEFAULT_OPTIMIZER}\"")


# State bytes: adamw, adamw8bit and adamw_schedulefree keep two states (schedule-free: z
# and the second moment; 8-bit: one byte each), prodigy four (two moments, its s and the
# starting weights), lion one. adafactor and came factor their second moment into a row
# and a column vector: per weight about 0.25 and 4.5 on LoRA-shaped matrices (measured
# with pytorch-optimizer 4.1.0 and transformers 5.23 on 16 x 3072), rounded up here.
OPTIMIZERS: dict[str, OptimizerSpec] = {
    "adamw": OptimizerSpec("torch.optim", "AdamW", "torch", ADAM, 8, "the default",
                           lighter="adamw8bit"),
    "adamw8bit": OptimizerSpec("bitsandbytes.optim", "AdamW8bit", "bitsandbytes", ADAM, 2,
                               "8-bit states, a quarter of adamw's memory; CUDA"),
    "prodigy": OptimizerSpec("pytorch_optimizer", "Prodigy", "pytorch-optimizer",
                             (*ADAM, "prodigy_d_coef", "prodigy_safeguard_warmup"), 16,
                             "estimates its own step size: learning_rate is a multiplier, "
                             "usually 1.0",
                             options={"d_coef": "prodigy_d_coef",
                                      "safeguard_warmup": "prodigy_safeguard_warmup"},
                             estimates_step=True),
    # Driven by train.learning_rate: relative_step, scale_parameter and warmup_init off,
    # the usual setting for fine-tuning with an external rate and schedule.
    "adafactor": OptimizerSpec("transformers.optimization", "Adafactor", "transformers",
                               ("optimizer_beta1",), 1,
                               "factored second moments, little memory",
                               {"relative_step": False, "scale_parameter": False,
                                "warmup_init": False},
                               notes={"optimizer_beta1": "turns its first moment on"}),
    "lion": OptimizerSpec("pytorch_optimizer", "Lion", "pytorch-optimizer", BETAS, 4,
                          "one state, sign updates: use a rate 3-10x below AdamW's",
                          notes={"optimizer_beta2": "its update interpolation"}),
    "came": OptimizerSpec("pytorch_optimizer", "CAME", "pytorch-optimizer", BETAS, 5,
                          "confidence-guided, factored"),
    "adamw_schedulefree": OptimizerSpec("pytorch_optimizer", "ScheduleFreeAdamW",
                                        "pytorch-optimizer", ADAM, 8,
                                        "no decay schedule needed: eval, validation and "
                                        "saved weights use its averaged weights",
                                        averages_weights=True),
}
OPTIMIZER_NAMES = tuple(OPTIMIZERS)
DEFAULT_OPTIMIZER = OPTIMIZER_NAMES[0]  # train.optimizer's default


def optimizer_package(name: str) -> str:
    """The package train.optimizer `name` comes from ("" for an unknown name), for
    core/libraries.py, which reads no config."""
    spec = OPTIMIZERS.get(name)
    return spec.package if spec else ""


def optimizer_help() -> str:
    """train.optimizer's help: every optimizer, its package and what it is for."""
    said = "; ".join(f"{name} ({spec.package}; {spec.help})"
                     for name, spec in OPTIMIZERS.items())
    return f"{said}. The train.optimizer_* keys set their options."


def reading(*keys: str) -> str:
    """The optimizers that read every one of `keys`, for an option's help text."""
    return ", ".join(name for name, spec in OPTIMIZERS.items()
                     if all(key in spec.keys for key in keys))


def noted(key: str) -> str:
    """What option `key` means for each optimizer that notes it ("lion: its update
    interpolation"), for the key's help text."""
    return "; ".join(f"{name}: {spec.notes[key]}" for name, spec in OPTIMIZERS.items()
                     if key in spec.notes)


# The train.* option keys (the schema's train section declares them from here), each at
# the value that keeps the optimizer's own default.
OPTION_FIELDS: dict[str, Any] = {
    "optimizer_beta1": _f(0.0, label="Optimizer beta1", min=0.0, max=1.0, advanced=True,
                          help=f"First-moment decay of {reading(*BETAS)} "
                               f"({noted('optimizer_beta1')}); 0 keeps the optimizer's "
                               "default."),
    "optimizer_beta2": _f(0.0, label="Optimizer beta2", min=0.0, max=1.0, advanced=True,
                          help=f"Second-moment decay ({noted('optimizer_beta2')}); 0 keeps "
                               "the optimizer's default."),
    "optimizer_eps": _f(0.0, label="Optimizer epsilon", min=0.0, max=1.0, advanced=True,
                        help=f"{reading('optimizer_eps')}: the denominator's epsilon; 0 "
                             "keeps the optimizer's default."),
    "prodigy_d_coef": _f(1.0, label="Prodigy d_coef", min=0.0, max=1000.0,
                         min_exclusive=True, advanced=True,
                         help="prodigy: scales its estimated step size (below 1 for a "
                              "smaller one)."),
    "prodigy_safeguard_warmup": _f(False, label="Prodigy safeguard warm-up", advanced=True,
                                   help="prodigy: keep the step-size estimate from "
                                        "growing too fast during an LR warm-up."),
}
OPTION_DEFAULTS: dict[str, Any] = {key: f.default for key, f in OPTION_FIELDS.items()}
