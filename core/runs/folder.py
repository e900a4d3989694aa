"""The run folder as one object: every file name of the run-folder contract lives here.

    <output.dir>/
      config.toml  command.txt  train.log  events.jsonl  status.json  STOP
      validation/step_NNNNNN/NN.png
      validation/grid.png                     (prompts x steps, before beside after)
      checkpoints/step_NNNNNN/
      lora/pytorch_lora_weights.safetensors   (LoRA runs)
      lora/step_NNNNNN/                       (LoRA runs: the LoRA at each checkpoint and
                                               epoch-end save; kept when checkpoints go)
      tensorboard/                            (logging.tensorboard: the event files)
      wandb/                                  (logging.wandb_project: W&B's local files)
      model/                                  (full fine-tunes)
      merged/                                 (--stage merge: base + final LoRA fused)
      merged.safetensors                      (--stage merge, sd15/sd2/sdxl: merged/ as
                                               one A1111/ComfyUI checkpoint file)
      shared.token                            (multi-machine runs: rank 0's token)
      machines/<rank>/                        (multi-machine runs: machine <rank>'s own
                                               config.toml, command.txt, train.log,
                                               status.json, events.jsonl)

A cache build's job folder has the same shape with `cache.log` for its log (an
auto-captioning job's, `caption.log`), so the run manager starts, follows and stops them
all the same way. The trainer, the run manager, the
CLI and the UI ask a `RunFolder` for paths and never spell a file name themselves.

Only the standard library is imported: the trainer imports this before torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from core.models.file_names import LORA_WEIGHTS_NAME  # read here by merge.py and tests

FolderKind = Literal["train", "cache", "caption"]

_LOG_NAMES: dict[str, str] = {"train": "train.log", "cache": "cache.log",
                              "caption": "caption.log"}
STEP_PREFIX = "step_"
STEP_RE = re.compile(r"^step_(\d{6,})$")
SHARED_TOKEN_NAME = "shared.token"  # also written into every cache folder of the run
MACHINES_DIR = "machines"


def as_folder(where: RunFolder | str | Path) -> RunFolder:
    """A run folder from a RunFolder or a path (a training run's, by default)."""
    return where if isinstance(where, RunFolder) else RunFolder(Path(where))


def step_name(step: int) -> str:
    """`step_000250`: the folder name of a checkpoint or a validation round."""
    return f"{STEP_PREFIX}{step:06d}"


@dataclass(frozen=True)
class RunFolder:
    """Paths of one run (or cache job) folder; nothing is created by asking."""

    root: Path
    kind: FolderKind = "train"

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def command(self) -> Path:
        return self.root / "command.txt"

    @property
    def log(self) -> Path:
        return self.root / _LOG_NAMES[self.kind]

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def stop_file(self) -> Path:
        """The soft stop: the trainer checks for it every step, saves and exits."""
        return self.root / "STOP"

    @property
    def validation(self) -> Path:
        return self.root / "validation"

    def validation_step(self, step: int) -> Path:
        return self.validation / step_name(step)

    def validation_rounds(self) -> list[Path]:
        """The validation folders written so far, oldest first."""
        if not self.validation.is_dir():
            return []
        return sorted(p for p in self.validation.glob(f"{STEP_PREFIX}*") if p.is_dir())

    @property
    def validation_grid(self) -> Path:
        """One image: a row per prompt, a column per validation round (up to a few)."""
        return self.validation / "grid.png"

    def validation_images(self) -> list[Path]:
        return sorted(self.validation.glob(f"{STEP_PREFIX}*/*.png"))

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / step_name(step)

    def checkpoint_folders(self) -> list[Path]:
        """Complete checkpoints (a temp folder is renamed to step_* when whole), oldest
        first."""
        return [p for _, p in _step_folders(self.checkpoints)]

    def find_checkpoint(self, which: str) -> Path:
        """`latest` (or ""), a step number, a folder name or a path: the complete
        checkpoint it names; FileNotFoundError with a clear message when absent."""
        if which in ("latest", ""):
            found = self.checkpoint_folders()
            if not found:
                raise FileNotFoundError(
                    f"no checkpoint in {self.checkpoints} to resume from (the run ended "
                    "before its first one); start a new run with another output.dir")
            return found[-1]
        candidate = Path(which)
        if which.isdigit():
            candidate = self.checkpoint(int(which))
        elif not candidate.is_absolute():
            candidate = self.checkpoints / which
        if not (candidate / "meta.json").exists():
            raise FileNotFoundError(f"checkpoint {candidate} not found or incomplete")
        return candidate

    @property
    def lora(self) -> Path:
        return self.root / "lora"

    @property
    def lora_weights(self) -> Path:
        """The diffusers-format LoRA file (loads with `load_lora_weights`)."""
        return self.lora / LORA_WEIGHTS_NAME

    def lora_step(self, step: int) -> Path:
        """An intermediate LoRA (written at a checkpoint or an epoch end): the same files
        as lora/, of the weights at `step`."""
        return self.lora / step_name(step)

    def lora_steps(self) -> list[tuple[int, Path]]:
        """(step, folder) of the complete intermediate LoRAs, oldest first."""
        return _step_folders(self.lora)

    @property
    def tensorboard(self) -> Path:
        """logging.tensorboard: `tensorboard --logdir` this folder."""
        return self.root / "tensorboard"

    @property
    def wandb(self) -> Path:
        """logging.wandb_project: the local files Weights & Biases keeps for the run."""
        return self.root / "wandb"

    @property
    def model(self) -> Path:
        """A full fine-tune's diffusers folder."""
        return self.root / "model"

    @property
    def merged(self) -> Path:
        """`--stage merge` (core/merge.py): the base with the final LoRA fused in, a
        diffusers folder."""
        return self.root / "merged"

    @property
    def merged_checkpoint(self) -> Path:
        """`--stage merge` of a family with a single-file checkpoint layout: merged/ as
        one original-layout (A1111/ComfyUI) .safetensors."""
        return self.root / "merged.safetensors"

    @property
    def shared_token(self) -> Path:
        """Multi-machine runs: rank 0 writes a fresh token here at start and every rank
        reads it back, proving that every machine sees this folder."""
        return self.root / SHARED_TOKEN_NAME

    def machine(self, rank: int) -> RunFolder:
        """The folder of machine `rank` > 0 of a multi-machine run: its own config, log,
        status and command (machine 0 uses the run folder itself)."""
        return RunFolder(self.root / MACHINES_DIR / str(rank), self.kind)

    def holds_run(self) -> bool:
        """True when a run was started here (its config or status was written)."""
        return self.config.exists() or self.status.exists()


def _step_folders(parent: Path) -> list[tuple[int, Path]]:
    """(step, folder) of the step_NNNNNN folders in `parent`, oldest first; a temp folder
    (renamed to step_* once whole) never matches."""
    if not parent.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in parent.iterdir()
                  if p.is_dir() and (m := STEP_RE.match(p.name)))
