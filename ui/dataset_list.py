"""The Dataset tab's list operations: select, add, rename, remove (with undo), move.
Each takes the form's data and returns the updates that show the edited list (the
selected dataset's fields in the editor)."""

from __future__ import annotations

from typing import Any

import gradio as gr

from ui.form import Form
from ui.state import DatasetList, new_dataset, with_editor


def _committed(form: Form, data: dict[Any, Any]) -> DatasetList:
    datasets, _ = with_editor(data[form.datasets], form.editor_values(data))
    return datasets


def on_select(form: Form, data: dict[Any, Any], index: Any) -> dict[Any, Any]:
    """`index`: the clicked entry (gr.SelectData's index). The selector's value is never
    an input: Gradio checks an input against the choices the server last sent, and a
    click in flight while Remove shrank them failed with "Value: 1 is not in the list
    of choices: [0]"."""
    datasets = _committed(form, data)
    if isinstance(index, int) and 0 <= index < len(datasets.items):
        datasets.selected = index
    return form.editor_updates(datasets)


def on_add(form: Form, data: dict[Any, Any]) -> dict[Any, Any]:
    """A new dataset (the first one's settings: ui/state.new_dataset), selected."""
    datasets = _committed(form, data)
    datasets.items.append(new_dataset(datasets.items))
    datasets.selected = len(datasets.items) - 1
    return form.editor_updates(datasets)


def on_rename(form: Form, data: dict[Any, Any]) -> dict[Any, Any]:
    """The list with the id being typed (only the list: the editor keeps its cursor)."""
    datasets = _committed(form, data)
    return {form.selector: gr.Radio(choices=datasets.choices(),
                                    value=datasets.selected if datasets.items else None)}


def on_remove(form: Form, data: dict[Any, Any], removed: gr.State,
              undo: gr.Button) -> dict[Any, Any]:
    """The selected dataset out of the list, kept in `removed` for `undo` (shown, naming
    it): a click on Remove takes a whole dataset's settings, which no confirm protects."""
    datasets = _committed(form, data)
    if not datasets.items:
        return form.editor_updates(datasets)
    index = datasets.selected
    gone = datasets.items.pop(index)
    datasets.selected = max(0, min(index, len(datasets.items) - 1))
    return {**form.editor_updates(datasets), removed: (index, gone),
            undo: gr.update(value=f"Undo remove of '{gone.id}'", visible=True)}


def on_undo_remove(form: Form, data: dict[Any, Any], removed: gr.State,
                   undo: gr.Button) -> dict[Any, Any]:
    """The last removed dataset back at its place (or the end), selected."""
    datasets = _committed(form, data)
    if data[removed] is not None:
        index, gone = data[removed]
        index = min(index, len(datasets.items))
        datasets.items.insert(index, gone)
        datasets.selected = index
    return {**form.editor_updates(datasets), removed: None,
            undo: gr.update(visible=False)}


def on_move(form: Form, data: dict[Any, Any], delta: int) -> dict[Any, Any]:
    datasets = _committed(form, data)
    i, j = datasets.selected, datasets.selected + delta
    if datasets.items and 0 <= j < len(datasets.items):
        datasets.items[i], datasets.items[j] = datasets.items[j], datasets.items[i]
        datasets.selected = j
    return form.editor_updates(datasets)
