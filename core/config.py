"""The one typed config: dataclasses whose field metadata drives CLI, validation and UI.

The TOML format is fixed by ../shared/DESIGN.md (`version = 1`). `load_config` reads it,
`apply_overrides` takes `--set key=value`, `validate_config` checks ranges and choices,
`dumps_config` writes it back in a canonical form (presets round-trip exactly).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from core.problems import ConfigError, Problem, error

CONFIG_VERSION = 1
FAMILIES = ("sd15", "sd2", "sdxl", "sd3", "flux")
CAPTION_STRATEGIES = ("textfile", "filename", "jsonl", "instance_prompt")


def meta(
    label: str,
    help: str = "",
    *,
    choices: tuple[str, ...] | None = None,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
    kind: str = "",
    advanced: bool = False,
) -> dict[str, Any]:
    """Field metadata. `kind="path"` marks paths resolved against the workspace."""
    return {
        "label": label,
        "help": help,
        "choices": choices,
        "min": min,
        "max": max,
        "min_exclusive": min_exclusive,
        "kind": kind,
        "advanced": advanced,
    }


def _f(default: Any, **kwargs: Any) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta(**kwargs))
    return field(default=default, metadata=meta(**kwargs))


@dataclass
class ModelConfig:
    family: str = _f("sd15", label="Model family", choices=FAMILIES,
                     help="Architecture of the base model.")
    path: str = _f("tiny:sd15", label="Model path", kind="model_path",
                   help="Hub id, local diffusers folder, single-file .safetensors, "
                        "or tiny:<family> for a tiny offline model.")


@dataclass
class DatasetConfig:
    id: str = _f("data", label="Dataset id", help="A short unique name.")
    images: str = _f("", label="Images folder", kind="path")
    vae_cache: str = _f("", label="VAE latent cache folder", kind="path",
                        help="Must not be the images folder or inside it; one per dataset.")
    caption: str = _f("textfile", label="Captions", choices=CAPTION_STRATEGIES,
                      help="textfile: sidecar .txt; filename: the file name; "
                           "jsonl: metadata.jsonl (file_name, text); instance_prompt: one prompt.")
    instance_prompt: str = _f("", label="Instance prompt")
    resolution: int = _f(512, label="Resolution", min=64, max=4096,
                         help="Target side in pixels; buckets keep about resolution² pixels.")
    bucketing: bool = _f(True, label="Aspect buckets")
    crop: str = _f("center", label="Crop", choices=("center", "random", "none"))
    repeats: int = _f(1, label="Repeats", min=1, max=10000)
    probability: float = _f(1.0, label="Sampling weight", min=0.0, max=1e6,
                            help="Relative chance a step draws from this dataset.")


@dataclass
class TextCacheConfig:
    dir: str = _f("cache/text", label="Text-embedding cache folder", kind="path")


@dataclass
class TrainConfig:
    method: str = _f("lora", label="Method", choices=("lora", "full"))
    lora_rank: int = _f(16, label="LoRA rank", min=1, max=1024)
    lora_alpha: float = _f(0.0, label="LoRA alpha", min=0.0, max=4096, advanced=True,
                           help="0 means alpha = rank.")
    lora_targets: str = _f("attention", label="LoRA targets", choices=("attention", "all"),
                           advanced=True, help="attention: the attention projections "
                           "(diffusers' examples); all: also convolutions and feed-forwards "
                           "(LoCon style, more capacity).")
    max_steps: int = _f(1000, label="Max steps", min=1, max=10_000_000)
    batch_size: int = _f(1, label="Batch size", min=1, max=4096)
    grad_accum: int = _f(1, label="Gradient accumulation", min=1, max=4096)
    learning_rate: float = _f(1e-4, label="Learning rate", min=0.0, max=1.0, min_exclusive=True)
    lr_scheduler: str = _f("constant", label="LR schedule", advanced=True,
                           choices=("constant", "linear", "cosine"))
    lr_warmup_steps: int = _f(0, label="Warm-up steps", min=0, max=10_000_000, advanced=True)
    optimizer: str = _f("adamw", label="Optimizer", choices=("adamw", "adamw8bit"),
                        advanced=True, help="adamw8bit needs bitsandbytes.")
    weight_decay: float = _f(0.01, label="Weight decay", min=0.0, max=10.0, advanced=True)
    max_grad_norm: float = _f(1.0, label="Gradient clip norm", min=0.0, max=1e6, advanced=True,
                              help="0 disables clipping.")
    seed: int = _f(42, label="Seed", min=0, max=2**63 - 1)
    mixed_precision: str = _f("no", label="Mixed precision", choices=("no", "fp16", "bf16"))
    gradient_checkpointing: bool = _f(False, label="Gradient checkpointing", advanced=True)
    min_snr_gamma: float = _f(0.0, label="Min-SNR gamma", min=0.0, max=100.0, advanced=True,
                              help="0 disables min-SNR weighting (epsilon/v families only).")
    ema: bool = _f(False, label="EMA of weights", advanced=True)
    ema_decay: float = _f(0.999, label="EMA decay", min=0.0, max=1.0, advanced=True)
    checkpoint_every: int = _f(250, label="Checkpoint every (steps)", min=1, max=10_000_000)
    keep_checkpoints: int = _f(3, label="Checkpoints kept", min=1, max=1000)
    eval_every: int = _f(50, label="Eval every (steps)", min=1, max=10_000_000, advanced=True)
    eval_images: int = _f(8, label="Eval images", min=1, max=1000, advanced=True)


@dataclass
class ValidationConfig:
    prompts: list[str] = _f(["a red circle"], label="Validation prompts")
    every: int = _f(100, label="Validate every (steps)", min=1, max=10_000_000)
    steps: int = _f(20, label="Sampling steps", min=1, max=1000)
    seed: int = _f(0, label="Validation seed", min=0, max=2**63 - 1)
    guidance_scale: float = _f(5.0, label="Guidance scale", min=0.0, max=100.0, advanced=True)
    resolution: int = _f(512, label="Validation resolution", min=64, max=4096, advanced=True)


@dataclass
class OutputConfig:
    dir: str = _f("runs/run", label="Output folder", kind="path")


@dataclass
class LaunchConfig:
    num_processes: int = _f(1, label="Processes", min=1, max=4096,
                            help="Processes per machine (usually one per GPU).")
    cpu: bool = _f(False, label="Force CPU")
    num_machines: int = _f(1, label="Machines", min=1, max=4096, advanced=True)
    machine_rank: int = _f(0, label="Machine rank", min=0, max=4095, advanced=True)
    main_process_ip: str = _f("", label="Main process IP", advanced=True)
    main_process_port: int = _f(29500, label="Main process port", min=1, max=65535,
                                advanced=True)


@dataclass
class Config:
    version: int = CONFIG_VERSION
    model: ModelConfig = field(default_factory=ModelConfig)
    datasets: list[DatasetConfig] = field(default_factory=list)
    text_cache: TextCacheConfig = field(default_factory=TextCacheConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)


SECTIONS = ("model", "datasets", "text_cache", "train", "validation", "output", "launch")


# ---------------------------------------------------------------- reading


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, "a list of strings" if get_origin(tp) is list else str(tp)
    )


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Check a TOML value against the field's type (ints are accepted for floats)."""
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif tp is str:
        ok = isinstance(value, str)
    elif get_origin(tp) is list and get_args(tp) == (str,):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    else:
        raise TypeError(f"unsupported field type for {key}: {tp}")
    if not ok:
        raise ConfigError([error(key, f"expected {_type_name(tp)}, got {value!r}")])
    return value


def _unknown(key: str, name: str, known: list[str]) -> Problem:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else f"; known keys: {', '.join(known)}"
    return error(key, f"unknown key{hint}")


def _build_section(cls: type, data: Any, prefix: str, problems: list[Problem]) -> Any:
    if not isinstance(data, dict):
        problems.append(error(prefix, f"expected a table, got {data!r}"))
        return cls()
    hints = get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}.{name}"
        if name not in known:
            problems.append(_unknown(key, name, known))
            continue
        try:
            kwargs[name] = _coerce(key, hints[name], value)
        except ConfigError as exc:
            problems.extend(exc.problems)
    return cls(**kwargs)


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build a Config from parsed TOML, collecting every unknown key and type error."""
    problems: list[Problem] = []
    version = data.get("version", CONFIG_VERSION)
    if version != CONFIG_VERSION:
        problems.append(error("version", f"unsupported config version {version!r}; "
                                         f"this app reads version {CONFIG_VERSION}"))
    cfg = Config()
    section_types = {f.name: f for f in fields(Config)}
    for name, value in data.items():
        if name == "version":
            continue
        if name not in SECTIONS:
            problems.append(_unknown(name, name, ["version", *SECTIONS]))
        elif name == "datasets":
            if not isinstance(value, list):
                problems.append(error("datasets", "expected [[datasets]] tables"))
                continue
            cfg.datasets = [
                _build_section(DatasetConfig, item, f"datasets.{i}", problems)
                for i, item in enumerate(value)
            ]
        else:
            cls = get_type_hints(Config)[section_types[name].name]
            setattr(cfg, name, _build_section(cls, value, name, problems))
    if problems:
        raise ConfigError(problems)
    return cfg


def loads_config(text: str, source: str = "<config>") -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([error(source, f"not valid TOML: {exc}")]) from None
    return config_from_dict(data)


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([error(str(path), "config file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([error(str(path), f"cannot read config: {exc}")]) from None
    return loads_config(text, str(path))


# ---------------------------------------------------------------- writing


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            raise ValueError(f"cannot write {value} to TOML config")
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        import json

        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _section_lines(header: str, obj: Any) -> list[str]:
    lines = [header]
    for f in fields(obj):
        lines.append(f"{f.name} = {_toml_value(getattr(obj, f.name))}")
    return lines


def dumps_config(cfg: Config) -> str:
    """Canonical TOML: every key, in declaration order. Presets are stored in this form."""
    blocks = [[f"version = {cfg.version}"], _section_lines("[model]", cfg.model)]
    blocks += [_section_lines("[[datasets]]", ds) for ds in cfg.datasets]
    for name in ("text_cache", "train", "validation", "output", "launch"):
        blocks.append(_section_lines(f"[{name}]", getattr(cfg, name)))
    return "\n\n".join("\n".join(b) for b in blocks) + "\n"


def save_config(cfg: Config, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # two writers never share one
    tmp.write_text(dumps_config(cfg), encoding="utf-8")
    tmp.replace(path)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# ---------------------------------------------------------------- --set overrides

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _parse_scalar(key: str, tp: Any, text: str) -> Any:
    try:
        if tp is bool:
            low = text.strip().lower()
            if low in _TRUE | _FALSE:
                return low in _TRUE
            raise ValueError
        if tp is int:
            return int(text.strip().replace("_", ""))
        if tp is float:
            value = float(text.strip())
            if math.isnan(value) or math.isinf(value):
                raise ValueError
            return value
    except ValueError:
        raise ConfigError([error(key, f"expected {_type_name(tp)}, got {text!r}")]) from None
    if tp is str:
        return text
    if get_origin(tp) is list:
        stripped = text.strip()
        if stripped.startswith("["):
            try:
                value = tomllib.loads(f"v = {stripped}")["v"]
            except tomllib.TOMLDecodeError:
                value = None
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return value
            raise ConfigError([error(key, f'expected a list like ["a", "b"], got {text!r}')])
        return [text]
    raise TypeError(tp)


def _split_override(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError([error(item, "--set expects key=value, e.g. train.max_steps=20")])
    return key.strip(), value


def _resolve_target(cfg: Config, key: str) -> tuple[Any, str]:
    """Walk a dotted key to (object, field name); `datasets.N` with N == len appends one."""
    parts = key.split(".")
    obj: Any = cfg
    for depth, part in enumerate(parts[:-1]):
        here = ".".join(parts[: depth + 1])
        if isinstance(obj, list):
            if not part.isdigit():
                raise ConfigError([error(key, f"'{here}' needs a list index")])
            index = int(part)
            if index == len(obj) and obj is cfg.datasets:
                obj.append(DatasetConfig(id=f"data{index}"))
            if index >= len(obj):
                raise ConfigError([error(key, f"index {index} out of range ({len(obj)} items)")])
            obj = obj[index]
            continue
        names = [f.name for f in fields(obj)]
        if part not in names:
            raise ConfigError([_unknown(key, part, names)])
        obj = getattr(obj, part)
    return obj, parts[-1]


def apply_override(cfg: Config, item: str) -> None:
    """Apply one `key=value`, converting the text to the field's type."""
    key, text = _split_override(item)
    obj, name = _resolve_target(cfg, key)
    if isinstance(obj, list):
        if not name.isdigit() or int(name) > len(obj) or obj is cfg.datasets:
            raise ConfigError([error(key, "expected a list index within range")])
        if int(name) == len(obj):
            obj.append(text)
        else:
            obj[int(name)] = text
        return
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise ConfigError([error(key, "is not a settable key")])
    names = [f.name for f in fields(obj)]
    if name not in names:
        raise ConfigError([_unknown(key, name, names)])
    tp = get_type_hints(type(obj))[name]
    if dataclasses.is_dataclass(tp) or get_origin(tp) is list and get_args(tp) != (str,):
        raise ConfigError([error(key, "is a section; set one of its keys instead")])
    setattr(obj, name, _parse_scalar(key, tp, text))


def apply_overrides(cfg: Config, items: list[str]) -> Config:
    """Apply every override, collecting all problems before raising."""
    problems: list[Problem] = []
    for item in items:
        try:
            apply_override(cfg, item)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return cfg


# ---------------------------------------------------------------- paths


def resolve_path(value: str, workspace: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else workspace / p


def resolved(cfg: Config, workspace: str | Path) -> Config:
    """A copy with every path field absolute (relative ones joined to the workspace).

    `model.path` is joined only when it names something that exists there, because it
    may also be a hub id such as `org/model` or `tiny:sd15`.
    """
    workspace = Path(workspace).expanduser().absolute()
    out = dataclasses.replace(cfg)
    for name in ("model", "text_cache", "train", "validation", "output", "launch"):
        setattr(out, name, dataclasses.replace(getattr(cfg, name)))
    out.datasets = [dataclasses.replace(ds) for ds in cfg.datasets]
    for obj in (out.text_cache, out.output, *out.datasets):
        for f in fields(obj):
            if f.metadata.get("kind") == "path" and getattr(obj, f.name):
                setattr(obj, f.name, str(resolve_path(getattr(obj, f.name), workspace)))
    model_path = out.model.path
    if model_path and not model_path.startswith("tiny:"):
        candidate = resolve_path(model_path, workspace)
        if Path(model_path).expanduser().is_absolute() or candidate.exists():
            out.model.path = str(candidate)
    return out


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
        if hi is not None and value > hi:
            return [error(key, f"must be at most {hi}; got {value}")]
    return []


def _check_section(obj: Any, prefix: str) -> list[Problem]:
    out: list[Problem] = []
    for f in fields(obj):
        out += _check_field(obj, f, f"{prefix}.{f.name}")
    return out


def _check_datasets(cfg: Config) -> list[Problem]:
    if not cfg.datasets:
        return [error("datasets", "no dataset configured; add a [[datasets]] table with "
                                  "id, images and vae_cache")]
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
    if cfg.model.path.startswith("tiny:"):
        fam = cfg.model.path.removeprefix("tiny:")
        if fam not in FAMILIES:
            out.append(error("model.path", f"unknown tiny family {fam!r}; use one of "
                                           f"{', '.join('tiny:' + f for f in FAMILIES)}"))
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
    if cfg.train.lr_warmup_steps > cfg.train.max_steps:
        out.append(Problem("warning", "train.lr_warmup_steps",
                           "is longer than train.max_steps; the rate never reaches its target"))
    if cfg.launch.cpu and cfg.train.mixed_precision == "fp16":
        out.append(error("train.mixed_precision", "fp16 does not run on the CPU; use bf16 or no"))
    return out


def validate_config(cfg: Config) -> list[Problem]:
    """Every range, choice and cross-key rule; does not touch the disk."""
    out: list[Problem] = []
    if cfg.version != CONFIG_VERSION:
        out.append(error("version", f"must be {CONFIG_VERSION}"))
    for name in ("model", "text_cache", "train", "validation", "output", "launch"):
        out += _check_section(getattr(cfg, name), name)
    out += _check_datasets(cfg)
    out += _check_cross(cfg)
    return out
