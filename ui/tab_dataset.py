"""Dataset tab: the dataset list (add, remove, reorder), the editor of the selected one,
the live check (directory conflicts, bad files: errors block launch, warnings do not),
the bucket histogram and a preview of images (a video family's clips, each shown by its
first frame; an edit family's pairs, the control image(s) beside the target) with editable
captions.

Preview thumbnails are sent as small in-memory images, so a dataset folder outside the
workspace is shown without ever being served as files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import gradio as gr

from core.config import Config, DatasetConfig, resolved
from core.ops import CheckReport, family_has
from core.problems import samples_said
from ui import actions, render, tab_upload
from ui.context import AppContext
from ui.dataset_list import on_add, on_move, on_remove, on_rename, on_select, on_undo_remove
from ui.errors import guarded
from ui.form import FAMILY_TAGS, Form, edit_triggers_of
from ui.preview_items import clip_label, item_name, pair_label, thumbnails
from ui.state import dataset_specs

PREVIEW_LIMIT = 48  # images a page of the preview shows
# Every event that draws the preview (an editor field, a list button, a fill, a page turn)
# waits for the one drawing it now, in the order they came: two running side by side
# could end in either order, and a preview of the form before the last edit drawn last.
ONE_PREVIEW_AT_A_TIME = {"concurrency_id": "dataset-preview", "concurrency_limit": 1,
                         "api_visibility": "private"}
CAPTION_HEADERS = ["image", "caption"]


@dataclass
class DatasetTab:
    add: gr.Button
    remove: gr.Button
    up: gr.Button
    down: gr.Button
    check_html: gr.HTML
    histogram: gr.BarPlot
    preview: gr.Gallery
    preview_note: gr.Markdown
    preview_paths: gr.State
    refresh: gr.Button
    caption_path: gr.Textbox
    caption_text: gr.Textbox
    caption_save: gr.Button
    caption_message: gr.HTML  # beside Save caption: saved, or what to do first
    upload: tab_upload.UploadBox
    page: gr.State  # the preview's page, from 0
    prev: gr.Button
    next: gr.Button
    captions: gr.Dataframe  # the shown images' full captions (a thumbnail's is cut)
    undo_remove: gr.Button  # shown after Remove: puts the removed dataset back
    removed: gr.State  # (index, DatasetConfig) of the last Remove, for undo_remove


def build(form: Form) -> DatasetTab:
    with gr.Row():
        with gr.Column(scale=1, min_width=220):
            # interactive: no event takes its value (it is read from its select event)
            form.selector = gr.Radio(label="Datasets", choices=[], elem_id="ds-selector",
                                     info="Click one to edit it", interactive=True)
            with gr.Row():
                add = gr.Button("Add", size="sm", elem_id="ds-add")
                remove = gr.Button("Remove", size="sm", variant="stop", elem_id="ds-remove")
            undo_remove = gr.Button("Undo remove", size="sm", visible=False,
                                    elem_id="ds-undo-remove")
            with gr.Row():
                up = gr.Button("Move up", size="sm", elem_id="ds-up")
                down = gr.Button("Move down", size="sm", elem_id="ds-down")
            upload = tab_upload.build()
        with gr.Column(scale=3):
            with gr.Row():
                form.dataset_editor(("id", "images", "vae_cache"))
            with gr.Row():
                form.dataset_editor(("caption", "instance_prompt", "crop"))
            with gr.Row():
                form.dataset_editor(("resolution", "bucketing", "repeats", "probability",
                                     "shuffle_tags", "keep_tokens"))
            # Keys of some families only, a row per tag (a video family's frames, fps,
            # clips; an edit family's control folder), shown only for such a family
            # (Form.wire_family_keys).
            # A key with two tags (audio: video and audio) sits in its first tag's row,
            # and its own tags show or hide it there.
            placed: set[str] = set()
            for tag in FAMILY_TAGS:
                names = tuple(s.name for s in dataset_specs()
                              if s.meta.get(tag) and not s.advanced and s.name not in placed)
                if names:  # the tags of dataset keys (video, edit) get a row
                    form.family_row(tag, names)
                    placed.update(names)
            # Every dataset key marked advanced (loss masks, regularization, ...) from
            # the schema's metadata, so a new one shows up here by itself.
            with gr.Accordion("Advanced", open=False, elem_id="ds-advanced"), gr.Row():
                form.dataset_editor(tuple(s.name for s in dataset_specs() if s.advanced))
    gr.Markdown("### Check")
    check_html = gr.HTML("<div>No dataset yet: press Add and choose its images folder, or "
                         "upload images.</div>", elem_id="check-panel")
    # No fixed height: a fixed one clips the legend below the axis down to its title.
    histogram = gr.BarPlot(x="bucket", y="images", color="dataset",
                           label="Aspect buckets (images per bucket)",
                           elem_id="bucket-histogram")
    gr.Markdown("### Preview")
    with gr.Row():
        preview_note = gr.Markdown("", elem_id="preview-note")
        refresh = gr.Button("Refresh preview", size="sm", scale=0)
    with gr.Row():
        # "page", not "images": a video dataset's pages show clips
        prev = gr.Button("Previous page", size="sm", scale=0, elem_id="preview-prev")
        next_ = gr.Button("Next page", size="sm", scale=0, elem_id="preview-next")
    with gr.Row():
        # contain: an edit pair (control | target) is twice as wide as high, and a
        # cropped thumbnail would hide half of it (and the edges of any other image).
        preview = gr.Gallery(label="Images and captions (click one to edit its caption)",
                             columns=6, height=360, elem_id="preview", allow_preview=False,
                             scale=3, object_fit="contain")
        captions = gr.Dataframe(headers=CAPTION_HEADERS, label="Captions (in full)",
                                interactive=False, wrap=True, max_height=360, scale=2,
                                # Widths the table keeps: left to itself, the caption
                                # column grew past the table's right edge, cut off.
                                column_widths=["35%", "65%"], elem_id="preview-captions")
    with gr.Row():
        caption_path = gr.Textbox(label="Image", interactive=False, scale=2)
        caption_text = gr.Textbox(label="Caption (saved to its .txt, or metadata.jsonl)", scale=4,
                                  elem_id="caption-edit")
        caption_save = gr.Button("Save caption", scale=0, elem_id="caption-save")
    caption_message = gr.HTML("", elem_id="caption-save-message")
    return DatasetTab(add, remove, up, down, check_html, histogram, preview, preview_note,
                      gr.State([]), refresh, caption_path, caption_text, caption_save,
                      caption_message, upload, gr.State(0), prev, next_, captions,
                      undo_remove, gr.State(None))


# ---------------------------------------------------------------- check and preview


def histogram_rows(report, video: bool = False) -> Any:
    """The bucket histogram's bars (None without any); a video family's count clip
    samples and images, and say so."""
    import pandas as pd

    from core.ops import bucket_histogram

    rows = []
    for ds in report.datasets:
        for bucket, count in bucket_histogram(ds.keys):  # a video family's: by frames too
            rows.append({"bucket": bucket.label, "images": count, "dataset": ds.label})
    totals: dict[str, int] = {}
    for row in rows:
        totals[row["bucket"]] = totals.get(row["bucket"], 0) + row["images"]
    for row in rows:  # the count in the label: a 1-image bar beside 500 is a hairline
        row["bucket"] = f"{row['bucket']} ({totals[row['bucket']]})"
    if not rows:  # None, not an empty frame: a plot that got one never draws bars later
        return None
    frame = pd.DataFrame(rows, columns=["bucket", "images", "dataset"])
    frame = frame.astype({"bucket": "str", "images": "int64", "dataset": "str"})
    # The plot keeps the colour domain of the data it first drew: bars of a renamed
    # dataset would fall outside it and not be drawn. Naming the legend's entries makes
    # it rebuild the chart when the ids change.
    what = "samples: clips and images" if video else "images"
    return gr.BarPlot(value=frame, colors_in_legend=list(dict.fromkeys(frame["dataset"])),
                      label=f"Aspect buckets ({what} per bucket)",
                      y_title="samples" if video else "images")


def check_view(ctx: AppContext, tab: DatasetTab, cfg: Config,
               form_problems: list) -> tuple[dict[Any, Any], CheckReport]:
    """The check panel (problems, or what is ready), the bucket histogram, and the report
    they show (the Training tab shows its errors too)."""
    # The Training tab shows the memory estimate, cached; this panel re-checks on edits.
    report = actions.check(ctx, cfg, form_problems, estimate=False)
    summary = [f"{ds.label}: {ds.counted}" for ds in report.datasets]
    if report.steps_per_epoch is not None:
        summary.append(f"{report.steps_per_epoch} steps per epoch")
    ok = "Ready to cache and train. " + "; ".join(summary)
    return {tab.check_html: render.problems_html(report.problems, ok),
            tab.histogram: histogram_rows(report, family_has("video", cfg.model.family))}, report


def preview_view(ctx: AppContext, tab: DatasetTab, cfg: Config, index: int,
                 page: int = 0) -> dict[Any, Any]:
    """Page `page` (clamped) of the preview of dataset `index` of the form's config:
    thumbnails with captions (a video family's clips as their first frame, labelled),
    their full captions beside them, their file paths (the only ones whose captions can
    be edited) and a note saying which items show."""
    from core.ops import index_dataset

    if not 0 <= index < len(cfg.datasets):
        return _preview(tab, [], [], "No dataset selected.")
    ds = resolved(cfg, ctx.workspace).datasets[index]
    found = index_dataset(ds, f"datasets.{index}", cfg.model.family)
    if not found.items:
        what = "images or clips" if family_has("video", cfg.model.family) else "images"
        return _preview(tab, [], [], f"No usable {what} in `{ds.images or '(not set)'}` yet.")
    total = len(found.items)
    page = min(max(page, 0), (total - 1) // PREVIEW_LIMIT)
    first = page * PREVIEW_LIMIT
    shown = found.items[first:first + PREVIEW_LIMIT]
    samples = Counter(i.path for i in found.items if i.frames)  # clips per video
    items, paths = [], []
    for item, thumb in zip(shown, thumbnails(shown, ds.fps), strict=True):
        if thumb is None:
            continue
        label = clip_label(item, samples[item.path] > 1) + pair_label(item)
        items.append((thumb, label + (item.caption or "(no caption)")))
        paths.append(str(item.path))  # as the gallery's: a click's index picks from it
    note = _preview_note(ds, first, len(shown), total, sum(samples.values()))
    if any(i.controls for i in shown):
        note += (" Each edit pair shows its control image(s), then the target; a caption "
                 "edit goes to the target's .txt file.")
    rows = [[item_name(i, samples[i.path] > 1), i.caption or "(no caption)"] for i in shown]
    return _preview(tab, items, paths, note, page, rows)


def _preview_note(ds: DatasetConfig, first: int, shown: int, total: int, clips: int) -> str:
    if clips:
        note = (f"Samples {first + 1}-{first + shown} of {total} of `{ds.id}` "
                f"({samples_said(total - clips, clips)}; {ds.caption}).")
    else:
        note = f"Images {first + 1}-{first + shown} of {total} of `{ds.id}` ({ds.caption})."
    if total > PREVIEW_LIMIT:
        note += " Previous/Next page show the others."
    if ds.caption != "textfile":
        note += (" Captions come from the " + ds.caption + " strategy; edits here are saved "
                 "to .txt files, which only the textfile strategy reads.")
    return note


def _preview(tab: DatasetTab, items: list, paths: list[str], note: str, page: int = 0,
             rows: list[list[str]] | None = None) -> dict[Any, Any]:
    return {tab.preview: items, tab.preview_paths: paths, tab.preview_note: note,
            tab.page: page, tab.captions: rows or []}


def preview_event(ctx: AppContext, form: Form, tab: DatasetTab) -> dict[str, Any]:
    """Refreshing the preview from the form, as event arguments (`.then(**event)`)."""
    return page_event(ctx, form, tab, 0)


def preview_outputs(tab: DatasetTab) -> list[Any]:
    return [tab.preview, tab.preview_paths, tab.preview_note, tab.page, tab.captions]


def page_event(ctx: AppContext, form: Form, tab: DatasetTab, delta: int) -> dict[str, Any]:
    """The preview drawn from the form at its page moved by `delta` (-1 previous, +1 next,
    0 the same page), as event arguments."""

    @guarded("Preview")
    def draw(data: dict[Any, Any]) -> dict[Any, Any]:
        cfg, _ = form.read(data)
        return preview_view(ctx, tab, cfg, data[form.datasets].selected,
                            data[tab.page] + delta)

    return {"fn": draw, "inputs": form.inputs() | {tab.page},
            "outputs": preview_outputs(tab), **ONE_PREVIEW_AT_A_TIME}


# The editor's fields the preview shows: which dataset, its items and captions, an edit
# family's controls, and how a video family's clips become samples.
PREVIEW_KEYS = ("id", "images", "caption", "instance_prompt", "control", "control_2",
                "control_3", "frames", "fps", "clips", "clip_count", "clip_stride")


def preview_triggers(form: Form) -> list[Any]:
    """The edits of PREVIEW_KEYS that redraw the preview: a text once it is left or
    entered (not at each key), a number as `edit_triggers_of`, a choice when made."""
    out: list[Any] = []
    for name in PREVIEW_KEYS:
        component = form.editor[name]
        if isinstance(component, gr.Dropdown):
            out.append(component.input)
        elif isinstance(component, gr.Textbox):
            out += [component.blur, component.submit]
        else:
            out += edit_triggers_of(component)
    return out


def wire(ctx: AppContext, form: Form, tab: DatasetTab,
         after_edit: list[dict[str, Any]]) -> None:
    """Events of the tab; `after_edit`: the app's events (the check, the memory estimate)
    run after a button changed the list of datasets, before the preview."""
    # The list's state (form.datasets) says which dataset is selected, not the selector.
    ins, outs = form.inputs(), form.outputs()
    preview = preview_event(ctx, form, tab)

    def select(data: dict[Any, Any], evt: gr.SelectData) -> dict[Any, Any]:
        return on_select(form, data, evt.index)

    list_edits = ((form.selector.select, "Select dataset", select, ins),
                  (tab.add.click, "Add dataset", lambda d: on_add(form, d), ins),
                  (tab.up.click, "Move dataset", lambda d: on_move(form, d, -1), ins),
                  (tab.down.click, "Move dataset", lambda d: on_move(form, d, 1), ins),
                  (tab.remove.click, "Remove dataset",
                   lambda d: on_remove(form, d, tab.removed, tab.undo_remove), ins),
                  (tab.undo_remove.click, "Undo remove",
                   lambda d: on_undo_remove(form, d, tab.removed, tab.undo_remove),
                   ins | {tab.removed}))
    undo_outs = [*outs, tab.removed, tab.undo_remove]
    for trigger, what, edit, inputs in list_edits:
        event = trigger(guarded(what)(edit), inputs, undo_outs, api_visibility="private")
        for then in [*after_edit, preview]:
            event = event.then(**then)
    rename = form.editor["id"]
    # Typed (or pasted) only: a selection fills the editor's id too, and a change event
    # of that fill could rename the dataset selected before it.
    gr.on(edit_triggers_of(rename),
          guarded("Rename dataset")(lambda d: on_rename(form, d)), ins, [form.selector],
          trigger_mode="always_last", api_visibility="private", show_progress="hidden")
    gr.on(preview_triggers(form), trigger_mode="always_last", **preview)
    tab.refresh.click(**preview)
    tab.prev.click(**page_event(ctx, form, tab, -1))
    tab.next.click(**page_event(ctx, form, tab, 1))
    _wire_captions(ctx, form, tab, preview)


def editor_note(path: str, shown: list[str], message: str) -> Any:
    """Under the caption editor when the preview changed (another dataset, another page)
    and the editor's image is not among those shown: the editor keeps its image and the
    text typed into it, and says where Save writes (a "saved" message stays)."""
    if not path or path in shown or "caption saved" in (message or ""):
        return gr.skip()
    return render.message_html(f"editing {path}, not among the images shown: Save writes "
                               "its caption; click an image of the preview to edit another",
                               "info")


def _wire_captions(ctx: AppContext, form: Form, tab: DatasetTab,
                   preview: dict[str, Any]) -> None:
    @guarded("Pick image", inline=tab.caption_message)
    def pick(data: dict[Any, Any], evt: gr.SelectData) -> dict[Any, Any]:
        paths = data[tab.preview_paths]
        path = paths[evt.index] if 0 <= evt.index < len(paths) else ""
        if not path:
            return {tab.caption_path: "", tab.caption_text: "", tab.caption_message: ""}
        cfg, _ = form.read(data)
        text = actions.read_caption(ctx, cfg, path)  # the dataset's own .txt or jsonl
        return {tab.caption_path: path, tab.caption_text: text, tab.caption_message: ""}

    @guarded("Save caption", inline=tab.caption_message)
    def save(data: dict[Any, Any]) -> dict[Any, Any]:
        cfg, _ = form.read(data)
        target = actions.save_caption(ctx, cfg, data[tab.caption_path], data[tab.caption_text])
        return {tab.caption_message: render.message_html(f"caption saved to {target}", "ok")}

    tab.preview.select(pick, form.inputs() | {tab.preview_paths},
                       [tab.caption_path, tab.caption_text, tab.caption_message],
                       api_visibility="private")
    tab.caption_save.click(save, form.inputs() | {tab.caption_path, tab.caption_text},
                           [tab.caption_message], api_visibility="private").success(**preview)
    tab.preview_paths.change(editor_note, [tab.caption_path, tab.preview_paths,
                                           tab.caption_message], [tab.caption_message],
                             api_visibility="private", show_progress="hidden")
