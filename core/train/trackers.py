"""TensorBoard and Weights & Biases through accelerate's trackers.

logging.tensorboard writes <output.dir>/tensorboard/; logging.wandb_project logs the same
to that W&B project. Per step: train/loss, train/lr; per eval: eval/loss,
eval/loss_shuffled and eval/by_t/<t>, eval/by_t_shuffled/<t> (the `eval` event's fields);
per validation round: the images, one tag per prompt. Only the main process writes
(accelerate's trackers act on the main process only), and nothing is imported when both
are off.

The trackers are built as objects rather than by name because one `init_trackers`
project name cannot be both TensorBoard's folder and the W&B project.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any

from core.runs.folder import RunFolder

TENSORBOARD_MISSING = ("logging.tensorboard is true but the tensorboard package is not "
                       "installed, so nothing is written to tensorboard/: pip install "
                       "tensorboard (requirements.txt has it), or set logging.tensorboard "
                       "= false")
WANDB_MISSING = ("logging.wandb_project is set but the wandb package is not installed: "
                 "pip install wandb, then wandb login (or set logging.wandb_project = \"\")")


def make_trackers(cfg: Any, run_dir: Path) -> tuple[list[Any], list[str]]:
    """accelerate tracker objects for Accelerator(log_with=...), and what the log should
    say about the ones that cannot run here."""
    trackers: list[Any] = []
    notes: list[str] = []
    if cfg.logging.tensorboard:
        if find_spec("tensorboard") is None:
            notes.append(f"warning: {TENSORBOARD_MISSING}")
        else:
            from accelerate.tracking import TensorBoardTracker

            folder = RunFolder(run_dir).tensorboard
            trackers.append(TensorBoardTracker(folder.name, str(folder.parent)))
    if cfg.logging.wandb_project:
        if find_spec("wandb") is None:  # --stage check refuses this; a bare trainer says it
            notes.append(f"warning: {WANDB_MISSING}")
        else:
            from accelerate.tracking import WandBTracker

            # wandb.init(dir=D) keeps its files in D/wandb: the run folder's wandb/.
            folder = RunFolder(run_dir)
            trackers.append(WandBTracker(cfg.logging.wandb_project, dir=str(folder.root),
                                         name=folder.root.name))
    return trackers, notes


class Tracking:
    """What the reporter sends to the trackers; every method is a no-op without any."""

    def __init__(self, accelerator: Any) -> None:
        self.acc = accelerator
        self.active = False

    def start(self, start_step: int) -> None:
        """Start the trackers. A resume from step S hides what an earlier launch logged
        after S (TensorBoard's purge_step), so the curve has one value per step."""
        if not self.acc.log_with:
            return
        for tracker in self.acc.log_with:
            if getattr(tracker, "name", "") == "tensorboard" and start_step > 0:
                tracker.init_kwargs["purge_step"] = start_step + 1
        self.acc.init_trackers("diffusion-trainer")
        self.active = True

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.active:
            self.acc.log(values, step=step)

    def eval(self, step: int, result: dict[str, Any]) -> None:
        values = {"eval/loss": result["loss"], "eval/loss_shuffled": result["loss_shuffled"]}
        for t, (own, shuffled) in result.get("by_t", {}).items():
            values[f"eval/by_t/{t}"] = own
            values[f"eval/by_t_shuffled/{t}"] = shuffled
        self.scalars(step, values)

    def images(self, step: int, paths: list[Path], prompts: list[str]) -> None:
        """One image per prompt, tagged validation/NN (the file name), captioned with the
        prompt where the tracker shows captions; a validation video as a strip of its
        frames (grid.validation_picture)."""
        if not self.active or not self.acc.is_main_process or not paths:
            return
        import numpy as np

        from core.train.grid import validation_picture

        shown = [(p, validation_picture(Path(p))) for p in paths]
        paths = [p for p, picture in shown if picture is not None]  # unreadable: left out
        pixels = [np.asarray(picture) for _, picture in shown if picture is not None]
        names = [f"validation/{Path(p).stem}" for p in paths]
        for tracker in self.acc.trackers:
            if tracker.name == "tensorboard":
                writer = self.acc.get_tracker("tensorboard", unwrap=True)
                for name, image in zip(names, pixels, strict=True):
                    writer.add_image(name, image, step, dataformats="HWC")
                writer.flush()
            elif tracker.name == "wandb":
                import wandb

                captions = [prompts[i] if i < len(prompts) else "" for i in range(len(paths))]
                self.acc.get_tracker("wandb", unwrap=True).log(
                    {"validation": [wandb.Image(im, caption=c)
                                    for im, c in zip(pixels, captions, strict=True)]},
                    step=step)

    def end(self) -> None:
        """Close the writers (the last events reach the disk). Not end_training(): that
        also tears down the process group, which main.py leaves to accelerate."""
        if self.active:
            for tracker in self.acc.trackers:
                tracker.finish()
            self.active = False
