"""The headless CLI's view of a job: follow it in the terminal (its log, Ctrl-C as a
graceful stop) and sum up a finished run (where its results are, how to resume it)."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from core.config import LaunchConfig
from core.models.adapters import lycoris_only_note
from core.runs.folder import RunFolder
from core.runs.manager import RunHandle
from core.runs.outputs import saved_loras, tensorboard_command
from core.runs.status import exit_code_for_state


def follow_in_terminal(handle: RunHandle, stream: TextIO, grace_s: float,
                       stopping: bool = False) -> tuple[str, int]:
    """Show the job's log on `stream` until it ends (a terminal gets one progress line
    redrawn in place, a log one every N steps): its final state and the CLI exit code.
    `stopping`: stop it at once (a Ctrl-C came while it started). A failure ends with
    its reason (status.json's: a killed trainer's signal, last step and memory)."""
    from core.runs.console import make_console
    from core.runs.foreground import follow_run
    from core.runs.status import read_status

    state = follow_run(handle, make_console(stream), grace_s=grace_s, stopping=stopping)
    status = read_status(handle.folder.root)
    if state == "failed" and status is not None and status.reason:
        print(f"error: {status.reason}", file=stream, flush=True)
    return state, exit_code_for_state(state)


def run_summary(run_dir: Path, state: str, workspace: Path,
                launch: LaunchConfig | None = None) -> list[str]:
    """Where a finished run's results are and how to resume it, a line each; `launch`:
    this machine's place."""
    lines: list[str] = []
    say = lines.append
    launch = launch or LaunchConfig()
    several = launch.num_machines > 1
    folder = RunFolder(run_dir)
    say(f"run {state}: {run_dir}" + (f" (machine {launch.machine_rank} of "
                                     f"{launch.num_machines})" if several else ""))
    if folder.lora_weights.exists():
        say(f"LoRA: {folder.lora_weights}")
    else:
        lycoris = sorted(folder.lora.glob("*.safetensors")) if folder.lora.is_dir() else []
        if lycoris:  # train.lora_kind = lokr/loha: no diffusers file (adapters.py)
            say(f"LoRA: {lycoris[0]} ({lycoris_only_note()})")
    saved = saved_loras(folder)
    if saved:
        steps = (f"step {saved[0].step}" if len(saved) == 1 else
                 f"{len(saved)} saves, steps {saved[0].step} to {saved[-1].step}")
        say(f"LoRAs by step: {folder.lora}/step_NNNNNN/ ({steps})")
    if folder.tensorboard.is_dir():
        say(f"TensorBoard: {tensorboard_command(folder)}")
    rounds = folder.validation_rounds()
    if rounds:
        say(f"validation images: {rounds[-1]}")
    if folder.validation_grid.exists():
        say(f"before/after grid: {folder.validation_grid}")
    # The saved config's relative paths resolve against this run's workspace.
    command = (f"python app.py --no-ui --workspace {workspace} --config {folder.config} "
               "--resume")
    resumable = bool(folder.checkpoint_folders())  # --resume refuses a run without one
    if state == "done" and not several and resumable:
        say(f"train it further with: {command} --set train.max_steps=N (N above the last "
            "step)")
    if state in ("stopped", "failed") and not resumable:
        say("no checkpoint was saved, so it cannot be resumed; start it again with "
            "another output.dir")
    elif state in ("stopped", "failed"):
        if several:  # the saved config says machine 0: each machine gives its own rank
            say(f"resume on every machine with: {command} --set launch.machine_rank=N "
                f"(this is machine {launch.machine_rank})")
        else:
            say(f"resume with: {command}")
    return lines
