"""Runs tab: past and live runs of the workspace (from the run registry) with state, step
and outputs; open one to follow it on the Training tab. Listing a run whose processes
are gone while its status said "running" shows as failed (core.runs.registry)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from core.runs.registry import list_runs
from ui import render
from ui.context import AppContext
from ui.errors import guarded
from ui.tab_train import TrainTab, follow, opened_views


@dataclass
class RunsTab:
    refresh: gr.Button
    table: gr.Dataframe
    choice: gr.Dropdown
    open: gr.Button
    message: gr.HTML


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
    return RunsTab(refresh, table, choice, open_btn, message)


def runs_view(ctx: AppContext) -> tuple[list, Any]:
    infos = list_runs(ctx.workspace)
    choices = [(f"{ctx.relative(i.run_dir)} ({i.state})", str(i.run_dir)) for i in infos]
    return (render.run_rows(infos, ctx.relative),
            gr.Dropdown(choices=choices, value=choices[0][1] if choices else None))


def newest_live(ctx: AppContext) -> Path | None:
    live = [i for i in list_runs(ctx.workspace) if i.alive]
    return live[0].run_dir if live else None


def wire(ctx: AppContext, tab: RunsTab, train: TrainTab, tabs: gr.Tabs) -> None:
    @guarded("List runs")
    def refresh() -> tuple:
        return runs_view(ctx)

    @guarded("Open run")
    def open_run(run_dir: str | None) -> tuple:
        if not run_dir:
            raise gr.Error("choose a run first")
        known = {str(i.run_dir) for i in list_runs(ctx.workspace)}
        if run_dir not in known:  # only runs of this workspace's registry
            raise gr.Error(f"{run_dir} is not a run of this workspace")
        f = follow(ctx, run_dir)
        shown = opened_views(ctx, f)
        return (f, *[shown[k] for k in ("progress", "log", "plot", "gallery", "command")],
                gr.Tabs(selected="train"), "")

    tab.refresh.click(refresh, None, [tab.table, tab.choice], api_visibility="private")
    tab.open.click(open_run, [tab.choice],
                   [train.following, train.progress, train.log, train.plot, train.gallery,
                    train.command, tabs, tab.message], api_visibility="private")


def on_load(ctx: AppContext, following: Any) -> tuple:
    """A new page: list the runs and, when nothing is followed, follow the newest live
    run (a restarted app picks its running training back up)."""
    rows, choice = runs_view(ctx)
    if following is not None:
        return (rows, choice, following, *([gr.skip()] * 5))
    live = newest_live(ctx)
    if live is None:
        return (rows, choice, None, *([gr.skip()] * 5))
    f = follow(ctx, live)
    shown = opened_views(ctx, f)
    return (rows, choice, f, *[shown[k] for k in ("progress", "log", "plot", "gallery",
                                                  "command")])
