"""Assembly: the page (preset bar, then the Dataset, Cache, Training, Runs and Config
tabs), the live check shared by every tab, the timer's pace (ui/pace.py), and the API
endpoints.

`build_app(ctx)` returns the Blocks; `launch_app` starts it with the serving options
(theme and css go to launch() in Gradio 6). Per-session data lives in gr.State; what
the server owns (run handles, cache job, watchers) lives in the AppContext.
"""

from __future__ import annotations

import contextlib
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from core.problems import errors
from ui import (
    api,
    gradio_fixes,
    idle,
    pace,
    presets,
    render,
    tab_cache,
    tab_caption,
    tab_caption_bulk,
    tab_config,
    tab_dataset,
    tab_runs,
    tab_runs_merge,
    tab_train,
    tab_upload,
)
from ui.context import AppContext
from ui.errors import guarded
from ui.form import Form

TICK_S = pace.FAST_S
CSS = """
#train-log textarea, #cache-log textarea, #caption-log textarea {
  font-family: ui-monospace, monospace; font-size: 12px; }
.dt-problems ul { margin: 4px 0 0 18px; }
.dt-problems li { margin: 2px 0; }
/* Help under a label: three lines high, the rest scrolls inside (long help made columns
   tall; expanding it on hover moved the page under the pointer). */
.info-text { max-height: 4.5em; overflow-y: auto; scrollbar-width: thin; }
/* Thumbnails stay thumbnails, however few images there are. */
#preview .thumbnail-item, #validation-gallery .thumbnail-item {
  max-width: 180px; max-height: 180px; }
/* The memory line's fix is a button under it, as wide as its label, not a bar. */
#memory-fix { width: fit-content; max-width: 100%; align-self: flex-start;
  white-space: normal; height: auto; }
/* Long names stay inside their button (wrapped, never cut) and table cells. */
#runs-download { max-width: 100%; white-space: normal; overflow-wrap: anywhere;
  height: auto; }
#runs-table td, #runs-loras td, #cache-table td, #runs-queue td {
  overflow-wrap: anywhere; word-break: break-word; }
/* The validation grid: prompt x step, thumbnails that scroll sideways when many. */
#validation-grid .dt-grid { overflow-x: auto; }
#validation-grid table { border-collapse: collapse; }
#validation-grid th, #validation-grid td { padding: 2px; font-weight: normal;
  font-size: 12px; text-align: center; vertical-align: middle; }
#validation-grid .dt-grid-prompt { max-width: 160px; text-align: left;
  overflow-wrap: anywhere; }
#validation-grid img { width: 128px; height: auto; display: block; }
/* A loss series with one point (the step-0 eval of a short run) is a line of no length,
   "Mx,yZ": a round dot instead of nothing, whole even in the plot's corner (the axes
   span the data, so no line runs past them unclipped). */
#loss-plot path[aria-roledescription="line mark"][d$="Z"] { stroke-width: 10px;
  stroke-linecap: round; }
#loss-plot g.mark-line { clip-path: none; }
/* A dropdown's options show only while it has the focus: one opened by Tab stayed open
   over the fields (and the check panel) below after Tab moved on. */
.block:not(:focus-within) .options:has(> ul.option-list) { display: none; }
"""


def build_app(ctx: AppContext) -> gr.Blocks:
    with gr.Blocks(title="Diffusion fine-tuning") as demo:
        form = Form()
        api.register(ctx)  # first, so the endpoints keep their names (/check, /stop, ...)
        gr.Markdown("## Fine-tune a diffusion model on your pictures\n"
                    f"Workspace: `{ctx.workspace}`")
        bar = tab_config.build_bar(ctx)
        timer = pace.Pace(ctx)
        with gr.Tabs() as tabs:
            with gr.Tab("Dataset", id="dataset"):
                dataset = tab_dataset.build(form)
                caption = tab_caption.build(form)
                bulk = tab_caption_bulk.build()
            with gr.Tab("Cache", id="cache") as cache_tab:
                cache = tab_cache.build(form)
            with gr.Tab("Training", id="train") as train_tab:
                train = tab_train.build(form)
            with gr.Tab("Runs", id="runs") as runs_tab:
                runs = tab_runs.build()
                merge_row = tab_runs_merge.build(form)
            with gr.Tab("Config", id="config"):
                config = tab_config.build_tab()
        refresh = _wire(demo, ctx, form, bar, timer, tabs, (runs_tab, train_tab),
                        dataset, cache, train, runs, config)
        # A preset, a file or Undo replaces the form: refusals beside the controls that
        # were about the earlier form go (tab_config.stale_cleared).
        tab_config.wire(ctx, form, bar, config, after_fill=refresh,
                        stale=[dataset.caption_message, dataset.upload.message,
                               cache.message, caption.message, bulk.message])
        tab_caption.wire(ctx, form, caption, timer, after=refresh)
        tab_caption_bulk.wire(ctx, form, bulk, after=refresh)
        tab_upload.wire(ctx, form, dataset.upload, after=refresh)
        tab_cache.wire(ctx, form, cache, timer, cache_tab)
        tab_runs_merge.wire(ctx, merge_row, runs.choice, runs.file)
        timer.wire()
    return demo


def _wire(demo: gr.Blocks, ctx: AppContext, form: Form, bar: Any, timer: pace.Pace, tabs: gr.Tabs,
          pages: tuple[gr.Tab, gr.Tab], dataset: Any, cache: Any, train: Any, runs: Any,
          config: Any) -> list[dict[str, Any]]:
    """Every event but the Cache tab's and the captioning's; returns what runs after the
    form or the datasets changed other than by typing (the live check, the memory
    estimate, the preview), as event arguments."""
    marks = gr.HTML("", elem_id="field-marks", padding=False)
    runs_tab, train_tab = pages
    check_outputs = [dataset.check_html, dataset.histogram, config.toml, config.rendered,
                     train.message, marks, train.launch]

    @guarded("Check")
    def live_check(data: dict[Any, Any]) -> dict[Any, Any]:
        if data[form.datasets].unfilled:  # a change before the page opened: no form yet
            return gr.skip()
        cfg, problems = form.read(data)
        if not problems:  # a half-typed number would be saved as its default
            with contextlib.suppress(OSError):
                presets.remember(ctx, cfg)
        view, report = tab_dataset.check_view(ctx, dataset, cfg, problems)
        return {**view, **tab_config.toml_view(cfg, data, config),
                train.message: tab_train.form_message(report.problems, data[train.message]),
                marks: form.field_marks(data, report.problems),
                # A launch would be refused: the button says so before it is clicked.
                train.launch: gr.Button(interactive=not errors(report.problems))}

    live = {"fn": live_check,
            "inputs": form.inputs() | {train.message, config.toml, config.rendered},
            "outputs": check_outputs, "api_visibility": "private", "show_progress": "hidden"}
    # On the person's edits. A fill or a button that writes the form runs the check once
    # afterwards instead: on .change, every field it wrote fired one (opening the page
    # sent some 25 checks and as many memory estimates).
    gr.on(form.edit_triggers(), trigger_mode="always_last", **live)
    form.wire_family_keys()
    form.wire_setting_keys()
    # After a launch the chooser goes to the newest run: the one just launched.
    runs_refresh = {"fn": lambda: tab_runs.runs_view(ctx, runs), "inputs": None,
                    "outputs": runs.listed(), "api_visibility": "private",
                    **tab_runs.IN_ORDER}
    memory_estimate = tab_train.wire(ctx, form, train, timer, on_launched=[runs_refresh],
                                     after_fix=[live])
    tab_dataset.wire(ctx, form, dataset, after_edit=[live, memory_estimate])
    preview = tab_dataset.preview_event(ctx, form, dataset)
    # The preview depends on the family (a video family's clips, an edit family's pairs).
    form.fields["model.family"].input(**preview)
    refresh = [live, memory_estimate, preview]
    tab_runs.wire(ctx, runs, train, tabs, form, after_fill=tuple(refresh))
    runs_tab.select(**{**runs_refresh, "inputs": [runs.choice],  # the chosen run stays
                       "fn": lambda chosen: tab_runs.runs_view(ctx, runs, chosen)})
    tab_config.wire_opening(demo, ctx, form, bar, after_fill=refresh)
    demo.load(guarded("Open the page")(lambda f: tab_runs.on_load(ctx, runs, train, f)),
              [train.following], [*runs.listed(), *train.components()],
              api_visibility="private", **tab_runs.IN_ORDER)
    demo.load(None, js=render.CAPTION_TOOLTIPS)
    demo.load(None, js=render.HELP_NOT_TABBED)
    demo.load(None, js=idle.POLL_JS)  # the idle page's cheap look (ui/idle.py)
    train_tab.select(**memory_estimate)  # the caches may have been built since
    return refresh


def launch_app(ctx: AppContext, *, server_name: str = "127.0.0.1", port: int = 7860,
               share: bool = False, auth: list[tuple[str, str]] | None = None,
               prevent_thread_lock: bool = False, quiet: bool = False) -> tuple[Any, str]:
    """Build and start the app; returns (blocks, local url)."""
    demo = build_app(ctx)
    demo.queue(default_concurrency_limit=4)
    gradio_fixes.calm_idle_queue(demo)
    _, url, _ = demo.launch(
        server_name=server_name, server_port=port, share=share, auth=auth or None,
        auth_message="Log in with the user name and password given to the server.",
        allowed_paths=[str(ctx.workspace)], prevent_thread_lock=prevent_thread_lock,
        quiet=quiet, show_error=True, theme=gr.themes.Soft(), css=CSS,
        footer_links=["api", "settings"],
        # Gradio frontend fixes: its idle animation loop, its layout lookup
        # (ui/gradio_fixes.py); the idle page's look at the workspace (ui/idle.py), first
        # among the routes, behind the login.
        app_kwargs={"middleware": [Middleware(gradio_fixes.PatchGradioAssets)],
                    "routes": [idle.route(ctx, login=bool(auth))]})
    return demo, url
