"""Dataset tab, "Caption images": the `[captioning]` keys and a button that writes
captions for the selected dataset (or the configured list) with an image-to-text model.

A thin view: the button calls `actions.start_caption`, i.e. `core.ops.start_caption`,
the job `python app.py --no-ui --stage caption` runs; the page's timer shows its log. When
the job ends the dataset check and preview refresh (they show the new captions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ui import actions, render
from ui.actions import ActionError
from ui.context import AppContext
from ui.errors import guarded
from ui.form import Form
from ui.pace import Pace

SELECTED = "The selected dataset"
CONFIGURED = "Datasets to caption (above; empty: every textfile dataset)"


@dataclass
class CaptionArea:
    scope: gr.Radio
    start: gr.Button
    stop: gr.Button
    message: gr.HTML
    log: gr.Textbox
    seen: gr.State  # (job folder name, final state) last shown to this session
    finished: gr.State  # bumped when a job ends: refreshes the check and preview


def build(form: Form) -> CaptionArea:
    with gr.Accordion("Caption images", open=False, elem_id="caption-area"):
        gr.Markdown("Write `.txt` captions with an image-to-text model (BLIP, Florence-2, "
                    "...). Images that have a caption keep it unless *Overwrite captions* "
                    "is on; then each old caption is kept as `.txt.bak`.")
        form.section_rows("captioning", advanced=False, per_row=4)
        form.section_rows("captioning", advanced=True)
        scope = gr.Radio([SELECTED, CONFIGURED], value=SELECTED, label="Caption",
                         elem_id="caption-scope")
        with gr.Row():
            start = gr.Button("Caption images", variant="primary", elem_id="caption-start",
                              scale=0)
            stop = gr.Button("Stop captioning", variant="stop", elem_id="caption-stop",
                             scale=0)
        message = gr.HTML("", elem_id="caption-message")
        log = gr.Textbox(label="Captioning log", lines=8, max_lines=8, interactive=False,
                         autoscroll=True, elem_id="caption-log")
    return CaptionArea(scope, start, stop, message, log, gr.State(None), gr.State(0))


def chosen_ids(form: Form, data: dict[Any, Any], scope: str) -> list[str] | None:
    """The selected dataset's id, or None for the config's captioning.datasets."""
    if scope != SELECTED:
        return None
    cfg, _ = form.read(data)
    index = data[form.datasets].selected
    if not 0 <= index < len(cfg.datasets):
        raise ActionError("no dataset selected: add or select one first")
    return [cfg.datasets[index].id]


def job_view(ctx: AppContext, area: CaptionArea, seen: Any, finished: int
             ) -> dict[Any, Any]:
    """Log and message updates for the timer (nothing when unchanged)."""
    job = ctx.caption_job
    if job is None:
        return {}
    state = job.poll()
    key = (job.folder.root.name, state)
    if seen == key and state is not None:
        return {}
    out: dict[Any, Any] = {area.log: ctx.redact("\n".join(job.log_lines(60))),
                           area.seen: key}
    if state is not None:
        level = "ok" if state == "done" else "error"
        out[area.message] = render.message_html(f"captioning {state} (log: {job.log_path})",
                                                level)
        out[area.finished] = finished + 1
    return out


def wire(ctx: AppContext, form: Form, area: CaptionArea, timer: Pace,
         after: list[dict[str, Any]]) -> None:
    """Events of the area; `after`: events (the check, the preview) run when a job ends."""

    @guarded("Caption images")
    def start(data: dict[Any, Any]) -> str:
        cfg, problems = form.read(data)
        try:
            job = actions.start_caption(ctx, cfg, chosen_ids(form, data, data[area.scope]),
                                        problems)
        except ActionError as exc:
            gr.Warning(exc.message)
            return render.message_html(exc.message, "error", exc.problems)
        return render.message_html(f"captioning started (log: {job.log_path})", "info")

    @guarded("Stop captioning", inline=area.message)
    def stop() -> str:
        return render.message_html(f"captioning {actions.stop_caption(ctx)}", "info")

    def tick(seen: Any, finished: int) -> Any:
        try:
            return job_view(ctx, area, seen, finished) or gr.skip()
        except Exception as exc:  # shown in the panel, not as a toast every second
            text = f"cannot read the captioning job: {type(exc).__name__}: {exc}"
            return {area.message: render.message_html(text, "error")}

    area.start.click(start, form.inputs() | {area.scope}, [area.message],
                     api_visibility="private").then(**timer.wake())
    area.stop.click(stop, None, [area.message], api_visibility="private")
    area.log.change(None, js=render.scroll_to_end("caption-log"))
    timer.add(tick, [area.seen, area.finished],
              [area.log, area.message, area.seen, area.finished])
    for event in after:
        area.finished.change(**event)
