"""Runs tab, "Merge LoRA into base": the chosen run's final LoRA fused into its base
model as <run>/merged/ (a diffusers folder), through `core.ops.merge_run`, the function
`--stage merge` calls. A refusal (no final LoRA, a live run, merged/ already there) is a
message beside the button, not an error toast: the user can act on it. A run that has
merged/ (merged, then extended) shows a box to tick: Merge then replaces it, never
without the tick."""

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
    replace: gr.Checkbox  # shown while the chosen run has merged/: Merge replaces it


REPLACE_LABEL = "Replace this run's merged/ (the old one is deleted once the new one is written)"


def build(form: Form) -> MergeRow:
    with gr.Row():
        form.section("merge", only=("lora_scale",))
        replace = gr.Checkbox(label=REPLACE_LABEL, value=False, visible=False,
                              elem_id="runs-merge-replace")
        button = gr.Button("Merge LoRA into base", scale=0, elem_id="runs-merge")
        message = gr.HTML("", elem_id="runs-merge-message")
    return MergeRow(button, message, form.fields[SCALE_KEY], replace)


def merge_message(ctx: AppContext, run_dir: str | None, scale: float | None,
                  replace: bool = False) -> str:
    """The outcome as the HTML beside the button: where merged/ is, or why not; an
    existing merged/ is replaced only with `replace` (the box ticked)."""
    if not run_dir:
        return render.message_html("choose a run first; nothing was merged", "warning")
    if scale is None:
        return render.message_html("set Merge LoRA scale (1: the LoRA as trained); "
                                   "nothing was merged", "warning")
    merged_dir = ops.RunFolder(Path(run_dir)).merged
    if merged_dir.exists() and not replace:
        return render.message_html(
            f"{ctx.relative(merged_dir)} exists already (merged before the run was "
            f"extended?); nothing was overwritten: tick \"{REPLACE_LABEL}\" and Merge "
            "again to replace it", "warning")
    try:
        merged = ops.merge_run(Path(run_dir), ctx.workspace, float(scale), replace=replace)
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
    def handler(run_dir: str | None, scale: float | None, replace: bool) -> tuple[Any, ...]:
        return (merge_message(ctx, run_dir, scale, bool(replace)),
                file_choices(ctx, run_dir)[0], replace_box(run_dir))

    row.button.click(handler, [choice, row.scale, row.replace],
                     [row.message, files, row.replace], api_visibility="private")
    # Another run chosen: its own merged/ (or none) decides the box, always unticked.
    choice.input(lambda d: ("", replace_box(d)), [choice], [row.message, row.replace],
                 api_visibility="private", show_progress="hidden")


def replace_box(run_dir: str | None) -> Any:
    """The Replace box, unticked, shown while the run has a merged/ to replace."""
    shown = bool(run_dir) and ops.RunFolder(Path(run_dir or ".")).merged.exists()
    return gr.update(value=False, visible=shown)

