"""Runs tab: past and live runs of the workspace (from the run registry) with state, step
and outputs; open one to follow it in the Training tab's run views (ui/run_views.py).
Listing a run whose processes are gone while its status said "running" shows as failed
(core.runs.registry).

Below the chooser, for the chosen run: its place in the run queue (move it up or down,
cancel it), its files to download (config.toml, the LoRA files by step, a merged model
whole as one .zip), and deleting
it, behind a checkbox that names the folder.

A refusal (no run chosen, the box not ticked) shows beside the button that was
refused, never as an error toast; the messages beside the buttons say what the last
click did, and go when the list is refreshed or another run is chosen."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from core import ops
from core.config import load_config
from core.ops import RunFolder
from core.problems import ConfigError
from ui import actions, render, run_views
from ui.actions import ActionError
from ui.context import AppContext
from ui.errors import guarded
from ui.form import Form
from ui.run_views import RunView


@dataclass
class RunsTab:
    refresh: gr.Button
    table: gr.Dataframe
    choice: gr.Dropdown
    open: gr.Button
    message: gr.HTML
    loras: gr.Dataframe
    queue: gr.Dataframe
    up: gr.Button
    down: gr.Button
    cancel: gr.Button
    file: gr.Dropdown
    download: gr.DownloadButton
    confirm: gr.Checkbox
    delete: gr.Button
    queue_message: gr.HTML  # beside Move up/down and Cancel
    delete_message: gr.HTML  # beside Delete

    def listed(self) -> list[Any]:
        """What `runs_view` updates."""
        return [self.table, self.choice, self.queue, *self.chosen()]

    def chosen(self) -> list[Any]:
        """What `chosen_view` updates (the chosen run's parts and the buttons' messages,
        which were about the run chosen before)."""
        return [self.loras, self.file, self.download, self.confirm, self.message,
                self.queue_message, self.delete_message]


QUEUE_HEADERS = ["#", "queued run (starts when nothing runs)", "queued at"]


def build() -> RunsTab:
    with gr.Row():
        refresh = gr.Button("Refresh", scale=0, elem_id="runs-refresh")
    table = gr.Dataframe(headers=render.RUN_HEADERS, label="Runs (newest first)",
                         interactive=False, elem_id="runs-table", wrap=True)
    with gr.Row():
        choice = gr.Dropdown(label="Run", choices=[], elem_id="runs-choice", scale=3)
        open_btn = gr.Button("Open and follow", variant="primary", scale=0,
                             elem_id="runs-open")
    message = gr.HTML("")
    loras = gr.Dataframe(headers=render.LORA_HEADERS, label="The chosen run's LoRAs by step "
                         "(newest first; the final one is lora/pytorch_lora_weights.safetensors)",
                         interactive=False, elem_id="runs-loras", wrap=True)
    queue = gr.Dataframe(headers=QUEUE_HEADERS, label="Run queue (the first starts next)",
                         interactive=False, elem_id="runs-queue", wrap=True)
    with gr.Row():
        up = gr.Button("Move up", scale=0, elem_id="runs-up")
        down = gr.Button("Move down", scale=0, elem_id="runs-down")
        cancel = gr.Button("Cancel queued run", scale=0, elem_id="runs-cancel")
        queue_message = gr.HTML("", elem_id="runs-queue-message", scale=2, min_width=200)
    with gr.Row():
        file = gr.Dropdown(label="File of the chosen run", choices=[], scale=3,
                           elem_id="runs-file")
        download = gr.DownloadButton("Download", value=None, interactive=False, scale=0,
                                     elem_id="runs-download")
    with gr.Row():
        confirm = gr.Checkbox(label=DELETE_LABEL.format(folder="the chosen run's folder"),
                              value=False, elem_id="runs-delete-confirm", scale=3)
        delete = gr.Button("Delete run", variant="stop", scale=0, elem_id="runs-delete")
        # beside the button: a refusal must not hide the box it asks to tick
        delete_message = gr.HTML("", elem_id="runs-delete-message", scale=2, min_width=200)
    return RunsTab(refresh, table, choice, open_btn, message, loras, queue, up, down,
                   cancel, file, download, confirm, delete, queue_message, delete_message)


# The tab's events that redraw its view run one at a time in the order they were asked
# (Gradio's queue for one concurrency id): a slow listing asked before a choice or a
# Delete would otherwise land after them and undo what they showed.
IN_ORDER = {"concurrency_id": "runs-view", "concurrency_limit": 1}

DELETE_LABEL = "I understand this deletes {folder} and everything in it"


def runs_view(ctx: AppContext, tab: RunsTab, chosen: str | None = None) -> dict[Any, Any]:
    """The table of runs, the queue and the run chooser (`chosen` when it is still a
    run, else the newest)."""
    infos = ops.list_runs(ctx.workspace)
    choices = [(f"{ctx.relative(i.run_dir)} ({i.state})", str(i.run_dir)) for i in infos]
    if chosen not in {value for _, value in choices}:
        chosen = choices[0][1] if choices else None
    return {tab.table: render.run_rows(infos, ctx.relative),
            tab.choice: gr.Dropdown(choices=choices, value=chosen),
            tab.queue: queue_rows(ctx), **chosen_view(ctx, tab, chosen)}


def queue_rows(ctx: AppContext) -> list[list[object]]:
    return [[n, ctx.relative(e.run_dir), _clock(e.queued_at)]
            for n, e in enumerate(ops.queue_entries(ctx.workspace), start=1)]


def _clock(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if stamp else "-"


def known_run(ctx: AppContext, run_dir: str | None) -> bool:
    """Only runs of this workspace's registry are shown, served or changed."""
    return bool(run_dir) and run_dir in {str(i.run_dir) for i in ops.list_runs(ctx.workspace)}


def chosen_view(ctx: AppContext, tab: RunsTab, run_dir: str | None) -> dict[Any, Any]:
    """The chosen run's LoRAs by step, its files to download, and an unticked delete
    confirmation that names its folder."""
    known = known_run(ctx, run_dir)
    files, note = file_choices(ctx, run_dir)
    folder = ctx.relative(run_dir) if known and run_dir else "the chosen run's folder"
    return {tab.loras: render.lora_rows(Path(run_dir), ctx.relative) if known and run_dir
            else [],
            tab.file: files,
            tab.download: gr.DownloadButton("Download", value=None, interactive=False),
            tab.confirm: gr.Checkbox(label=DELETE_LABEL.format(folder=folder), value=False),
            tab.message: note, tab.queue_message: "", tab.delete_message: ""}


def file_choices(ctx: AppContext, run_dir: str | None) -> tuple[gr.Dropdown, str]:
    """The files of the chosen run to download (none chosen yet), and a note where they
    cannot be served."""
    choices, note = [], ""
    if known_run(ctx, run_dir) and run_dir:
        try:
            choices = [(ctx.relative(p), str(p)) for p in actions.run_downloads(ctx, run_dir)]
        except ActionError as exc:
            # A headless run whose output.dir is outside the workspace: listed and
            # followed, but its files are not served; said beside the list instead of
            # failing the whole tab.
            note = f"{exc}; copy its files from that folder"
        merged = merged_folder(run_dir)
        if not note and merged.is_dir():  # the whole merged model, first: what leaves
            choices.insert(0, (MERGED_CHOICE.format(folder=ctx.relative(merged)), str(merged)))
    return gr.Dropdown(choices=choices, value=None), note


# The merged model whole: its folder, served as one archive made when it is chosen.
MERGED_CHOICE = "{folder}/ (the whole merged model, one .zip)"


def merged_folder(run_dir: str) -> Path:
    return RunFolder(Path(run_dir).resolve()).merged


def download_view(ctx: AppContext, run_dir: str | None, path: str | None) -> Any:
    """The download button for one file of the chosen run; anything that is not one of
    its files (inside the workspace) is refused."""
    if not path:
        return gr.DownloadButton("Download", value=None, interactive=False)
    if known_run(ctx, run_dir) and run_dir and path == str(merged_folder(run_dir)):
        path = str(actions.merged_archive(ctx, run_dir))  # made now, inside the workspace
    elif not known_run(ctx, run_dir) or path not in {
            str(p) for p in actions.run_downloads(ctx, run_dir or "")}:
        raise ActionError(f"{path} is not a file of the chosen run; choose it again")
    # An update, not a component: a component built here would copy the file into
    # Gradio's cache now and again when the update is sent.
    return gr.update(value=path, label=f"Download {Path(path).name}", interactive=True)


newest_live = run_views.newest_live


def open_view(ctx: AppContext, tab: RunsTab, view: RunView, form: Form | None,
              run_dir: str | None) -> dict[Any, Any]:
    """Follow a run of the workspace in `view` and show its settings (its config.toml)
    in `form`, so Resume, Extend and Launch then act on what the form shows."""
    if not run_dir:
        raise ActionError("choose a run first")
    if not known_run(ctx, run_dir):  # only runs of this workspace's registry
        raise ActionError(f"{run_dir} is not a run of this workspace")
    out = {**run_views.opened(ctx, view, run_dir), tab.message: ""}
    config = RunFolder(Path(run_dir)).config
    if form is None or not config.exists():
        return out
    try:
        out.update(form.fill(load_config(config)))
    except ConfigError as exc:  # still follow it; say why the form kept its settings
        out[tab.message] = render.message_html(
            f"{ctx.relative(config)} does not load; the form keeps its settings", "error",
            exc.problems)
    return out


def wire(ctx: AppContext, tab: RunsTab, view: RunView, tabs: gr.Tabs,
         form: Form | None = None, after_fill: tuple[Any, ...] = ()) -> None:
    """Events of the tab; an opened run is shown in `view` (its settings in `form`, then
    `after_fill` runs) and `tabs` switch to it."""

    @guarded("List runs")
    def refresh(chosen: str | None) -> dict[Any, Any]:
        return runs_view(ctx, tab, chosen)

    @guarded("Open run", inline=tab.message)
    def open_run(run_dir: str | None) -> dict[Any, Any]:
        return {**open_view(ctx, tab, view, form, run_dir), tabs: gr.Tabs(selected="train")}

    tab.refresh.click(refresh, [tab.choice], tab.listed(), api_visibility="private",
                      **IN_ORDER)
    tab.choice.input(guarded("Chosen run")(lambda d: chosen_view(ctx, tab, d)), [tab.choice],
                     tab.chosen(), api_visibility="private", **IN_ORDER)
    tab.file.input(guarded("Download", inline=tab.message)(
        lambda d, p: {tab.download: download_view(ctx, d, p), tab.message: ""}),
        [tab.choice, tab.file], [tab.download, tab.message], api_visibility="private",
        **IN_ORDER)
    opened = tab.open.click(open_run, [tab.choice],
                            [*view.components(), tabs, tab.message,
                             *(form.outputs() if form is not None else [])],
                            api_visibility="private")
    for then in after_fill:
        opened.then(**then)
    wire_changes(ctx, tab, view)


def wire_changes(ctx: AppContext, tab: RunsTab, view: RunView) -> None:
    """The queue's buttons and Delete: each acts on the chosen run, then lists again."""

    def queue_action(what: str, act: Any) -> Any:
        @guarded(what, inline=tab.queue_message)
        def handler(run_dir: str | None) -> dict[Any, Any]:
            if not known_run(ctx, run_dir):
                raise ActionError("choose a queued run first")
            text = act(run_dir)
            return {**runs_view(ctx, tab, run_dir),
                    tab.queue_message: render.message_html(text)}
        return handler

    def cancel(run_dir: str) -> str:
        actions.cancel_queued(ctx, run_dir)
        return f"{ctx.relative(run_dir)}: cancelled (its folder is kept)"

    def move(delta: int) -> Any:
        def act(run_dir: str) -> str:
            order = actions.move_queued(ctx, run_dir, delta)
            return f"{ctx.relative(run_dir)} is now number {order.index(Path(run_dir)) + 1}"
        return act

    outs = tab.listed()
    tab.up.click(queue_action("Move up", move(-1)), [tab.choice], outs,
                 api_visibility="private", **IN_ORDER)
    tab.down.click(queue_action("Move down", move(1)), [tab.choice], outs,
                   api_visibility="private", **IN_ORDER)
    tab.cancel.click(queue_action("Cancel queued run", cancel), [tab.choice], outs,
                     api_visibility="private", **IN_ORDER)

    @guarded("Delete run", inline=tab.delete_message)
    def delete(run_dir: str | None, confirm: bool, following: Any) -> dict[Any, Any]:
        if not known_run(ctx, run_dir):
            raise ActionError("choose a run first")
        if not confirm:
            raise ActionError(f"tick \"{DELETE_LABEL.format(folder=ctx.relative(run_dir))}\""
                              " first; nothing was deleted")
        mine = (following if following is not None
                and Path(following.run_dir).resolve() == Path(run_dir or "").resolve()
                else None)
        # A tick reading the followed run finishes first, and none reads it while it
        # goes: a tick's views sent after this would hide "was deleted".
        with mine.busy if mine is not None else contextlib.nullcontext():
            path = actions.delete_run(ctx, run_dir or "", confirm=True)
            if mine is not None:
                mine.deleted = True
        text = f"deleted {ctx.relative(path)}"
        out = {**runs_view(ctx, tab), tab.delete_message: render.message_html(text, "ok")}
        if mine is not None:
            out.update(run_views.gone(ctx, view, path))
        return out

    tab.delete.click(delete, [tab.choice, tab.confirm, view.following],
                     [*outs, *view.components()], api_visibility="private", **IN_ORDER)


def on_load(ctx: AppContext, tab: RunsTab, view: RunView, following: Any) -> dict[Any, Any]:
    """A new page: list the runs and, when nothing is followed, follow the newest live
    run (a restarted app picks its running training back up)."""
    out = runs_view(ctx, tab)
    live = newest_live(ctx) if following is None else None
    if live is not None:
        out.update(run_views.opened(ctx, view, live))
    return out
