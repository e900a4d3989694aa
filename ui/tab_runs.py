"""Runs tab: past and live runs of the workspace (from the run registry) with state, step
and outputs; open one to follow it in the Training tab's run views (ui/run_views.py).
Listing a run whose processes are gone while its status said "running" shows as failed
(core.runs.registry)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from core import ops
from ui import render, run_views
from ui.context import AppContext
from ui.errors import guarded
from ui.run_views import RunView


@dataclass
class RunsTab:
    refresh: gr.Button
    table: gr.Dataframe
    choice: gr.Dropdown
    open: gr.Button
    message: gr.HTML
    loras: gr.Dataframe


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
    return RunsTab(refresh, table, choice, open_btn, message, loras)


def runs_view(ctx: AppContext, tab: RunsTab) -> dict[Any, Any]:
    """The table of runs and the run chooser (the newest run chosen)."""
    infos = ops.list_runs(ctx.workspace)
    choices = [(f"{ctx.relative(i.run_dir)} ({i.state})", str(i.run_dir)) for i in infos]
    chosen = choices[0][1] if choices else None
    return {tab.table: render.run_rows(infos, ctx.relative),
            tab.choice: gr.Dropdown(choices=choices, value=chosen),
            tab.loras: loras_view(ctx, chosen)}


def loras_view(ctx: AppContext, run_dir: str | None) -> list[list[object]]:
    """The saved LoRAs of the chosen run (a run of this workspace's registry only)."""
    if not run_dir:
        return []
    known = {str(i.run_dir) for i in ops.list_runs(ctx.workspace)}
    return render.lora_rows(Path(run_dir), ctx.relative) if run_dir in known else []


def newest_live(ctx: AppContext) -> Path | None:
    live = [i for i in ops.list_runs(ctx.workspace) if i.alive]
    return live[0].run_dir if live else None


def wire(ctx: AppContext, tab: RunsTab, view: RunView, tabs: gr.Tabs) -> None:
    """Events of the tab; an opened run is shown in `view` and `tabs` switch to it."""

    @guarded("List runs")
    def refresh() -> dict[Any, Any]:
        return runs_view(ctx, tab)

    @guarded("Open run")
    def open_run(run_dir: str | None) -> dict[Any, Any]:
        if not run_dir:
            raise gr.Error("choose a run first")
        known = {str(i.run_dir) for i in ops.list_runs(ctx.workspace)}
        if run_dir not in known:  # only runs of this workspace's registry
            raise gr.Error(f"{run_dir} is not a run of this workspace")
        return {**run_views.opened(ctx, view, run_dir), tabs: gr.Tabs(selected="train"),
                tab.message: ""}

    tab.refresh.click(refresh, None, [tab.table, tab.choice, tab.loras],
                      api_visibility="private")
    tab.choice.input(guarded("Saved LoRAs")(lambda d: loras_view(ctx, d)), [tab.choice],
                     [tab.loras], api_visibility="private")
    tab.open.click(open_run, [tab.choice], [*view.components(), tabs, tab.message],
                   api_visibility="private")


def on_load(ctx: AppContext, tab: RunsTab, view: RunView, following: Any) -> dict[Any, Any]:
    """A new page: list the runs and, when nothing is followed, follow the newest live
    run (a restarted app picks its running training back up)."""
    out = runs_view(ctx, tab)
    live = newest_live(ctx) if following is None else None
    if live is not None:
        out.update(run_views.opened(ctx, view, live))
    return out
