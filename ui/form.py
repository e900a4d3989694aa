"""Form components generated from the config's field metadata, and the `Form` object
that reads them back as a `Config` (see ui/state.py for the data model).

Every component is registered in the Form under its config key, so any event can take
`form.inputs()` (a set: the handler receives one dict) and call `form.read(data)`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import gradio as gr

from core.config import Config
from core.config.optimizers import OPTIMIZERS, OPTION_DEFAULTS
from core.ops import TAG_NAMES, family_has
from core.problems import Problem
from ui.state import (
    DatasetList,
    FieldSpec,
    build_config,
    config_values,
    dataset_specs,
    dataset_values,
    section_specs,
    to_form_value,
)


def make_component(spec: FieldSpec, value: Any = None, **extra: Any) -> gr.components.Component:
    """The component a field's type and metadata call for."""
    value = to_form_value(spec, spec.default if value is None else value)
    common: dict[str, Any] = {"label": spec.label, "value": value,
                              "elem_id": "f-" + spec.key.replace(".", "-")}
    if spec.meta.get("help"):
        common["info"] = spec.meta["help"]
    common.update(extra)
    choices = spec.meta.get("choices")
    if choices:
        return gr.Dropdown(choices=list(choices), **common)
    if spec.type is bool:
        return gr.Checkbox(**common)
    if spec.type in (int, float):
        # No minimum/maximum: Gradio would reject the whole event on a value out of range
        # (a toast without the field's name, and no live check until it is fixed); the
        # config check reports ranges instead, naming the field.
        return gr.Number(precision=0 if spec.type is int else None, **common)
    if spec.is_list:
        return gr.Textbox(lines=3, info=common.pop("info", None) or "one per line", **common)
    return gr.Textbox(**common)


# Keys that apply to some runs only carry a metadata tag (core/fields.py: video, edit,
# flow, ddpm, guidance for some families; lora for an adapter run). Each tag's predicate
# on (model.family, train.method) is core/models/tags.py's; a tagged key shows while its
# predicate holds (`Form.wire_family_keys`), so a new tagged key, or a new tag there,
# needs no other wiring.
FAMILY_TAGS: dict[str, Callable[[str, str], bool]] = {
    tag: partial(family_has, tag) for tag in TAG_NAMES}
_DEFAULTS = Config()  # the form's first view, before any fill (an sd15 LoRA run)


def _read_by(optimizer: Any, key: str) -> bool:
    spec = OPTIMIZERS.get(str(optimizer))
    return spec is None or key in spec.keys  # an unknown name: the check names it


# Keys that apply under some values of another setting only: an optimizer's own options
# (the catalogue's keys, core/config/optimizers.py) and a schedule's. Each shows while
# its setting holds such a value, or while it holds other than its default
# (`Form.wire_setting_keys`, as `Form.visibility` does for the family's keys).
SETTING_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "train.lr_cycles": ("train.lr_scheduler", lambda v: v == "cosine_with_restarts"),
    "train.lr_power": ("train.lr_scheduler", lambda v: v == "polynomial"),
    **{f"train.{key}": ("train.optimizer", lambda v, key=key: _read_by(v, key))
       for key in OPTION_DEFAULTS},
}


def _hidden_by_setting(spec: FieldSpec) -> dict[str, Any]:
    """A key of SETTING_RULES starts as the defaults' run has its setting."""
    rule = SETTING_RULES.get(spec.key)
    if rule is None:
        return {}
    section, name = rule[0].split(".")
    return {} if rule[1](getattr(getattr(_DEFAULTS, section), name)) else {"visible": False}


# A family's own key (core/config/family_options.py) carries the tag OWNED + its name.
OWNED = "family:"


def family_tags(spec: FieldSpec) -> tuple[str, ...]:
    """The tags of FAMILY_TAGS that `spec`'s metadata carries, and OWNED + the family
    that declares the key, for a family's own key."""
    owner = (f"{OWNED}{spec.meta['family']}",) if spec.meta.get("family") else ()
    return tuple(tag for tag in FAMILY_TAGS if spec.meta.get(tag)) + owner


def shown_for(tags: tuple[str, ...], family: str, method: str = "lora") -> bool:
    """Whether a key with `tags` applies to model.family `family` and train.method
    `method` (every tag's predicate holds; an untagged key always applies)."""
    return all(tag == OWNED + family if tag.startswith(OWNED) else
               FAMILY_TAGS[tag](family, method) for tag in tags)


def _hidden_if_tagged(spec: FieldSpec) -> dict[str, Any]:
    """A tagged key starts as the defaults' run (an sd15 LoRA) has it;
    `Form.wire_family_keys` follows the form's family and method from there."""
    tags = family_tags(spec)
    if not tags or shown_for(tags, _DEFAULTS.model.family, _DEFAULTS.train.method):
        return {}
    return {"visible": False}


def _differs(value: Any, default: Any) -> bool:
    """Whether a field's value is other than its key's default (a text or list that
    holds something, a number or choice changed); an emptied number is not."""
    if isinstance(value, str) or isinstance(default, str):
        return str(value or "").strip() != str(default or "").strip()
    if isinstance(value, list) or isinstance(default, list):
        return bool(value)
    if value is None:
        return False
    if isinstance(default, bool) or isinstance(value, bool):
        return bool(value) != bool(default)
    try:
        return float(value) != float(default)
    except (TypeError, ValueError):
        return value != default


class Form:
    """All form components: section fields by key, dataset editor fields by name."""

    def __init__(self) -> None:
        self.fields: dict[str, gr.components.Component] = {}
        self.editor: dict[str, gr.components.Component] = {}
        self.datasets = gr.State(DatasetList(unfilled=True))
        self.selector: gr.Radio | None = None
        # Rows that hold only tagged keys (and those keys' names), shown and hidden with
        # them: a row of hidden fields would still leave its gap in the page.
        self.family_rows: list[tuple[gr.Row, tuple[str, ...], tuple[str, ...]]] = []

    # ------------------------------------------------------------ building

    def section(self, name: str, advanced: bool | None = None,
                only: tuple[str, ...] | None = None) -> None:
        """Render the fields of a section (all, or only basic/advanced, or the named ones
        in the order named)."""
        specs = section_specs(name)
        if only is not None:
            by_name = {spec.name: spec for spec in specs}
            specs = [by_name[n] for n in only if n in by_name]
        for spec in specs:
            if advanced is not None and spec.advanced != advanced:
                continue
            if spec.key not in self.fields:
                self.fields[spec.key] = make_component(
                    spec, **_hidden_if_tagged(spec), **_hidden_by_setting(spec))

    def section_rows(self, name: str, advanced: bool, per_row: int = 5) -> None:
        """The section's basic or advanced fields, `per_row` to a row."""
        names = [s.name for s in section_specs(name) if s.advanced == advanced]
        for start in range(0, len(names), per_row):
            with gr.Row():
                self.section(name, only=tuple(names[start:start + per_row]))

    def dataset_editor(self, names: tuple[str, ...]) -> None:
        for spec in dataset_specs():
            if spec.name in names:
                # Disabled until a dataset exists: typing there first would be lost.
                self.editor[spec.name] = make_component(spec, elem_id=f"ds-{spec.name}",
                                                        interactive=False,
                                                        **_hidden_if_tagged(spec))

    def family_keys(self) -> list[tuple[gr.components.Component, tuple[str, ...]]]:
        """The components of keys that apply to some families only, with their tags."""
        specs = {s.name: s for s in dataset_specs()}
        out = [(c, family_tags(specs[name])) for name, c in self.editor.items()]
        for name in {k.split(".")[0] for k in self.fields}:
            out += [(self.fields[s.key], family_tags(s)) for s in section_specs(name)
                    if s.key in self.fields]
        return [(c, tags) for c, tags in out if tags]

    def _defaults(self) -> dict[int, Any]:
        """Each component's key default, by the component's id."""
        specs = [(self.editor.get(s.name), s) for s in dataset_specs()]
        for name in {k.split(".")[0] for k in self.fields}:
            specs += [(self.fields.get(s.key), s) for s in section_specs(name)]
        return {id(c): spec.default for c, spec in specs if c is not None}

    def tagged(self, tag: str) -> list[gr.components.Component]:
        """The components of keys tagged `tag` ("video", "edit")."""
        return [c for c, tags in self.family_keys() if tag in tags]

    def family_row(self, tag: str, names: tuple[str, ...]) -> None:
        """A row of the dataset editor holding keys tagged `tag` only (`names`), hidden
        until model.family is a family they apply to."""
        with gr.Row(visible=False) as row:
            self.dataset_editor(names)
        self.family_rows.append((row, (tag,), names))

    def wire_family_keys(self) -> None:
        """Show each tagged key while the run is one it applies to (`visibility`), on
        every change of model.family and train.method."""
        keys = self.family_keys()
        rows = [row for row, _, _ in self.family_rows]
        triggers = [self.fields["model.family"], self.fields["train.method"]]

        def update(family: str, method: str, *values: Any) -> list[Any]:
            return self.visibility(family, method, list(values))

        for trigger in triggers:
            trigger.change(update, [*triggers, *[c for c, _ in keys]],
                           [*[c for c, _ in keys], *rows],
                           api_visibility="private", show_progress="hidden")

    def wire_setting_keys(self) -> None:
        """Show each key of SETTING_RULES while its setting's value uses it (or while it
        holds other than its default), on every change of that setting."""
        settings = {setting for setting, _ in SETTING_RULES.values()}
        for setting in settings:
            keys = [k for k, (s, _) in SETTING_RULES.items()
                    if s == setting and k in self.fields]
            if setting not in self.fields or not keys:
                continue

            def update(value: Any, *values: Any, keys: list[str] = keys) -> list[Any]:
                return [gr.update(visible=SETTING_RULES[k][1](value)
                                  or _differs(v, self._defaults()[id(self.fields[k])]))
                        for k, v in zip(keys, values, strict=True)]

            self.fields[setting].change(
                update, [self.fields[setting], *[self.fields[k] for k in keys]],
                [self.fields[k] for k in keys], api_visibility="private",
                show_progress="hidden")

    def visibility(self, family: str, method: str, values: list[Any]) -> list[Any]:
        """Updates for `family_keys()` (whose `values` are given) and then the family
        rows: shown where the key applies, or while it holds other than its default:
        hidden, a key stays in the config, and one the check refuses (a flow key on
        sd15, a control folder for a family that takes none) must stay in sight, where
        its error can be fixed."""
        keys = self.family_keys()
        defaults = self._defaults()
        held = {id(c): _differs(v, defaults.get(id(c)))
                for (c, _), v in zip(keys, values, strict=True)}
        out = [gr.update(visible=shown_for(tags, family, method) or held[id(c)])
               for c, tags in keys]
        editors = {name: self.editor[name] for name in self.editor}
        for _, tags, names in self.family_rows:
            members = [editors[n] for n in names if n in editors]
            out.append(gr.update(visible=shown_for(tags, family, method)
                                 or any(held.get(id(c), False) for c in members)))
        return out

    # ------------------------------------------------------------ reading

    def edit_triggers(self) -> list[Any]:
        """The person's edits of any field (`edit_triggers_of`)."""
        return [trigger for component in [*self.editor.values(), *self.fields.values()]
                for trigger in edit_triggers_of(component)]

    def inputs(self) -> set[gr.components.Component]:
        return {self.datasets, *self.editor.values(), *self.fields.values()}

    def read(self, data: dict[Any, Any]) -> tuple[Config, list[Problem]]:
        """The form as a Config (editor applied) and problems with unparsable values."""
        editor = {name: data[c] for name, c in self.editor.items()}
        values = {key: data[c] for key, c in self.fields.items()}
        return build_config(data[self.datasets], editor, values)

    def field_id(self, where: str, selected: int) -> str | None:
        """The element id of the field a problem's key names (the editor's for the
        selected dataset), None for a key the form does not show."""
        parts = where.split(".")
        if len(parts) == 3 and parts[:2] == ["datasets", str(selected)] \
                and parts[2] in self.editor:
            return f"ds-{parts[2]}"
        return "f-" + where.replace(".", "-") if where in self.fields else None

    def field_marks(self, data: dict[Any, Any], problems: list[Problem]) -> str:
        """A style sheet marking the fields that have problems (ui/render.py)."""
        from ui.render import field_marks_html

        selected = data[self.datasets].selected
        marks = [(elem_id, p) for p in problems
                 if (elem_id := self.field_id(p.where, selected)) is not None]
        return field_marks_html(marks)

    def editor_values(self, data: dict[Any, Any]) -> dict[str, Any]:
        return {name: data[c] for name, c in self.editor.items()}

    # ------------------------------------------------------------ writing

    def editor_updates(self, datasets: DatasetList) -> dict[Any, Any]:
        values = dataset_values(datasets.current())
        editable = datasets.current() is not None
        out: dict[Any, Any] = {c: gr.update(value=values[name], interactive=editable)
                               for name, c in self.editor.items()}
        if self.selector is not None:
            out[self.selector] = gr.Radio(choices=datasets.choices(),
                                          value=datasets.selected if datasets.items else None)
        out[self.datasets] = datasets
        return out

    def fill(self, cfg: Config) -> dict[Any, Any]:
        """Updates that show `cfg` in every field (and its datasets in the editor)."""
        values = config_values(cfg)
        out: dict[Any, Any] = {c: values[key] for key, c in self.fields.items()}
        out.update(self.editor_updates(DatasetList(list(cfg.datasets), 0)))
        return out

    def outputs(self) -> list[gr.components.Component]:
        extra = [self.selector] if self.selector is not None else []
        return [self.datasets, *extra, *self.editor.values(), *self.fields.values()]


def edit_triggers_of(component: Any) -> list[Any]:
    """The person's edits of one field, not a fill's writes (a fill runs what it must
    once afterwards; on .change, each field it wrote fired its own event). Gradio's
    .input of a text box follows key presses: its .blur and .submit catch a paste with
    the mouse and a browser's autofill; a number commits when it is left or entered. A
    dropdown's .input also fires when it is redrawn while focused (each check's reply
    redrew it: a loop), so a dropdown counts its choices (.select)."""
    if isinstance(component, gr.Dropdown):
        return [component.select]
    if isinstance(component, gr.Number):
        return [component.blur, component.submit]
    if isinstance(component, gr.Textbox):
        return [component.input, component.blur, component.submit]
    return [component.input]
