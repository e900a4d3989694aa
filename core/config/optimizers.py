"""The optimizer catalogue: one OptimizerSpec per train.optimizer name, the only place an
optimizer's facts live. The class it builds (module, class, the package to install and
the message when it is missing), the train.optimizer_* keys it reads and the constructor
arguments they fill, the arguments it always gets, its state bytes per trained weight
(the memory estimate) and its help text (the schema's train.optimizer help, so the form
and docs/config.md). Data only, no heavy import, so the schema's choices and the config
check read it without torch; core/train/optimizers.py builds from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

    def missing(self, name: str) -> str:
        """The refusal when the package is not installed (the check and the trainer)."""
        return (f"\"{name}\" needs the {self.package} package, which is not installed: "
                f"pip install {self.package}, or use optimizer \"adamw\"")


# State bytes: adamw, adamw8bit and adamw_schedulefree keep two states (schedule-free: z
# and the second moment; 8-bit: one byte each), prodigy four (two moments, its s and the
# starting weights), lion one. adafactor and came factor their second moment into a row
# and a column vector: per weight about 0.25 and 4.5 on LoRA-shaped matrices (measured
# with pytorch-optimizer 4.1.0 and transformers 5.23 on 16 x 3072), rounded up here.
OPTIMIZERS: dict[str, OptimizerSpec] = {
    "adamw": OptimizerSpec("torch.optim", "AdamW", "torch", ADAM, 8, "the default"),
    "adamw8bit": OptimizerSpec("bitsandbytes.optim", "AdamW8bit", "bitsandbytes", ADAM, 2,
                               "8-bit states, a quarter of adamw's memory; CUDA"),
    "prodigy": OptimizerSpec("pytorch_optimizer", "Prodigy", "pytorch-optimizer",
                             (*ADAM, "prodigy_d_coef", "prodigy_safeguard_warmup"), 16,
                             "estimates its own step size: learning_rate is a multiplier, "
                             "usually 1.0",
                             options={"d_coef": "prodigy_d_coef",
                                      "safeguard_warmup": "prodigy_safeguard_warmup"}),
    "adafactor": OptimizerSpec("transformers.optimization", "Adafactor", "transformers",
                               ("optimizer_beta1",), 1,
                               "factored second moments, little memory",
                               {"relative_step": False, "scale_parameter": False,
                                "warmup_init": False}),
    "lion": OptimizerSpec("pytorch_optimizer", "Lion", "pytorch-optimizer", BETAS, 4,
                          "one state, sign updates: use a rate 3-10x below AdamW's"),
    "came": OptimizerSpec("pytorch_optimizer", "CAME", "pytorch-optimizer", BETAS, 5,
                          "confidence-guided, factored"),
    "adamw_schedulefree": OptimizerSpec("pytorch_optimizer", "ScheduleFreeAdamW",
                                        "pytorch-optimizer", ADAM, 8,
                                        "no decay schedule needed: eval, validation and "
                                        "saved weights use its averaged weights"),
}
OPTIMIZER_NAMES = tuple(OPTIMIZERS)
# Option keys and the value meaning "the optimizer's own default" (the schema's defaults).
OPTION_DEFAULTS: dict[str, Any] = {"optimizer_beta1": 0.0, "optimizer_beta2": 0.0,
                                   "optimizer_eps": 0.0, "prodigy_d_coef": 1.0,
                                   "prodigy_safeguard_warmup": False}


def optimizer_help() -> str:
    """train.optimizer's help: every optimizer, its package and what it is for."""
    said = "; ".join(f"{name} ({spec.package}; {spec.help})"
                     for name, spec in OPTIMIZERS.items())
    return f"{said}. The train.optimizer_* keys set their options."


def reading(*keys: str) -> str:
    """The optimizers that read every one of `keys`, for an option's help text."""
    return ", ".join(name for name, spec in OPTIMIZERS.items()
                     if all(key in spec.keys for key in keys))
