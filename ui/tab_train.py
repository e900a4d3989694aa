"""Training tab: model, method and hyperparameters (advanced ones folded), validation
prompts; Launch, Stop, Resume; the followed run's live log, progress (step, it/s, ETA),
loss and eval-loss plot, validation gallery (newest step first) and the commands that
reproduce it.

Each browser session follows at most one run (`Following`, kept in gr.State); a 1 s
timer polls it, reading only new bytes, and sends only the views whose version changed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from core.config import load_config
from core.runs.folder import RunFolder
from core.runs.follow import RunFollower
from core.runs.registry import run_info
from ui import actions, render
from ui.actions import ActionError
from ui.context import AppContext
from ui.errors import guarded
from ui.form import Form

log = logging.getLogger("ui")
GALLERY_LIMIT = 60
BASIC_TRAIN = ("method", "lora_rank", "max_steps", "batch_size", "grad_accum",
               "learning_rate", "seed", "mixed_precision", "checkpoint_every",
               "keep_checkpoints")


@dataclass
class Following:
    """What one session follows, and which versions of each view it has already sent."""

    follower: RunFollower
    prompts: list[str] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    busy: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def run_dir(self) -> Path:
        return self.follower.run_dir

    def changed(self, view: str, version: int) -> bool:
        if self.sent.get(view) == version:
            return False
        self.sent[view] = version
        return True


def follow(ctx: AppContext, run_dir: str | Path, log_offset: int | None = None) -> Following:
    """Start following a run; a live one gets a handle so its end is recorded."""
    run_dir = Path(run_dir)
    if run_info(run_dir).alive:
        ctx.handle(run_dir)
    try:
        prompts = load_config(RunFolder(run_dir).config).validation.prompts
    except Exception:  # an old or hand-edited config: the gallery just shows no prompts
        prompts = []
    return Following(RunFollower(run_dir, log_offset=log_offset), prompts)


@dataclass
class TrainTab:
    launch: gr.Button
    stop: gr.Button
    resume: gr.Button
    message: gr.HTML
    progress: gr.HTML
    log: gr.Textbox
    plot: gr.LinePlot
    gallery: gr.Gallery
    command: gr.Textbox
    following: gr.State


def build(form: Form) -> TrainTab:
    with gr.Row():
        form.section("model")
        form.section("output")
    with gr.Row():
        form.section("train", only=BASIC_TRAIN[:5])
    with gr.Row():
        form.section("train", only=BASIC_TRAIN[5:])
    with gr.Row():
        form.section("validation", advanced=False)
        form.section("launch", advanced=False)
    with gr.Accordion("Advanced settings", open=False, elem_id="advanced"):
        form.section_rows("train", advanced=True)
        form.section_rows("validation", advanced=True)
        form.section_rows("launch", advanced=True)
    with gr.Row():
        launch = gr.Button("Launch", variant="primary", elem_id="launch")
        stop = gr.Button("Stop", variant="stop", elem_id="stop")
        resume = gr.Button("Resume", elem_id="resume")
    message = gr.HTML("", elem_id="train-message")
    progress = gr.HTML("<div>No run followed yet.</div>", elem_id="train-progress")
    with gr.Row():
        log = gr.Textbox(label="Log", lines=16, max_lines=16, interactive=False,
                         autoscroll=True, elem_id="train-log", scale=3)
        plot = gr.LinePlot(x="step", y="loss", color="series", label="Loss",
                           elem_id="loss-plot", height=300, scale=2)
    gallery = gr.Gallery(label="Validation images (newest first)", columns=6, height=320,
                         elem_id="validation-gallery", allow_preview=True)
    command = gr.Textbox(label="Reproduce this run from the command line", lines=6,
                         interactive=False, buttons=["copy"], elem_id="command")
    return TrainTab(launch, stop, resume, message, progress, log, plot, gallery, command,
                    gr.State(None))


# ---------------------------------------------------------------- views


def gallery_items(ctx: AppContext, f: Following) -> tuple[int, list]:
    version, images = ctx.watchers.get(f.run_dir).snapshot()
    items = []
    for image in images[:GALLERY_LIMIT]:
        prompt = f.prompts[image.index] if image.index < len(f.prompts) else ""
        caption = f"step {image.step} · {prompt}" if prompt else f"step {image.step}"
        items.append((servable(ctx, image.path), caption))
    return version, items


def servable(ctx: AppContext, path: Path) -> Any:
    """A path inside the workspace as is; anything else as pixels, never as a file path,
    so the server only ever serves files from the workspace."""
    if path.resolve().is_relative_to(ctx.workspace.resolve()):
        return str(path)
    from PIL import Image

    with Image.open(path) as im:
        return im.convert("RGB")


def plot_frame(f: Following) -> Any:
    import pandas as pd

    rows = f.follower.plot_rows()
    if not rows:  # None, not an empty frame: a plot that got one never draws lines later
        return None
    frame = pd.DataFrame(rows, columns=["step", "loss", "series"])
    # Typed, so the axes are quantitative whatever pandas infers.
    return frame.astype({"step": "int64", "loss": "float64", "series": "str"})


def tick_views(ctx: AppContext, f: Following | None) -> tuple:
    """(progress, log, plot, gallery) updates; gr.skip() for what has not changed."""
    if f is None or not f.busy.acquire(blocking=False):  # a slow tick is still at it
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    try:
        return _views(ctx, f)
    finally:
        f.busy.release()


def _views(ctx: AppContext, f: Following) -> tuple:
    fol = f.follower.poll()
    progress = log = plot = gallery = gr.skip()
    if f.changed("status", fol.status_version):
        progress = render.run_progress_html(fol.progress, ctx.relative(f.run_dir))
    if f.changed("log", fol.log_version):
        log = ctx.redact(fol.log_text())
    if f.changed("plot", fol.plot_version):
        plot = plot_frame(f)
    version, items = gallery_items(ctx, f)
    if f.changed("gallery", version):
        gallery = items
    return progress, log, plot, gallery


def safe_tick(ctx: AppContext, f: Following | None) -> tuple:
    """The timer's view of the run; a failure shows in the progress panel (a toast every
    second would bury the page) and is retried at the next tick."""
    try:
        return tick_views(ctx, f)
    except Exception as exc:
        log.exception("following %s failed", f.run_dir if f else None)
        if f is not None:
            f.sent.pop("status", None)  # redraw the progress once it reads again
        text = f"cannot read the run: {type(exc).__name__}: {exc}"
        return render.message_html(ctx.redact(text), "error"), gr.skip(), gr.skip(), gr.skip()


def opened_views(ctx: AppContext, f: Following) -> dict[str, Any]:
    """Everything shown for a run that was just opened (all views sent once)."""
    f.sent.clear()
    progress, log, plot, gallery = tick_views(ctx, f)
    return {"progress": progress, "log": log, "plot": plot, "gallery": gallery,
            "command": actions.reproduce_lines(ctx, f.run_dir)}


# ---------------------------------------------------------------- events


def wire(ctx: AppContext, form: Form, tab: TrainTab, timer: gr.Timer,
         on_launched: list[Any]) -> None:
    views = [tab.progress, tab.log, tab.plot, tab.gallery, tab.command]

    def start(data: dict[Any, Any], resume: bool) -> tuple:
        cfg, problems = form.read(data)
        try:
            if resume:  # the run in view, else the form's output folder, with its own config
                f = data[tab.following]
                target = f.run_dir if f is not None else actions.output_dir(ctx, cfg)
                launched = actions.resume(ctx, target)
            else:
                launched = actions.launch(ctx, cfg, form_problems=problems)
        except ActionError as exc:
            gr.Warning(exc.message)
            return (render.message_html(exc.message, "error", exc.problems), gr.skip(),
                    *([gr.skip()] * len(views)))
        f = follow(ctx, launched.run_dir, log_offset=launched.log_offset)
        shown = opened_views(ctx, f)
        verb = "resumed" if resume else "launched"
        text = render.message_html(f"{verb}: {ctx.relative(launched.run_dir)}", "ok",
                                   launched.warnings)
        return (text, f, *[shown[k] for k in ("progress", "log", "plot", "gallery",
                                              "command")])

    @guarded("Stop")
    def stop(f: Following | None) -> str:
        if f is None:
            raise ActionError("no run is followed; open one on the Runs tab")
        gr.Info(f"stopping {ctx.relative(f.run_dir)}: the trainer saves a checkpoint first")
        state = actions.stop(ctx, f.run_dir)
        return render.message_html(f"{ctx.relative(f.run_dir)}: {state}",
                                   "ok" if state == "stopped" else "info")

    outs = [tab.message, tab.following, *views]
    ins = form.inputs() | {tab.following}
    launch_event = tab.launch.click(guarded("Launch")(lambda d: start(d, False)), ins, outs,
                                    api_visibility="private")
    resume_event = tab.resume.click(guarded("Resume")(lambda d: start(d, True)), ins, outs,
                                    api_visibility="private")
    for event in (launch_event, resume_event):
        for then in on_launched:
            event.then(**then)
    tab.stop.click(stop, [tab.following], [tab.message], api_visibility="private",
                   concurrency_limit=None)
    timer.tick(lambda f: safe_tick(ctx, f), [tab.following], views[:4],
               api_visibility="private", show_progress="hidden", concurrency_limit=None)
    tab.log.change(None, js=scroll_to_end("train-log"))


def scroll_to_end(elem_id: str) -> str:
    """Browser-side: keep a log box scrolled to its newest line (unless the user is in it).
    Gradio's own autoscroll gives up after a burst of lines taller than 100 px."""
    return (f"() => {{ const t = document.querySelector('#{elem_id} textarea'); "
            "if (t && document.activeElement !== t) t.scrollTop = t.scrollHeight; }")
