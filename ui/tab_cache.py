"""Cache tab: what is cached, stale or missing per dataset; build the VAE-latent and
text-embedding caches (an `accelerate launch` job, with a progress bar and an ETA);
clear one dataset's latent cache after a confirmation (images are never touched)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from core.config import Config, load_config, resolved
from core.ops import family_has
from ui import actions, render
from ui.actions import ActionError
from ui.context import AppContext
from ui.errors import guarded
from ui.form import Form
from ui.pace import Pace


@dataclass
class CacheTab:
    refresh: gr.Button
    table: gr.Dataframe
    note: gr.Markdown
    build: gr.Button
    stop: gr.Button
    progress: gr.HTML
    log: gr.Textbox
    clear_id: gr.Dropdown
    clear: gr.Button
    confirm_box: gr.Group
    confirm_text: gr.Markdown
    confirm_yes: gr.Button
    confirm_no: gr.Button
    message: gr.HTML
    seen: gr.State  # (job folder name, final state) last shown to this session


def build(form: Form) -> CacheTab:
    form.section("text_cache")
    with gr.Row():
        refresh = gr.Button("Refresh status", elem_id="cache-refresh", scale=0)
        build_btn = gr.Button("Build caches", variant="primary", elem_id="cache-build",
                              scale=0)
        stop = gr.Button("Stop build", variant="stop", elem_id="cache-stop", scale=0)
    message = gr.HTML("", elem_id="cache-message")
    table = gr.Dataframe(headers=render.CACHE_HEADERS, label="Cache status per dataset",
                         interactive=False, elem_id="cache-table")
    note = gr.Markdown("")
    progress = gr.HTML(render.cache_progress_html(None, None), elem_id="cache-progress")
    log = gr.Textbox(label="Cache build log", lines=8, max_lines=8, interactive=False,
                     autoscroll=True, elem_id="cache-log")
    gr.Markdown("### Clear a dataset's latent cache")
    with gr.Row():
        clear_id = gr.Dropdown(label="Dataset", choices=[], elem_id="clear-id", scale=2)
        clear = gr.Button("Clear cache…", variant="stop", elem_id="cache-clear", scale=0)
    with gr.Group(visible=False) as confirm_box:
        confirm_text = gr.Markdown("")
        with gr.Row():
            yes = gr.Button("Yes, delete these cache files", variant="stop",
                            elem_id="cache-clear-yes")
            no = gr.Button("Cancel", elem_id="cache-clear-no")
    return CacheTab(refresh, table, note, build_btn, stop, progress, log, clear_id, clear,
                    confirm_box, confirm_text, yes, no, message, gr.State(None))


def status_view(ctx: AppContext, tab: CacheTab, cfg: Any) -> dict[Any, Any]:
    """The status table and the note under it, for `cfg`'s datasets."""
    status = actions.cache_status(ctx, cfg)
    video = family_has("video", cfg.model.family)
    counted = "samples (clip samples and images)" if video else "images"
    note = (f"Text cache: `{status.text_dir}`. The VAE columns count {counted}, one latent "
            "each; the text columns count distinct captions (one embedding per distinct "
            "caption, shared by every sample with that caption), so they are fewer than "
            f"the {counted.split(' ')[0]} when captions repeat.")
    if status.note:
        note += f" Note: {status.note}."
    return {tab.table: gr.Dataframe(value=render.cache_rows(status),
                                    headers=render.cache_headers(video)),
            tab.note: note}


def cache_folders(ctx: AppContext, cfg: Config) -> list[Path]:
    """The cache folders `cfg` uses: each dataset's VAE cache, then the text cache."""
    full = resolved(cfg, ctx.workspace)
    return [Path(p).resolve()
            for p in [*(ds.vae_cache for ds in full.datasets), full.text_cache.dir]]


def progress_view(ctx: AppContext, job: Any, state: str | None,
                  form_cfg: Config | None = None) -> str:
    """The last build's progress, the folders it built and, given the form's config,
    whether those are the form's: a "done" for other folders must not read as the
    form's caches being built."""
    html = render.cache_progress_html(job, state)
    if job is None:
        return html
    try:
        built = cache_folders(ctx, load_config(job.folder.config))
    except Exception:  # a job folder pruned or unreadable: say less
        return html
    names = ", ".join(ctx.relative(p) for p in built)
    html += f"<div>this build is for: {render.esc(names)}</div>"
    if form_cfg is not None:
        other = [p for p in cache_folders(ctx, form_cfg) if p not in built]
        if other:
            text = ("The last build was for other cache folders; it did not build the "
                    "form's " + ", ".join(ctx.relative(p) for p in other)
                    + ". The table shows the form's caches.")
            html += render.message_html(text, "info")
    return html


def refresh_view(ctx: AppContext, tab: CacheTab, cfg: Config) -> dict[Any, Any]:
    """The table for the form's caches, the dataset chooser, and the last build's panel
    saying whether it built them."""
    ids = [ds.id for ds in cfg.datasets]
    job = ctx.cache_job
    return {**status_view(ctx, tab, cfg),
            tab.clear_id: gr.Dropdown(choices=ids, value=ids[0] if ids else None),
            tab.progress: progress_view(ctx, job, job.poll() if job else None, cfg)}


def job_view(ctx: AppContext, tab: CacheTab, seen: Any) -> tuple[dict[Any, Any], bool]:
    """(progress, log and seen updates, job-finished-since-last-look) for the timer."""
    job = ctx.cache_job
    if job is None:
        return {}, False
    state = job.poll()
    key = (job.job_dir.name, state)
    if seen == key and state is not None:
        return {}, False  # finished and already shown
    text = ctx.redact("\n".join(job.log_lines(60)))
    out = {tab.progress: progress_view(ctx, job, state), tab.log: text, tab.seen: key}
    if state is not None:  # "started" under the buttons would outlive the build
        out[tab.message] = render.message_html(ended_text(state, job.log_path),
                                               "ok" if state == "done" else "error")
    return out, state is not None


STOPPED_KEEPS = ("the entries written so far are kept; Build caches does the rest")


def ended_text(state: str, log: Path) -> str:
    """What the panel under the buttons says of a finished build; the Stop button and
    the progress timer say the same, so neither overwrites the other with news."""
    kept = f": {STOPPED_KEEPS}" if state == "stopped" else ""
    return f"cache build {state}{kept} (log: {log})"


def stop_message(ctx: AppContext) -> str:
    """*Stop build*: stops the live build and says how it ended; with none live (none
    started, or the last one over) it says there is nothing to stop, and touches nothing."""
    job = ctx.cache_job
    ended = job.poll() if job is not None else None
    if job is None or ended is not None:
        last = f" (the last one ended {ended}; log: {job.log_path})" if job else ""
        return render.message_html(f"no cache build is running{last}; nothing to stop",
                                   "info")
    state = actions.stop_cache(ctx)
    return render.message_html(ended_text(state, job.log_path), "info")


def wire(ctx: AppContext, form: Form, tab: CacheTab, timer: Pace, page: gr.Tab) -> None:
    """Events of the tab; opening it (`page`) refreshes the status table."""
    ins = form.inputs()
    status_outs = [tab.table, tab.note]

    @guarded("Cache status")
    def refresh(data: dict[Any, Any]) -> dict[Any, Any]:
        return refresh_view(ctx, tab, form.read(data)[0])

    @guarded("Build caches")
    def start(data: dict[Any, Any]) -> str:
        cfg, problems = form.read(data)
        try:
            job = actions.start_cache(ctx, cfg, problems)
        except ActionError as exc:
            gr.Warning(exc.message)
            return render.message_html(exc.message, "error", exc.problems)
        return render.message_html(f"cache build started (log: {job.log_path})", "ok")

    @guarded("Stop cache build", inline=tab.message)
    def stop() -> str:
        return stop_message(ctx)

    def tick(seen: Any) -> Any:
        try:
            out, finished = job_view(ctx, tab, seen)
        except Exception as exc:  # shown in the panel, not as a toast every second
            text = f"cannot read the cache build: {type(exc).__name__}: {exc}"
            return {tab.progress: render.message_html(text, "error")}
        if finished:
            try:  # the status of what the job built, from the config it ran
                out.update(status_view(ctx, tab, load_config(ctx.cache_job.folder.config)))
                out[tab.note] += (" The table shows the caches this build made; Refresh "
                                  "status shows the form's.")
            except Exception as exc:  # the table is a convenience; the bar already says it
                out[tab.note] = f"cache status unavailable: {exc}"
        return out or gr.skip()

    for trigger in (tab.refresh.click, page.select):
        trigger(refresh, ins, [*status_outs, tab.clear_id, tab.progress],
                api_visibility="private")
    tab.build.click(start, ins, [tab.message], api_visibility="private").then(
        **timer.wake())
    tab.stop.click(stop, None, [tab.message], api_visibility="private")
    tab.log.change(None, js=render.scroll_to_end("cache-log"))
    timer.add(tick, [tab.seen], [tab.progress, tab.log, tab.seen, tab.message, *status_outs])
    _wire_clear(ctx, form, tab, refresh)


def _wire_clear(ctx: AppContext, form: Form, tab: CacheTab, refresh: Any) -> None:
    ins = form.inputs() | {tab.clear_id}

    def on_dataset(action: Any, data: dict[Any, Any]) -> tuple[Any, str]:
        """(`action`'s result, "") for the chosen dataset, or (None, error panel)."""
        cfg, _ = form.read(data)
        try:
            return action(ctx, cfg, data[tab.clear_id] or ""), ""
        except ActionError as exc:
            gr.Warning(exc.message)
            return None, render.message_html(exc.message, "error")

    @guarded("Clear cache")
    def ask(data: dict[Any, Any]) -> dict[Any, Any]:
        files, message = on_dataset(actions.cache_files, data)
        if files is not None and files.files:
            text = (f"**Delete {files.describe()}?** Only cache files are removed; the "
                    "images are not touched.")
            return {tab.confirm_box: gr.Group(visible=True), tab.confirm_text: text,
                    tab.message: ""}
        if files is not None:
            message = render.message_html(f"nothing to clear in {files.folder}", "info")
        return {tab.confirm_box: gr.Group(visible=False), tab.confirm_text: "",
                tab.message: message}

    @guarded("Clear cache")
    def do_clear(data: dict[Any, Any]) -> dict[Any, Any]:
        done, message = on_dataset(actions.clear_cache, data)
        if done is not None:
            message = render.message_html(f"deleted {done.describe()}", "ok")
        return {tab.confirm_box: gr.Group(visible=False), tab.message: message}

    tab.clear.click(ask, ins, [tab.confirm_box, tab.confirm_text, tab.message],
                    api_visibility="private")
    tab.confirm_no.click(lambda: gr.Group(visible=False), None, [tab.confirm_box],
                         api_visibility="private")
    tab.confirm_yes.click(do_clear, ins, [tab.confirm_box, tab.message],
                          api_visibility="private").then(
        refresh, form.inputs(), [tab.table, tab.note, tab.clear_id, tab.progress],
        api_visibility="private")
