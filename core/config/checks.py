"""Rules on a loaded config: every range, choice and cross-key rule (`validate_config`,
no disk access). `resolved`, the copy with paths joined to the workspace, is paths.py's."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any

from core.config.block_swap import block_swap_problems
from core.config.compiling import compile_problems
from core.config.control_checks import control_problems
from core.config.distributed import distributed_problems
from core.config.family_options import foreign_key_problems
from core.config.guidance_target import guidance_target_problems
from core.config.optimizers import OPTIMIZERS, OPTION_DEFAULTS
from core.config.preserve import preserve_problems
from core.config.prompts import negative_prompt_problems, prompt_problems
from core.config.routing import routing_problems
from core.config.schema import CONFIG_VERSION, FAMILIES, SECTION_TYPES, Config
from core.models.objectives import MODE_SCALE
from core.models.quantize import DEQUANTIZED_FOR_BACKWARD
from core.models.registry import families, family_or_defaults, get_family, list_families
from core.models.source import RANDOM_PREFIX, TINY_PREFIX, model_source
from core.models.tiny import tiny_family, tiny_names
from core.problems import Problem, error, warning

# ---------------------------------------------------------------- validation


def _check_field(obj: Any, f: dataclasses.Field, key: str) -> list[Problem]:
    value = getattr(obj, f.name)
    m = f.metadata
    if m.get("choices") and value not in m["choices"]:
        return [error(key, f"must be one of {', '.join(m['choices'])}; got {value!r}")]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, hi = m.get("min"), m.get("max")
        if lo is not None and (value < lo or (m.get("min_exclusive") and value == lo)):
            relation = "greater than" if m.get("min_exclusive") else "at least"
            return [error(key, f"must be {relation} {lo}; got {value}")]
        if hi is not None and (value > hi or (m.get("max_exclusive") and value == hi)):
            relation = "below" if m.get("max_exclusive") else "at most"
            return [error(key, f"must be {relation} {hi}; got {value}")]
    return []


def _check_section(obj: Any, prefix: str) -> list[Problem]:
    out: list[Problem] = []
    for f in fields(obj):
        out += _check_field(obj, f, f"{prefix}.{f.name}")
    return out


def _check_datasets(cfg: Config) -> list[Problem]:
    if not cfg.datasets:
        return [error("datasets", "no dataset yet: add one with an id, its images folder "
                                  "and a folder for its cached latents (vae_cache): the "
                                  "Dataset tab's Add in the web UI, a [[datasets]] section "
                                  "in a config file")]
    out: list[Problem] = []
    seen: dict[str, int] = {}
    for i, ds in enumerate(cfg.datasets):
        key = f"datasets.{i}"
        out += _check_section(ds, key)
        if not ds.id.strip() or any(c in ds.id for c in "/\\:"):
            out.append(error(f"{key}.id", f"must be a non-empty name without / \\ or :, "
                                          f"got {ds.id!r}"))
        elif ds.id in seen:
            out.append(error(f"{key}.id", f"'{ds.id}' is already used by datasets.{seen[ds.id]}"))
        seen.setdefault(ds.id, i)
        for name in ("images", "vae_cache"):
            if not getattr(ds, name).strip():
                out.append(error(f"{key}.{name}", "is empty; set a folder"))
        if ds.caption == "instance_prompt" and not ds.instance_prompt.strip():
            out.append(error(f"{key}.instance_prompt",
                             "is empty but caption = \"instance_prompt\"; write the prompt"))
    if all(ds.probability == 0 for ds in cfg.datasets):
        out.append(error("datasets", "every dataset has probability 0; give one a weight > 0"))
    return out


def _check_cross(cfg: Config) -> list[Problem]:
    out: list[Problem] = []
    source = model_source(cfg.model.path)
    if source.built:
        tiny = source.kind == "tiny"
        fam = tiny_family(source.name) if tiny else source.name.partition(":")[0]
        names = tiny_names() if tiny else list(FAMILIES)
        if fam not in FAMILIES:
            kind, prefix = ("tiny model", TINY_PREFIX) if tiny else ("random family",
                                                                     RANDOM_PREFIX)
            out.append(error("model.path", f"unknown {kind} {source.name!r}; use one of "
                                           f"{', '.join(prefix + n for n in names)}"))
        elif fam != cfg.model.family:
            out.append(error("model.path", f"{cfg.model.path} does not match "
                                           f"model.family = {cfg.model.family!r}"))
    elif not cfg.model.path.strip():
        out.append(error("model.path", "is empty; set a hub id, folder, file or tiny:<family>"))
    for key, value in (("text_cache.dir", cfg.text_cache.dir), ("output.dir", cfg.output.dir)):
        if not value.strip():
            out.append(error(key, "is empty; set a folder"))
    if cfg.launch.num_machines > 1 and not cfg.launch.main_process_ip:
        out.append(error("launch.main_process_ip", "is required when launch.num_machines > 1"))
    if cfg.launch.machine_rank >= cfg.launch.num_machines:
        out.append(error("launch.machine_rank", "must be below launch.num_machines"))
    out += _check_lr_schedule(cfg)
    out += prompt_problems(cfg.validation)
    out += negative_prompt_problems(cfg.validation, _family(cfg))
    if cfg.launch.cpu and cfg.train.mixed_precision == "fp16":
        out.append(error("train.mixed_precision", "fp16 does not run on the CPU; use bf16 or no"))
    out += _check_flow_family(cfg)
    out += _check_flow_objective(cfg)
    out += _check_optimizer(cfg)
    out += _family(cfg).config_problems(cfg)  # the family's own checks
    out += control_problems(cfg, _family(cfg))
    out += _check_text_options(cfg)
    out += _check_ignored_keys(cfg)
    out += _check_lora_kind(cfg)
    out += _check_frames(cfg)
    out += distributed_problems(cfg) + block_swap_problems(cfg)
    out += compile_problems(cfg) + routing_problems(cfg) + preserve_problems(cfg)
    out += guidance_target_problems(cfg)
    if cfg.model.quantize != "none" and cfg.train.method == "full":
        out.append(error("model.quantize", f"{cfg.model.quantize} with train.method = \"full\": "
                                           "a quantized base cannot be fully fine-tuned; use "
                                           "train.method = \"lora\" or model.quantize = \"none\""))
    if (cfg.model.quantize in DEQUANTIZED_FOR_BACKWARD and cfg.train.method == "lora"
            and not cfg.train.gradient_checkpointing):
        out.append(Problem("warning", "train.gradient_checkpointing", (
            f"is off with model.quantize = \"{cfg.model.quantize}\": the backward then keeps "
            "a dequantized copy of every quantized weight, more than the unquantized base "
            "needs; set train.gradient_checkpointing = true")))
    return out


def _family(cfg: Config) -> Any:
    """The chosen family, or one with the defaults (no checks of its own) where
    model.family is unknown (a problem reported with the model keys)."""
    return family_or_defaults(cfg.model.family)


def _names(flags: list[bool]) -> list[str]:
    """The family names, in order, where `flags` (one per family) is true."""
    return [f.name for f, flag in zip(families(), flags, strict=True) if flag]


def _is_flow(name: str) -> bool:
    return name in list_families() and get_family(name).prediction == "flow_matching"


def _check_flow_family(cfg: Config) -> list[Problem]:
    """Keys of the epsilon/v families that mean nothing to a flow-matching family."""
    if not _is_flow(cfg.model.family):
        return []
    out = []
    flows = f"does not apply to {cfg.model.family}, which trains by flow matching"
    if cfg.model.prediction_type != "auto":
        out.append(error("model.prediction_type", f"{cfg.model.prediction_type!r} {flows}; "
                                                  "set it to \"auto\""))
    if cfg.train.noise_offset > 0:
        out.append(error("train.noise_offset", f"{flows} (its noise is not a DDPM "
                                               "schedule's); set it to 0"))
    return out


# train.* keys of the flow objective and their "family default" values.
FLOW_KEYS = {"timestep_sampling": "auto", "logit_mean": 0.0, "logit_std": 1.0,
             "mode_scale": MODE_SCALE, "flow_shift": 0.0, "loss_weighting": "auto"}


def _check_flow_objective(cfg: Config) -> list[Problem]:
    """The flow-matching keys on an epsilon/v family (an error naming each), train.guidance
    on a family without guidance-distilled models, and keys the chosen sampling ignores."""
    t, family = cfg.train, cfg.model.family
    out: list[Problem] = []
    flow_families = _names([f.prediction == "flow_matching" for f in families()])
    guidance_families = _names([f.train_guidance is not None for f in families()])
    if family not in flow_families:
        for key, default in FLOW_KEYS.items():
            if getattr(t, key) != default:
                out.append(error(f"train.{key}", f"applies to flow-matching families only "
                                                 f"({', '.join(flow_families)}); {family} "
                                                 f"trains by epsilon/v prediction: set it "
                                                 f"to {_toml(default)}"))
    if t.guidance and family not in guidance_families:
        out.append(error("train.guidance", f"applies to guidance-distilled models only "
                                           f"({', '.join(guidance_families)} dev); set it to 0 "
                                           f"for {family}"))
    if family not in flow_families or t.timestep_sampling == "auto":
        return out
    ignored = {"logit_mean": t.timestep_sampling not in ("logit_normal", "sigmoid"),
               "logit_std": t.timestep_sampling not in ("logit_normal", "sigmoid"),
               "mode_scale": t.timestep_sampling != "mode",
               "flow_shift": t.timestep_sampling == "sigmoid"}
    for key, unused in ignored.items():
        if unused and getattr(t, key) != FLOW_KEYS[key]:
            out.append(Problem("warning", f"train.{key}", f"has no effect with "
                                                          f"train.timestep_sampling = "
                                                          f"\"{t.timestep_sampling}\""))
    return out


def _toml(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else f"{value:g}"


def _check_optimizer(cfg: Config) -> list[Problem]:
    """Option keys the chosen optimizer ignores (warnings), and the rules of an
    optimizer that averages its weights or estimates its own step size (its spec says)."""
    t = cfg.train
    spec = OPTIMIZERS[t.optimizer] if t.optimizer in OPTIMIZERS else None
    if spec is None:  # an unknown choice is reported by the section check
        return []
    out = [Problem("warning", f"train.{key}", f"has no effect with train.optimizer = "
                                              f"\"{t.optimizer}\"")
           for key, default in OPTION_DEFAULTS.items()
           if key not in spec.keys and getattr(t, key) != default]
    if spec.averages_weights:
        if t.ema:
            out.append(error("train.ema", f"with train.optimizer = \"{t.optimizer}\": "
                                          "schedule-free already averages the weights it "
                                          "evaluates and saves; set train.ema = false"))
        if t.lr_scheduler not in ("constant", "constant_with_warmup"):
            out.append(Problem("warning", "train.lr_scheduler",
                               f"is \"{t.lr_scheduler}\": {t.optimizer} replaces the "
                               "decay schedule; use \"constant_with_warmup\" (or "
                               "\"constant\" without warm-up)"))
    if spec.estimates_step and t.learning_rate < 0.1:
        out.append(Problem("warning", "train.learning_rate",
                           f"is {t.learning_rate:g}: {t.optimizer} estimates the step size "
                           "itself and the rate multiplies it; use about 1.0"))
    return out


def _check_text_options(cfg: Config) -> list[Problem]:
    """train.text_encoder_lora needs CLIP encoders and a LoRA run; keep_tokens needs
    shuffle_tags."""
    out: list[Problem] = []
    if cfg.train.text_encoder_lora and _is_flow(cfg.model.family):
        able = _names([f.text_encoder_lora_targets is not None for f in families()])
        listed = " and ".join([", ".join(able[:-1]), able[-1]] if len(able) > 1 else able)
        out.append(error("train.text_encoder_lora", f"is not supported for "
                                                    f"{cfg.model.family} ({listed} "
                                                    "only); set it to false"))
    elif cfg.train.text_encoder_lora and cfg.train.method != "lora":
        out.append(error("train.text_encoder_lora", "needs train.method = \"lora\"; set "
                                                    "it to false for a full fine-tune"))
    for i, ds in enumerate(cfg.datasets):
        if ds.keep_tokens and not ds.shuffle_tags:
            out.append(Problem("warning", f"datasets.{i}.keep_tokens",
                               "has no effect without shuffle_tags = true"))
    return out


def _check_lr_schedule(cfg: Config) -> list[Problem]:
    """train.lr_*: warm-up past the end, and the keys the chosen schedule ignores."""
    t, out = cfg.train, []
    if t.lr_warmup_steps > t.max_steps:
        out.append(Problem("warning", "train.lr_warmup_steps",
                           "is longer than train.max_steps; the rate never reaches its target"))
    if t.lr_warmup_steps > 0 and t.lr_scheduler == "constant":
        out.append(Problem("warning", "train.lr_warmup_steps", (
            f"is {t.lr_warmup_steps} but train.lr_scheduler = \"constant\" has no warm-up: "
            "it is ignored; use train.lr_scheduler = \"constant_with_warmup\"")))
    if t.lr_scheduler == "polynomial" and t.learning_rate <= 1e-7:
        out.append(error("train.learning_rate", (
            f"is {t.learning_rate:g}: the polynomial schedule decays to 1e-7 and needs a "
            "larger rate; raise it or pick another train.lr_scheduler")))
    for key, default, schedule in (("lr_cycles", 1, "cosine_with_restarts"),
                                   ("lr_power", 1.0, "polynomial")):
        if getattr(t, key) != default and t.lr_scheduler != schedule:
            out.append(Problem("warning", f"train.{key}", (
                f"is {getattr(t, key):g} but only train.lr_scheduler = \"{schedule}\" reads "
                f"it (the schedule is \"{t.lr_scheduler}\"): it is ignored")))
    return out


def _check_ignored_keys(cfg: Config) -> list[Problem]:
    """Keys set to something the run would silently ignore: a warning naming each."""
    out: list[Problem] = []
    if cfg.train.min_snr_gamma > 0 and cfg.model.family in FAMILIES:
        family = get_family(cfg.model.family)  # the family knows its loss, not this file
        if not family.uses_min_snr:
            out.append(Problem("warning", "train.min_snr_gamma", (
                f"is {cfg.train.min_snr_gamma:g} but {family.name} trains by "
                f"{family.prediction.replace('_', ' ')}, where min-SNR weighting does not "
                "apply: it is ignored; set it to 0")))
    if cfg.train.text_encoder_lr > 0 and not cfg.train.text_encoder_lora:
        out.append(Problem("warning", "train.text_encoder_lr", (
            f"is {cfg.train.text_encoder_lr:g} but no text encoder trains "
            "(train.text_encoder_lora = false): it is ignored; set it to 0, or "
            "train.text_encoder_lora = true")))
    return out


def _check_lora_kind(cfg: Config) -> list[Problem]:
    """train.lora_kind applies to an adapter run on an unquantized base: a full
    fine-tune trains no adapter, and the LyCORIS/DoRA layers (which rebuild or normalise
    the base weight) are not supported on quantized layers here."""
    kind = cfg.train.lora_kind
    if kind == "lora":
        return []
    if cfg.train.method != "lora":
        return [error("train.lora_kind", f"{kind!r} is an adapter, but train.method = "
                                         f"\"{cfg.train.method}\" trains the whole model; set "
                                         "train.lora_kind = \"lora\" or train.method = \"lora\"")]
    if cfg.model.quantize != "none":
        return [error("train.lora_kind", f"{kind!r} with model.quantize = "
                                         f"\"{cfg.model.quantize}\": only plain LoRA trains on a "
                                         "quantized base; set train.lora_kind = \"lora\" or "
                                         "model.quantize = \"none\"")]
    return []


def _check_frames(cfg: Config) -> list[Problem]:
    """Frame counts a video family's VAE takes (its geometry's rule); a still-image
    family ignores them, and says so for validation.frames, the one a user sets for
    stills by mistake."""
    family = _family(cfg)
    geometry = family.geometry
    ignored = [warning(f"datasets.{i}.audio", f"is \"{ds.audio}\", but model.family = "
                       f"{cfg.model.family!r} trains no audio; it is ignored")
               for i, ds in enumerate(cfg.datasets) if ds.audio != "auto" and not family.audio]
    if not geometry.video:
        if cfg.validation.frames > 1:
            return [Problem("warning", "validation.frames",
                            f"is {cfg.validation.frames}, but model.family = "
                            f"{cfg.model.family!r} draws still images; it is ignored")]
        return ignored
    keys = [(f"datasets.{i}.frames", ds.frames) for i, ds in enumerate(cfg.datasets)]
    keys.append(("validation.frames", cfg.validation.frames))
    return ignored + [error(key, geometry.frames_hint(n)) for key, n in keys
                      if not geometry.valid_frames(n)]


def validate_config(cfg: Config) -> list[Problem]:
    """Every range, choice and cross-key rule; does not touch the disk."""
    out: list[Problem] = []
    if cfg.version != CONFIG_VERSION:
        out.append(error("version", f"must be {CONFIG_VERSION}"))
    for name in SECTION_TYPES:
        out += _check_section(getattr(cfg, name), name)
    out += _check_datasets(cfg)
    out += _check_cross(cfg)
    out += foreign_key_problems(cfg)
    return out
