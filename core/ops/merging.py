"""Merging a run's final LoRA into its base model (core/merge.py)."""

from __future__ import annotations

from pathlib import Path

from core.config import Config
from core.ops.checks import output_dir
from core.ops.errors import OpError


def merge_run(run_dir: Path, workspace: Path, lora_scale: float | None = None,
              replace: bool = False) -> Path:
    """Fuse the run's final LoRA into its base: `<run_dir>/merged/`, a diffusers folder
    (core/merge.py); `lora_scale` None uses the run's merge.lora_scale. Refuses (exit 2)
    a folder without a run or a final LoRA, a live run, and an existing merged/ (which
    `replace`, the person's confirmation, replaces instead)."""
    from core.merge import MergeRefused
    from core.merge import merge_run as merge

    try:
        return merge(Path(run_dir), workspace, lora_scale, replace).folder
    except MergeRefused as exc:
        raise OpError(exc.problem.message, [exc.problem]) from None


def merge(cfg: Config, workspace: Path) -> Path:
    """`--stage merge`: the run in `cfg`'s output.dir, at `cfg`'s merge.lora_scale."""
    return merge_run(output_dir(cfg, workspace), workspace, cfg.merge.lora_scale)
