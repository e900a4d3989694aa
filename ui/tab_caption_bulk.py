"""Dataset tab, "Edit captions": many captions of the selected dataset at once (find and
replace, a trigger word first or last, a tag removed) and its tags with their counts.

A thin view of core.ops (core/caption/bulk.py): *Preview* lists what would change and
writes nothing; *Apply* writes (each file atomically, through the dataset's own caption
files) and keeps what *Undo* needs to put every file back. A refusal is a message beside
the buttons. After a write the check and the preview refresh (`after`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from core import ops
from ui import render
from ui.context import AppContext
from ui.errors import guarded
from ui.form import Form

KINDS = [("Find and replace", "replace"), ("Add a trigger word first", "prepend"),
         ("Add a tag at the end", "append"), ("Remove a tag", "remove_tag")]
SHOWN = 200  # preview rows
CHANGE_HEADERS = ["image", "caption now", "caption after"]
TAG_HEADERS = ["tag", "captions"]


@dataclass
class BulkArea:
    kind: gr.Dropdown
    find: gr.Textbox
    replace: gr.Textbox
    preview: gr.Button
    apply: gr.Button
    undo: gr.Button
    message: gr.HTML
    changes: gr.Dataframe
    show_tags: gr.Button
    tags: gr.Dataframe
    last: gr.State  # the session's last applied edit's undo (None: nothing to undo)


def build() -> BulkArea:
    with gr.Accordion("Edit captions (many at once)", open=False, elem_id="bulk-area"):
        with gr.Row():
            kind = gr.Dropdown(KINDS, value="replace", label="Edit", scale=1,
                               elem_id="bulk-kind")
            find = gr.Textbox(label="Find (or the word, or tag)", scale=2, elem_id="bulk-find")
            replace = gr.Textbox(label="Replace with", scale=2, elem_id="bulk-replace")
        with gr.Row():
            preview = gr.Button("Preview", size="sm", scale=0, elem_id="bulk-preview")
            apply = gr.Button("Apply", size="sm", scale=0, variant="primary",
                              elem_id="bulk-apply")
            undo = gr.Button("Undo", size="sm", scale=0, interactive=False,
                             elem_id="bulk-undo")
            show_tags = gr.Button("Show tags", size="sm", scale=0, elem_id="bulk-show-tags")
        message = gr.HTML("", elem_id="bulk-message")
        with gr.Row():
            changes = gr.Dataframe(headers=CHANGE_HEADERS, interactive=False, wrap=True,
                                   max_height=300, scale=3, label="What changes",
                                   elem_id="bulk-changes")
            tags = gr.Dataframe(headers=TAG_HEADERS, interactive=False, max_height=300,
                                scale=1, wrap=True, column_widths=["75%", "25%"],
                                label="Tags (click one to use it)", elem_id="bulk-tags")
    return BulkArea(kind, find, replace, preview, apply, undo, message, changes, show_tags,
                    tags, gr.State(None))


def _selected(form: Form, data: dict[Any, Any]) -> tuple[Any, int]:
    """The form's config and the selected dataset's index."""
    cfg, _ = form.read(data)
    return cfg, data[form.datasets].selected


def _rows(changes: list[Any], ctx: AppContext) -> list[list[str]]:
    return [[ctx.relative(c.image), c.before, c.after] for c in changes[:SHOWN]]


def wire(ctx: AppContext, form: Form, area: BulkArea, after: list[dict[str, Any]]) -> None:
    inputs = form.inputs() | {area.kind, area.find, area.replace}

    def edit(data: dict[Any, Any]) -> Any:
        return ops.CaptionEdit(data[area.kind], data[area.find], data[area.replace])

    def refused(exc: ops.OpError) -> dict[Any, Any]:
        return {area.message: render.message_html(exc.message, "warning")}

    @guarded("Preview caption edit", inline=area.message)
    def preview(data: dict[Any, Any]) -> dict[Any, Any]:
        cfg, index = _selected(form, data)
        try:
            changes = ops.preview_caption_edit(cfg, ctx.workspace, index, edit(data))
        except ops.OpError as exc:
            return refused(exc)
        more = f" (the first {SHOWN} shown)" if len(changes) > SHOWN else ""
        text = (f"{len(changes)} caption(s) would change{more}; Apply writes them"
                if changes else "no caption would change")
        return {area.message: render.message_html(text, "info"),
                area.changes: _rows(changes, ctx)}

    @guarded("Apply caption edit", inline=area.message)
    def apply(data: dict[Any, Any]) -> dict[Any, Any]:
        cfg, index = _selected(form, data)
        try:
            changes = ops.preview_caption_edit(cfg, ctx.workspace, index, edit(data))
            undo = ops.apply_caption_edit(cfg, ctx.workspace, index, edit(data))
        except ops.OpError as exc:
            return refused(exc)
        text = f"changed {undo.count} caption(s); Undo puts them back"
        return {area.message: render.message_html(text, "ok"), area.last: undo,
                area.changes: _rows(changes, ctx), area.undo: gr.Button(interactive=True)}

    @guarded("Undo caption edit", inline=area.message)
    def undo(last: Any) -> dict[Any, Any]:
        if last is None:
            return {area.message: render.message_html("nothing to undo", "warning")}
        count = ops.undo_caption_edit(last)
        return {area.message: render.message_html(f"restored {count} caption(s)", "ok"),
                area.last: None, area.undo: gr.Button(interactive=False), area.changes: []}

    @guarded("Show tags", inline=area.message)
    def tags(data: dict[Any, Any]) -> dict[Any, Any]:
        cfg, index = _selected(form, data)
        try:
            return {area.tags: [list(t) for t in ops.dataset_tags(cfg, ctx.workspace, index)],
                    area.message: ""}
        except ops.OpError as exc:
            return refused(exc)

    def pick(evt: gr.SelectData) -> str:
        """The clicked row's tag (whichever cell of it was clicked)."""
        row = getattr(evt, "row_value", None)
        return str(row[0] if row else evt.value)

    outputs = [area.message, area.changes, area.last, area.undo]
    area.preview.click(preview, inputs, outputs, api_visibility="private")
    written = [area.apply.click(apply, inputs, outputs, api_visibility="private"),
               area.undo.click(undo, [area.last], outputs, api_visibility="private")]
    area.show_tags.click(tags, form.inputs(), [area.tags, area.message],
                         api_visibility="private")
    area.tags.select(pick, None, [area.find], api_visibility="private")
    for event in after:
        for done in written:
            done.then(**event)
