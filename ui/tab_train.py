"""Training tab: model, method and hyperparameters (advanced ones folded), validation
prompts; the per-GPU memory estimate of the form's config (the `memory:` line of
`--stage check`); Launch, Stop, Resume; the followed run's live log, progress (step, it/s, ETA),
loss and eval-loss plot, validation gallery (newest step first) and the commands that
reproduce it (those views and the following are ui/run_views.py's).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from core.config import Config
from core.ops import FIT_KEYS, FitPlan
from core.problems import Problem, errors
from ui import actions, render, run_views
from ui.actions import ActionError
from ui.context import AppContext
from ui.errors import guarded
from ui.form import Form
from ui.pace import Pace
from ui.run_views import Following, RunView

# model.config describes a single-file model.path, so it sits right beside it.
MODEL_FIELDS = ("family", "path", "config", "quantize", "blocks_to_swap")
BASIC_TRAIN = ("method", "lora_kind", "lora_rank", "max_steps", "batch_size", "grad_accum",
               "learning_rate", "seed", "mixed_precision", "checkpoint_every",
               "keep_checkpoints")


@dataclass
class TrainTab(RunView):
    """The run views (the Runs tab opens runs in them) and the buttons that start runs."""

    launch: gr.Button
    stop: gr.Button
    resume: gr.Button
    extend: gr.Button
    message: gr.HTML
    memory: gr.Markdown
    model_check: gr.HTML  # model.path checked as it is typed, not only at Launch
    # Shown when the estimate does not fit the card and some model.blocks_to_swap does:
    # one click sets it (and gradient checkpointing, which swapping needs).
    memory_fix: gr.Button


def build(form: Form) -> TrainTab:
    with gr.Row():
        form.section("model", advanced=False, only=MODEL_FIELDS)
        # Then a family's own basic keys (its options.py), shown for that family only.
        form.section("model", advanced=False)
        form.section("output")
    model_check = gr.HTML("", elem_id="model-path-check")
    with gr.Row():
        form.section("train", only=BASIC_TRAIN[:5])
    with gr.Row():
        form.section("train", only=BASIC_TRAIN[5:])
    with gr.Row():
        form.section("validation", advanced=False)
        form.section("launch", advanced=False)
    with gr.Accordion("Advanced settings", open=False, elem_id="advanced"):
        form.section_rows("model", advanced=True)
        form.section_rows("train", advanced=True)
        form.section_rows("validation", advanced=True)
        form.section_rows("launch", advanced=True)
        form.section_rows("logging", advanced=False)
        form.section_rows("logging", advanced=True)
    with gr.Row():
        launch = gr.Button("Launch", variant="primary", elem_id="launch")
        stop = gr.Button("Stop", variant="stop", elem_id="stop")
        resume = gr.Button("Resume", elem_id="resume")
        # A finished run refuses Resume: Extend trains it on to the form's Max steps.
        extend = gr.Button("Extend to Max steps", elem_id="extend")
    memory = gr.Markdown("", elem_id="train-memory-estimate")
    memory_fix = gr.Button("", visible=False, size="sm", elem_id="memory-fix")
    message = gr.HTML("", elem_id="train-message")
    progress = gr.HTML("<div>No run followed yet.</div>", elem_id="train-progress")
    with gr.Row():
        log = gr.Textbox(label="Log", lines=16, max_lines=16, interactive=False,
                         autoscroll=True, elem_id="train-log", scale=3)
        plot = run_views.loss_plot()
    gallery = gr.Gallery(label="Validation images (newest first)", columns=6, height=320,
                         elem_id="validation-gallery", allow_preview=True)
    grid = gr.HTML("", elem_id="validation-grid")
    command = gr.Textbox(label="Reproduce this run from the command line", lines=6,
                         interactive=False, buttons=["copy"], elem_id="command")
    tensorboard = gr.Markdown("", elem_id="train-tensorboard")
    return TrainTab(following=gr.State(None), progress=progress, log=log, plot=plot,
                    gallery=gallery, command=command, tensorboard=tensorboard, launch=launch,
                    stop=stop, resume=resume, extend=extend, message=message, memory=memory,
                    model_check=model_check, memory_fix=memory_fix, grid=grid)


# ---------------------------------------------------------------- events


@dataclass
class MemoryLines:
    """The latest estimate's Markdown and the key of the config it was made for. The
    estimate reads the model's configs (seconds for an unbuilt tiny model, more while the
    first one imports diffusers), and most edits of the form (captions, datasets'
    folders, validation) do not change it. One lock for every page: an opening fires the
    estimate from the page load and from the fill at once, and a second session opens
    the same preset; the later calls wait for the first and reuse its lines instead of
    making their own beside it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    key: str | None = None
    text: str = ""
    fix: FitPlan | None = None  # the settings that make it fit its card, when some do


def memory_view(ctx: AppContext, cfg: Config, lines: MemoryLines) -> str:
    """The estimate's lines as Markdown; whether the caches are built is looked up each
    time (cheap: file headers)."""
    from core.config import resolved
    from core.ops import caches_complete, estimate_inputs, estimate_memory

    full = resolved(cfg, ctx.workspace)
    built = caches_complete(full, ctx.workspace)  # built since: no caching phase any more
    key = f"{estimate_inputs(full)} {built}"
    with lines.lock:
        if lines.key != key:
            estimate = estimate_memory(full, ctx.workspace, caches_built=built)
            lines.text = "\n\n".join(_markdown_text(line.strip())
                                      for line in (estimate.lines() if estimate else []))
            lines.fix = estimate.fit if estimate else None
            lines.key = key
        return lines.text


def memory_fix_button(lines: MemoryLines) -> Any:
    """The one-click fix under the memory line: visible while some settings would fit."""
    if lines.fix is None:
        return gr.update(visible=False)
    return gr.update(visible=True, value=f"Apply: {lines.fix.label()}")


def apply_memory_fix(form: Form, lines: MemoryLines) -> dict[Any, Any]:
    """The form's fields for every change of the fit, together (core/memory/fit.py)."""
    if lines.fix is None:
        return {}
    return {form.fields[key]: value for key, value in lines.fix.changes.items()
            if key in form.fields}


def queued_view(ctx: AppContext, tab: TrainTab, launched: Any,
                f: Following | None) -> dict[Any, Any]:
    """A queued launch: the live view stays on (or goes to) the run that is live, and
    moves to the queued one when it starts (run_views.moved); the queue lists it."""
    name, behind = ctx.relative(launched.run_dir), launched.queued_behind
    for root in {str(ctx.workspace.resolve()), str(ctx.workspace)}:
        behind = behind.replace(root + "/", "")  # folders as the workspace names them
    text = render.message_html(
        f"queued (number {launched.queued}, after {behind}): {name}. The view stays on "
        f"the running run and moves to {name} when it starts; the Runs tab lists the "
        "queue.", "ok", launched.warnings)
    out: dict[Any, Any] = {tab.message: text}
    live = run_views.newest_live(ctx)
    if live is not None and (f is None or f.run_dir.resolve() != live.resolve()):
        out.update(run_views.opened(ctx, tab, live))
        f = out[tab.following]
    if f is not None:
        f.awaiting = launched.run_dir
        out[tab.following] = f
    return out


def form_message(problems: list[Problem], current: str | None) -> Any:
    """The message under Launch follows the form: its errors while it has any (a launch
    would be refused for them), named by their labels; an older refusal goes once the
    form changes without errors; a launch's own message stays."""
    if errors(problems):  # one line: the fields themselves are marked
        return f"<div class='dt-form-check'>{render.launch_summary_html(problems)}</div>"
    if current and ("dt-msg-error" in current or "dt-form-check" in current):
        return ""
    return gr.skip()


STARTING = {"launch": "launching: checking the config and preparing the run folder…",
            "resume": "resuming: reading the run's checkpoint and starting the trainer…",
            "extend": "extending: checking the run and starting the trainer on to Max "
                      "steps…"}


def starting_js(mode: str) -> str:
    """Browser-side, at the click: the line beside the buttons while the server starts
    the run (its own reply replaces it)."""
    import json

    return f"() => {json.dumps(render.message_html(STARTING[mode], 'info'))}"


def model_check_view(ctx: AppContext, cfg: Config) -> str:
    """model.path's problems (a missing folder, a family mismatch, an uncached hub id),
    or what it was found to be."""
    from core.config import resolved
    from core.ops import check_model_source

    full = resolved(cfg, ctx.workspace)
    problems = check_model_source(full.model.path, cfg.model.family,
                                  workspace=ctx.workspace)
    if problems:
        return render.problems_html(problems)
    return render.message_html(f"model.path: {full.model.path} can be used as a "
                               f"{cfg.model.family} model", "ok")


def _markdown_text(line: str) -> str:
    """A plain line shown as such (a lone `~` would strike text through)."""
    for ch in "\\`*_~<>[]":
        line = line.replace(ch, "\\" + ch)
    return line


def wire(ctx: AppContext, form: Form, tab: TrainTab, timer: Pace,
         on_launched: list[Any], after_fix: list[Any]) -> dict[str, Any]:
    """Wire the tab's events; returns the memory estimate's event, which the app runs
    after each fill of the form (on typing it runs by itself). `after_fix`: the events
    (the check) that run after the memory line's fix wrote its fields."""
    def start(data: dict[Any, Any], mode: str) -> dict[Any, Any]:
        cfg, problems = form.read(data)
        f = data[tab.following]
        # Resume and Extend act on the run in view, else the form's output folder.
        target = f.run_dir if f is not None else actions.output_dir(ctx, cfg)
        try:
            if mode == "resume":  # with the run's own config
                launched = actions.resume(ctx, target)
            elif mode == "extend":  # to the form's max steps
                launched = actions.extend(ctx, target, cfg.train.max_steps, problems)
            else:
                launched = actions.launch(ctx, cfg, form_problems=problems)
        except ActionError as exc:  # said once, beside the buttons (no toast)
            return {tab.message: render.message_html(exc.message, "error", exc.problems)}
        verb = {"resume": "resumed", "extend": "extended"}.get(mode, "launched")
        if launched.queued:  # a run is live: this one starts when the queue reaches it
            return queued_view(ctx, tab, launched, f)
        text = render.message_html(f"{verb}: {ctx.relative(launched.run_dir)}", "ok",
                                   launched.warnings)
        return {tab.message: text,
                **run_views.opened(ctx, tab, launched.run_dir, launched.log_offset)}

    @guarded("Stop", inline=tab.message)
    def stop(f: Following | None) -> str:
        if f is None:
            raise ActionError("no run is followed; open one on the Runs tab")
        gr.Info(f"stopping {ctx.relative(f.run_dir)}: the trainer saves a checkpoint first")
        state = actions.stop(ctx, f.run_dir)
        return render.message_html(f"{ctx.relative(f.run_dir)}: {state}",
                                   "ok" if state == "stopped" else "info")

    lines = MemoryLines()

    @guarded("Memory estimate")
    def estimate(data: dict[Any, Any]) -> tuple[Any, Any]:
        if data[form.datasets].unfilled:  # before the page's opening fill: no form yet
            return gr.skip(), gr.skip()
        return memory_view(ctx, form.read(data)[0], lines), memory_fix_button(lines)

    memory_event = {"fn": estimate, "inputs": form.inputs(),
                    "outputs": [tab.memory, tab.memory_fix], "show_progress": "hidden",
                    "api_visibility": "private"}
    gr.on(form.edit_triggers(), trigger_mode="always_last", **memory_event)
    fixed = [form.fields[k] for k in FIT_KEYS if k in form.fields]
    fix = tab.memory_fix.click(lambda: apply_memory_fix(form, lines), None, fixed,
                               api_visibility="private")
    for then in [*after_fix, memory_event]:
        fix = fix.then(**then)
    model_fields = [form.fields[f"model.{n}"] for n in ("family", "path")]
    gr.on([c.change for c in model_fields], guarded("Model check")(
        lambda d: model_check_view(ctx, form.read(d)[0])), form.inputs(), [tab.model_check],
        trigger_mode="always_last", show_progress="hidden", api_visibility="private")
    outs = [tab.message, *tab.components()]
    ins = form.inputs() | {tab.following}
    # Each button says at once, in the browser, what it started: preparing a run folder
    # and starting accelerate take seconds, which showed nothing at all.
    events = [button.click(None, None, [tab.message], js=starting_js(mode),
                           api_visibility="private").then(
                  guarded(name)(lambda d, m=mode: start(d, m)), ins, outs,
                  api_visibility="private")
              for button, name, mode in ((tab.launch, "Launch", "launch"),
                                         (tab.resume, "Resume", "resume"),
                                         (tab.extend, "Extend", "extend"))]
    for event in events:
        for then in on_launched:
            event.then(**then)
        # A failure (its toast says why) must not leave "launching..." standing.
        event.failure(None, None, [tab.message], js="() => ''", api_visibility="private")
    tab.stop.click(stop, [tab.following], [tab.message], api_visibility="private",
                   concurrency_limit=None)
    timer.add(lambda f: run_views.tick(ctx, tab, f, tab.message), [tab.following],
              [*tab.components(), tab.message])
    tab.following.change(**timer.wake())  # launched, resumed or opened: poll it at once
    tab.log.change(None, js=render.scroll_to_end("train-log"))
    return memory_event
