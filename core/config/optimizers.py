"""The optimizer catalogue: each train.optimizer name, the class it builds (module, class,
the package to install), the train.optimizer_* keys it reads and the constructor
arguments it always gets. Data only, no heavy import, so the schema's choices and the
config check read it without torch; core/train/optimizers.py builds from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BETAS = ("optimizer_beta1", "optimizer_beta2")


@dataclass(frozen=True)
class OptimizerSpec:
    module: str
    cls: str
    package: str  # what to pip install when the import fails
    keys: tuple[str, ...]  # the train.* option keys it reads
    fixed: dict[str, Any] = field(default_factory=dict)  # constructor arguments always given


OPTIMIZERS: dict[str, OptimizerSpec] = {
    "adamw": OptimizerSpec("torch.optim", "AdamW", "torch", (*BETAS, "optimizer_eps")),
    "adamw8bit": OptimizerSpec("bitsandbytes.optim", "AdamW8bit", "bitsandbytes",
                               (*BETAS, "optimizer_eps")),
    "prodigy": OptimizerSpec("pytorch_optimizer", "Prodigy", "pytorch-optimizer",
                             (*BETAS, "optimizer_eps", "prodigy_d_coef",
                              "prodigy_safeguard_warmup")),
    "adafactor": OptimizerSpec("transformers.optimization", "Adafactor", "transformers",
                               ("optimizer_beta1",),
                               {"relative_step": False, "scale_parameter": False,
                                "warmup_init": False}),
    "lion": OptimizerSpec("pytorch_optimizer", "Lion", "pytorch-optimizer", BETAS),
    "came": OptimizerSpec("pytorch_optimizer", "CAME", "pytorch-optimizer", BETAS),
    "adamw_schedulefree": OptimizerSpec("pytorch_optimizer", "ScheduleFreeAdamW",
                                        "pytorch-optimizer", (*BETAS, "optimizer_eps")),
}
OPTIMIZER_NAMES = tuple(OPTIMIZERS)
# Option keys and the value meaning "the optimizer's own default" (the schema's defaults).
OPTION_DEFAULTS: dict[str, Any] = {"optimizer_beta1": 0.0, "optimizer_beta2": 0.0,
                                   "optimizer_eps": 0.0, "prodigy_d_coef": 1.0,
                                   "prodigy_safeguard_warmup": False}
