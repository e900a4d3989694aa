"""datasets.N.preserve's rules (output preservation, issue 52 item 4): it needs an adapter
to switch off, so a full fine-tune refuses it. The value's choices and preserve_weight's
range (> 0) are the fields' own checks (core/config/checks.py _check_field)."""

from __future__ import annotations

from core.config.schema import Config
from core.problems import Problem, error, warning


def preserved_weights(cfg: Config) -> dict[str, float]:
    """{dataset id: datasets.N.preserve_weight} of the datasets whose target is the base's."""
    return {ds.id: ds.preserve_weight for ds in cfg.datasets if ds.preserve == "base"}


def preserve_line(cfg: Config) -> str | None:
    """The start-up line naming the preserved datasets and what they cost, or None."""
    weights = preserved_weights(cfg)
    if not weights:
        return None
    named = ", ".join(f"'{name}' (weight {weight:g})" for name, weight in weights.items())
    return (f"output preservation: {named}: the target is the base model's prediction "
            "(the LoRA switched off), one extra no-grad forward per sample of these datasets")


def preserve_problems(cfg: Config) -> list[Problem]:
    out: list[Problem] = []
    for i, ds in enumerate(cfg.datasets):
        if not ds.preserve:
            continue
        key = f"datasets.{i}.preserve"
        if cfg.train.method == "full":
            out.append(error(key, f"\"{ds.preserve}\" with train.method = \"full\": the "
                                  "target is the base model's prediction with the LoRA "
                                  "switched off, and a full fine-tune has no adapter to "
                                  "switch off; use train.method = \"lora\" or clear it"))
        elif cfg.train.text_encoder_lora:
            out.append(warning(key, "with train.text_encoder_lora: the base prediction "
                                    "reads the prompts as the trained text encoder encodes "
                                    "them (only the denoiser's adapter is switched off)"))
    return out
