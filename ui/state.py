"""The form's data model, without gradio: which config keys the form shows, and the
conversion between form values and a `Config`.

Form fields are generated from the config dataclasses' field metadata (label, help,
choices, advanced), so a new config key shows up in the UI by itself; ranges (min/max)
are the config check's, reported under the field's label (`field_label`). The
dataset list is per-session state (`DatasetList`): the editor shows one dataset at a
time, and every action reads the list *with the editor's current values applied*, so a
click never acts on a half-committed form.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, get_origin, get_type_hints

from core.config import SECTION_TYPES, Config, DatasetConfig, convert_value
from core.problems import ConfigError, Problem


@dataclass(frozen=True)
class FieldSpec:
    """One form field: the config key and what its metadata says about it."""

    key: str  # "train.max_steps"; dataset fields use their bare name ("resolution")
    name: str
    type: Any
    default: Any
    meta: dict[str, Any]

    @property
    def label(self) -> str:
        return self.meta.get("label") or self.name

    @property
    def advanced(self) -> bool:
        return bool(self.meta.get("advanced"))

    @property
    def is_list(self) -> bool:
        return get_origin(self.type) is list


def _specs(cls: type, prefix: str) -> list[FieldSpec]:
    hints = get_type_hints(cls)
    out = []
    for f in fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        key = f"{prefix}.{f.name}" if prefix else f.name
        out.append(FieldSpec(key, f.name, hints[f.name], default, dict(f.metadata)))
    return out


def section_specs(section: str) -> list[FieldSpec]:
    return _specs(SECTION_TYPES[section], section)


def dataset_specs() -> list[FieldSpec]:
    return _specs(DatasetConfig, "")


def all_section_specs() -> list[FieldSpec]:
    return [spec for name in SECTION_TYPES for spec in section_specs(name)]


def field_label(where: str) -> str | None:
    """The on-screen label of the field a problem's key names ("train.learning_rate":
    "Learning rate"; "datasets.0.images": "Images folder (dataset 1)"), None for a key
    the form does not show (or a path)."""
    parts = where.split(".")
    if len(parts) == 3 and parts[0] == "datasets" and parts[1].isdigit():
        spec = next((s for s in dataset_specs() if s.name == parts[2]), None)
        return None if spec is None else f"{spec.label} (dataset {int(parts[1]) + 1})"
    spec = next((s for s in all_section_specs() if s.key == where), None)
    return None if spec is None else spec.label


# ---------------------------------------------------------------- values <-> config


def to_form_value(spec: FieldSpec, value: Any) -> Any:
    """A config value as the component shows it (lists as one item per line)."""
    return "\n".join(value) if spec.is_list else value


def from_form_value(spec: FieldSpec, value: Any) -> Any:
    """A component's value as `convert_value` takes it (the inverse of `to_form_value`)."""
    if spec.is_list:
        return [line.strip() for line in str(value or "").splitlines() if line.strip()]
    return "" if value is None and spec.type is str else value


def coerce(spec: FieldSpec, value: Any, where: str) -> tuple[Any, Problem | None]:
    """A component's value as the config type, or (default, problem naming the key)."""
    try:
        return convert_value(where, spec.type, from_form_value(spec, value)), None
    except ConfigError as exc:
        return spec.default, exc.problems[0]


@dataclass
class DatasetList:
    """The session's datasets and which one the editor shows."""

    items: list[DatasetConfig] = field(default_factory=list)
    selected: int = 0
    # The page's value until the opening fill: its form is Gradio's blank defaults, which
    # no check may read as the person's form (and save over theirs).
    unfilled: bool = False

    def choices(self) -> list[tuple[str, int]]:
        return [(f"{i + 1}. {ds.id or '(no id)'}", i) for i, ds in enumerate(self.items)]

    def current(self) -> DatasetConfig | None:
        if 0 <= self.selected < len(self.items):
            return self.items[self.selected]
        return None


def dataset_from_values(values: dict[str, Any], key: str) -> tuple[DatasetConfig, list[Problem]]:
    """A DatasetConfig from the editor's values (by field name)."""
    ds, problems = DatasetConfig(), []
    for spec in dataset_specs():
        value, problem = coerce(spec, values.get(spec.name), f"{key}.{spec.name}")
        setattr(ds, spec.name, value)
        if problem:
            problems.append(problem)
    return ds, problems


def with_editor(datasets: DatasetList, editor: dict[str, Any]) -> tuple[DatasetList,
                                                                          list[Problem]]:
    """A copy of the list with the editor's values applied to the selected dataset."""
    out = copy.deepcopy(datasets)
    current = out.current()
    if current is None:
        return out, []
    ds, problems = dataset_from_values(editor, f"datasets.{out.selected}")
    out.items[out.selected] = ds
    return out, problems


def build_config(datasets: DatasetList, editor: dict[str, Any],
                 values: dict[str, Any]) -> tuple[Config, list[Problem]]:
    """The whole form as a Config, plus problems with values that are not numbers."""
    full, problems = with_editor(datasets, editor)
    cfg = Config(datasets=full.items)
    for spec in all_section_specs():
        section = getattr(cfg, spec.key.split(".")[0])
        value, problem = coerce(spec, values.get(spec.key, spec.default), spec.key)
        setattr(section, spec.name, value)
        if problem:
            problems.append(problem)
    return cfg, problems


def config_values(cfg: Config) -> dict[str, Any]:
    """Form values of every section field, by key."""
    out = {}
    for spec in all_section_specs():
        section = getattr(cfg, spec.key.split(".")[0])
        out[spec.key] = to_form_value(spec, getattr(section, spec.name))
    return out


def dataset_values(ds: DatasetConfig | None) -> dict[str, Any]:
    """Editor values of a dataset, by field name (defaults when there is none)."""
    ds = ds or DatasetConfig(id="", images="", vae_cache="")
    return {spec.name: to_form_value(spec, getattr(ds, spec.name)) for spec in dataset_specs()}


# A dataset's own files and role, which a new dataset does not take from the first.
OWN_KEYS = ("id", "images", "vae_cache", "masks", "control", "control_2", "control_3",
            "regularization", "preserve", "preserve_weight")


def new_dataset(existing: list[DatasetConfig]) -> DatasetConfig:
    """A fresh dataset with a unique id and its own cache folder (so no conflict), with
    the first dataset's settings (resolution, bucketing, crop, captions, repeats,
    frames...): a 512 px default beside a 128 px first dataset warned of upscaling at
    once and trained the two unlike."""
    ids = {ds.id for ds in existing}
    n = len(existing) + 1
    while f"data{n}" in ids:
        n += 1
    name = f"data{n}"
    fresh = DatasetConfig()
    out = dataclasses.replace(existing[0]) if existing else DatasetConfig()
    for key in OWN_KEYS:
        setattr(out, key, getattr(fresh, key))
    out.id, out.images, out.vae_cache = name, f"data/{name}", f"cache/{name}/vae"
    return out
