"""The Dataset tab's "Upload images": files dropped in the browser are copied into a new
folder `<workspace>/datasets/<name>/` (core/data/upload.py: captions matched by stem,
nothing overwritten, non-images skipped and named), and a dataset pointing at it is added
and selected, its latents cached outside it, then checked as any edit is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from core.ops import dataset_name, upload_images, uploaded_dataset
from ui import render
from ui.actions import ActionError
from ui.context import AppContext
from ui.errors import guarded
from ui.form import Form
from ui.state import with_editor


@dataclass
class UploadBox:
    name: gr.Textbox
    files: gr.File
    go: gr.Button
    message: gr.HTML


def build() -> UploadBox:
    with gr.Accordion("Upload images as a new dataset", open=False, elem_id="upload"):
        name = gr.Textbox(label="New dataset name", value="my-images", elem_id="upload-name",
                          info="Copied into workspace/datasets/<name>/")
        files = gr.File(label="Images and their .txt captions (drag and drop)",
                        file_count="multiple", type="filepath", elem_id="upload-files")
        go = gr.Button("Copy and add the dataset", size="sm", elem_id="upload-go")
        message = gr.HTML("", elem_id="upload-message")
    return UploadBox(name, files, go, message)


def _unique_id(name: str, taken: set[str]) -> str:
    out, n = name, 1
    while out in taken:
        n += 1
        out = f"{name}-{n}"
    return out


def on_upload(ctx: AppContext, form: Form, box: UploadBox,
              data: dict[Any, Any]) -> dict[Any, Any]:
    """Copy the files, then add (or select, when one already reads that folder) the
    dataset; the message says what was copied, renamed and skipped."""
    files = data[box.files] or []
    if not files:
        raise ActionError("drop some images on the upload box first")
    result = upload_images([str(f) for f in files], ctx.workspace, data[box.name])
    if not result.images:
        raise ActionError("none of the uploaded files is an image; " + "; ".join(
            result.notes()[1:]))
    datasets, _ = with_editor(data[form.datasets], form.editor_values(data))
    folder = dataset_name(data[box.name])
    ds = uploaded_dataset(folder, _unique_id(folder, {d.id for d in datasets.items}))
    same = [i for i, d in enumerate(datasets.items)
            if Path(d.images) == Path(ds.images)]
    if same:
        datasets.selected = same[0]
    else:
        datasets.items.append(ds)
        datasets.selected = len(datasets.items) - 1
    notes = result.notes()
    gr.Info(notes[0])
    return {**form.editor_updates(datasets),
            box.message: render.message_html("; ".join(notes), "ok"),
            box.files: None}


def wire(ctx: AppContext, form: Form, box: UploadBox, after: list[dict[str, Any]]) -> None:
    upload = guarded("Upload images", inline=box.message)(
        lambda d: on_upload(ctx, form, box, d))
    event = box.go.click(upload, form.inputs() | {box.name, box.files},
                         [*form.outputs(), box.message, box.files], api_visibility="private")
    for then in after:
        event = event.then(**then)
