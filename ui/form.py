"""Form components generated from the config's field metadata, and the `Form` object
that reads them back as a `Config` (see ui/state.py for the data model).

Every component is registered in the Form under its config key, so any event can take
`form.inputs()` (a set: the handler receives one dict) and call `form.read(data)`.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from core.config import Config
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


def _hidden_if_video(spec: FieldSpec) -> dict[str, Any]:
    """A video family's key starts hidden; `Form.video_visibility` shows it for one."""
    return {"visible": False} if spec.meta.get("video") else {}


class Form:
    """All form components: section fields by key, dataset editor fields by name."""

    def __init__(self) -> None:
        self.fields: dict[str, gr.components.Component] = {}
        self.editor: dict[str, gr.components.Component] = {}
        self.datasets = gr.State(DatasetList())
        self.selector: gr.Radio | None = None

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
                self.fields[spec.key] = make_component(spec, **_hidden_if_video(spec))

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
                                                        **_hidden_if_video(spec))

    def video_components(self) -> list[gr.components.Component]:
        """The components of keys that apply to a video family only."""
        specs = {s.name: s for s in dataset_specs()}
        out = [c for name, c in self.editor.items() if specs[name].meta.get("video")]
        for name in {k.split(".")[0] for k in self.fields}:
            out += [self.fields[s.key] for s in section_specs(name)
                    if s.meta.get("video") and s.key in self.fields]
        return out

    # ------------------------------------------------------------ reading

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
