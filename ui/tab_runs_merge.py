"""Runs tab, "Merge LoRA into base": the chosen run's final LoRA fused into its base
model as <run>/merged/ (a diffusers folder), through `core.ops.merge_run`, the function
`--stage merge` calls. A refusal (no final LoRA, a live run, merged/ already there) is a
message beside the button, not an error toast: the user can act on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from core import ops
from ui import render
from ui.context import AppContext
from ui.errors import guarded
from ui.form import Form
from ui.tab_runs import file_choices

SCALE_KEY = "merge.lora_scale"


@dataclass
class MergeRow:
    button: gr.Button
    message: gr.HTML
    scale: gr.components.Component  # the form's merge.lora_scale field


def build(form: Form) -> MergeRow:
    with gr.Row():
        form.section("merge", only=("lora_scale",))
        button = gr.Button("Merge LoRA into base", scale=0, elem_id="runs-merge")
        message = gr.HTML("", elem_id="runs-merge-message")
    return MergeRow(button, message, form.fields[SCALE_KEY])


def merge_message(ctx: AppContext, run_dir: str | None, scale: float | None) -> str:
    """The outcome as the HTML beside the button: where merged/ is, or why not."""
    if not run_dir:
        return render.message_html("choose a run first; nothing was merged", "warning")
    if scale is None:
        return render.message_html("set Merge LoRA scale (1: the LoRA as trained); "
                                   "nothing was merged", "warning")
    try:
        merged = ops.merge_run(Path(run_dir), ctx.workspace, float(scale))
    except ops.OpError as exc:
        return render.message_html(_relative(ctx, exc.message, run_dir), "warning")
    checkpoint = ops.RunFolder(merged.parent).merged_checkpoint
    single = (f" and {ctx.relative(checkpoint)}, one checkpoint file (A1111, ComfyUI)"
              if checkpoint.is_file() else "")
    return render.message_html(f"merged (base + LoRA at scale {scale:g}): "
                               f"{ctx.relative(merged)}, a diffusers folder{single}; "
                               "download it from the run's files above", "ok")


def _relative(ctx: AppContext, message: str, run_dir: str) -> str:
    """Folders as the Runs tab shows them: relative to the workspace."""
    return message.replace(str(Path(run_dir)), ctx.relative(run_dir))


def wire(ctx: AppContext, row: MergeRow, choice: gr.Dropdown, files: gr.Dropdown) -> None:
    """The button merges the run chosen in `choice`, at the scale in the row, and lists
    the run's files again in `files`, the merged model's among them."""

    @guarded("Merge LoRA")
    def handler(run_dir: str | None, scale: float | None) -> tuple[str, Any]:
        return merge_message(ctx, run_dir, scale), file_choices(ctx, run_dir)[0]

    row.button.click(handler, [choice, row.scale], [row.message, files],
                     api_visibility="private")

