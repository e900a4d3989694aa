"""Extend a finished run: train it on from its final step to a larger train.max_steps.

A plain resume of a `done` run would restore its last checkpoint, train no step and
rewrite its final checkpoint and weights, so it is refused (naming train.max_steps).
Extending keeps everything the run made: the LoRA of the old final step stays in
`lora/step_NNNNNN/` (written from `lora/` when missing, e.g. by an older version), a full
fine-tune's `model/` becomes `model-step_NNNNNN/`, and only then does the run's
config.toml get the new max_steps, which the resumed trainer reads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from core.config import Config, load_config, save_config
from core.files import atomic_path
from core.problems import Hint, Problem, hinted, warning
from core.runs.folder import RunFolder, step_name
from core.runs.prepare import RunDirError
from core.runs.status import append_event, read_status


def final_step(run_dir: Path) -> int | None:
    """The step a `done` run ended at; None when the run is not done."""
    status = read_status(run_dir)
    if status is None or status.state != "done":
        return None
    if status.step is not None:
        return int(status.step)
    return status.max_steps


def refusal(run_dir: Path, step: int, asked: int) -> RunDirError:
    """A done run asked to resume to a max_steps it already reached."""
    return RunDirError([hinted("train.max_steps", Hint(
        f"{run_dir} is done: it trained all {step} steps, and {{key}} = {asked} adds none. "
        "Resuming it would only rewrite its final checkpoint and LoRA; to train it "
        "further, {extend}", "train.max_steps", str(max(step * 2, step + 1))))])


def keep_final_outputs(run_dir: Path, step: int, method: str) -> list[str]:
    """Keep what the run's final save wrote from being replaced by the extended run's;
    returns what was kept, in words."""
    folder = RunFolder(run_dir)
    if method == "full":
        if not folder.model.is_dir():
            return []
        kept = folder.root / f"model-{step_name(step)}"
        if not kept.exists():
            folder.model.rename(kept)  # a rename: no copy of a multi-GB model
        return [f"the model of step {step} stays in {kept}"]
    target = folder.lora_step(step)
    if target.is_dir():
        return [f"the LoRA of step {step} stays in {target}"]
    files = sorted(p for p in folder.lora.glob("*.safetensors") if p.is_file())
    if not files:
        return []
    # complete or absent, as the trainer's
    with atomic_path(target, temp=f".tmp-{target.name}", folder=True) as tmp:
        for path in files:
            shutil.copy2(path, tmp / path.name)
    append_event(run_dir, {"type": "lora_saved", "step": step,
                           "folder": f"lora/{target.name}",
                           "paths": [str(target / p.name) for p in files]})
    return [f"the LoRA of step {step} was copied to {target}"]


def extend_if_done(cfg: Config, run_dir: Path) -> list[Problem]:
    """Before a resume of `run_dir` with `cfg` (the caller's config): when the run is
    done, refuse unless cfg.train.max_steps is larger than its final step, else keep its
    final outputs and write the new max_steps into its config.toml. Returns notes (empty
    when the run is not done: a plain resume)."""
    step = final_step(run_dir)
    folder = RunFolder(run_dir)
    if step is None or not folder.config.exists():
        return []
    asked = cfg.train.max_steps
    if asked <= step:
        raise refusal(run_dir, step, asked)
    saved = load_config(folder.config)
    kept = keep_final_outputs(run_dir, step, saved.train.method)
    old = saved.train.max_steps
    saved.train.max_steps = asked
    save_config(saved, folder.config)
    append_event(run_dir, {"type": "extend", "step": step, "max_steps": asked,
                           "previous_max_steps": old})
    return [warning("train.max_steps", f"extending {run_dir} from step {step} to {asked} "
                                       f"(its config.toml now says {asked}); "
                                       + "; ".join(kept or ["it had no saved weights"]))]
