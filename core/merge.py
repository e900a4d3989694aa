"""`--stage merge` and the Runs tab's *Merge LoRA into base*: the run's final LoRA fused
into its base model, saved as `<output.dir>/merged/`, a diffusers folder that loads with
`DiffusionPipeline.from_pretrained` and draws what base + LoRA draws; for a family with
an original single-file layout (sd15, sd2, sdxl: `single_file.checkpoint_text_encoders`)
also `<output.dir>/merged.safetensors`, the same weights as one A1111/ComfyUI checkpoint.

The base loads through the family (core.startup.load_model, as the trainer loads it, in
its stored dtype, unquantized), diffusers' `load_lora_weights` reads the run's
`lora/pytorch_lora_weights.safetensors` (text-encoder LoRA included), `fuse_lora` folds
it into the weights at `merge.lora_scale`, and `unload_lora_weights` drops the adapter
layers, as diffusers' own "merge LoRAs" guide does. The pipeline is the family's
validation pipeline; what it does not train comes from the base's own folder
(`keep_base_components`): its scheduler (the validation pipeline's sampler would make
merged/ draw differently from base + LoRA), tokenizers and processors as the base ships
them (every file, e.g. a processor's video config), and components the family leaves
out (a safety checker), so merged/ loads and draws as the base with the LoRA does.

Never overwrites unasked: an existing merged/ is refused, naming it, unless the caller
passes `replace` (the Runs tab, after the person ticked its confirmation: a run extended
since its merge). The folder is written under a temp name and renamed (a replaced one
only once the new one is complete), so merged/ is complete or absent.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from core.config import Config, load_config, resolved
from core.files import atomic_path, replace_folder
from core.problems import ConfigError, Problem, error
from core.runs.folder import LORA_WEIGHTS_NAME, RunFolder

LIVE = ("queued", "starting", "running", "stopping")


class MergeRefused(Exception):
    """The merge cannot run; `problem` names the folder or key and what to do."""

    def __init__(self, problem: Problem):
        self.problem = problem
        super().__init__(problem.message)


@dataclass(frozen=True)
class Merged:
    folder: Path  # <output.dir>/merged
    lora: Path  # the LoRA file fused in
    base: str  # model.path of the run
    lora_scale: float
    checkpoint: Path | None = None  # merged.safetensors (a family with that layout)


def _refuse(where: str, message: str) -> MergeRefused:
    return MergeRefused(error(where, message))


def merge_problem(run_dir: Path, replace: bool = False) -> Problem | None:
    """Why `run_dir` cannot be merged (no run, a live run, no final diffusers LoRA, a
    full fine-tune, merged/ already there unless `replace`), or None. Reads only."""
    from core.models.adapters import lycoris_only_note
    from core.runs.status import read_status

    folder = RunFolder(run_dir)
    where = str(folder.root)
    if not folder.config.exists():
        return error(where, f"{where} holds no run (no {folder.config.name}); choose a run "
                            "folder (output.dir of a finished LoRA run)")
    status = read_status(run_dir)
    if status is not None and status.state in LIVE:
        return error(where, f"the run in {where} is {status.state}; merge it once it has "
                            "ended")
    for made in (folder.merged, folder.merged_checkpoint):
        if made.exists() and not replace:
            return error(str(made), f"{made} exists already; nothing was overwritten: "
                                    "delete or rename it to merge again")
    if folder.model.is_dir() and not folder.lora.is_dir():
        return error(where, f"the run in {where} is a full fine-tune: its {folder.model} is "
                            "the whole model already, there is no LoRA to merge")
    if not folder.lora_weights.exists():
        others = sorted(folder.lora.glob("*.safetensors")) if folder.lora.is_dir() else []
        why = (f" ({lycoris_only_note()})" if others else
               " (the run has not finished: resume it to the end, or it saved no LoRA)")
        return error(where, f"the run in {where} has no final LoRA {folder.lora_weights}"
                            f"{why}; nothing to merge")
    return None


def run_config(run_dir: Path, workspace: Path) -> Config:
    """The run's own config.toml (the base it trained on), paths resolved."""
    path = RunFolder(run_dir).config
    try:
        return resolved(load_config(path), workspace)
    except ConfigError as exc:
        first = exc.problems[0] if exc.problems else error(str(path), "does not load")
        raise _refuse(str(path), f"{path} does not load: {first}") from None


def merge_run(run_dir: Path, workspace: Path, lora_scale: float | None = None,
              replace: bool = False) -> Merged:
    """Fuse the run's final LoRA into its base and write merged/; `lora_scale` (None:
    the run's merge.lora_scale) weights the LoRA; `replace` (asked by the person) puts
    the new merged/ (and merged.safetensors) in place of an existing one. Raises
    MergeRefused."""
    run_dir = Path(run_dir)
    problem = merge_problem(run_dir, replace)
    if problem is not None:
        raise MergeRefused(problem)
    cfg = run_config(run_dir, workspace)
    scale = cfg.merge.lora_scale if lora_scale is None else lora_scale
    folder = RunFolder(run_dir)
    pipe = fused_pipeline(cfg, workspace, folder.lora, scale)
    swap = replace_folder if replace else None
    with atomic_path(folder.merged, temp=f".tmp-{folder.merged.name}", swap=swap) as tmp:
        pipe.save_pretrained(str(tmp), safe_serialization=True)
        base = base_folder(cfg, workspace)
        if base is not None:
            keep_base_components(base, tmp, pipe)
        if folder.merged.exists() and not replace:  # made meanwhile: keep the other one
            raise _refuse(str(folder.merged), f"{folder.merged} appeared while merging; "
                          "nothing was overwritten")
    checkpoint = write_checkpoint(cfg, folder)
    return Merged(folder.merged, folder.lora_weights, cfg.model.path, scale, checkpoint)


def write_checkpoint(cfg: Config, folder: RunFolder) -> Path | None:
    """merged/ as one original-layout checkpoint file (merged.safetensors, what A1111
    and ComfyUI's Load Checkpoint read), for a family with that layout; None for others."""
    from core.models.ldm_checkpoint import write_single_file
    from core.models.registry import get_family

    layout = get_family(cfg.model.family).single_file.checkpoint_text_encoders
    if not layout:
        return None
    return write_single_file(folder.merged, layout, folder.merged_checkpoint)


def fused_pipeline(cfg: Config, workspace: Path, lora_dir: Path, scale: float) -> object:
    """The base's pipeline with the LoRA in `lora_dir` fused in and its layers removed."""
    from core.models.loading import ModelLoadError
    from core.startup import load_model

    alone = SimpleNamespace(device="cpu", main_process_first=contextlib.nullcontext)
    try:
        family, components = load_model(cfg, workspace, alone, dtype=None, device="cpu")
    except ModelLoadError as exc:
        raise MergeRefused(exc.problem) from None
    pipe = family.validation_pipeline(components)
    pipe.load_lora_weights(str(lora_dir), weight_name=LORA_WEIGHTS_NAME,
                           adapter_name="run")
    pipe.fuse_lora(lora_scale=scale, adapter_names=["run"])
    pipe.unload_lora_weights()
    return as_diffusers_pipeline(pipe)


def as_diffusers_pipeline(pipe: Any) -> Any:
    """The same modules in the nearest diffusers pipeline class: a family's validation
    pipeline may be a subclass of its own (Qwen-Image's), whose name model_index.json
    would record and `DiffusionPipeline.from_pretrained` could not find."""
    import diffusers

    cls = next(c for c in type(pipe).__mro__ if getattr(diffusers, c.__name__, None) is c)
    if cls is type(pipe):
        return pipe
    return cls(**{name: module for name, module in pipe.components.items()
                  if name in _init_names(cls)})


def _init_names(cls: type) -> set[str]:
    import inspect

    return set(inspect.signature(cls.__init__).parameters) - {"self"}


def base_folder(cfg: Config, workspace: Path) -> Path | None:
    """The diffusers folder the run's base was read from (model.path resolved: a tiny
    model's built folder, a folder, a hub id's cached snapshot; a single file's
    model.config), or None where there is none (random:, a file without model.config)."""
    from core.models.source import model_source
    from core.models.tiny import resolve_model_path

    path = cfg.model.path
    source = model_source(path)
    if source.kind == "file":
        path = cfg.model.config
        source = model_source(path)
    if source.kind == "tiny":
        return Path(resolve_model_path(path, workspace))
    if source.kind == "folder":
        return Path(path)
    if source.kind == "hub":
        from huggingface_hub import snapshot_download

        try:  # it loaded, so it is cached: no download here
            return Path(snapshot_download(path, local_files_only=True))
        except Exception:  # noqa: BLE001 - not cached as a whole: keep what was saved
            return None
    return None


def keep_base_components(base: Path, merged: Path, pipe: Any) -> None:
    """Make `merged` (the pipeline `pipe` just saved) carry the base's components where
    the merge changed no weights: each component of the base's model_index.json that is
    not a torch module in `pipe` (scheduler, tokenizers, processors) or that `pipe` left
    out is copied from `base` as it is there, with its index entry; the base's pipeline
    settings (requires_safety_checker...) too. Weights the LoRA was fused into stay."""
    import json

    import torch

    base_index = _read_index(base)
    if base_index is None:
        return
    index = json.loads((merged / "model_index.json").read_text(encoding="utf-8"))
    accepted = _init_names(type(pipe))
    for name, entry in base_index.items():
        if name.startswith("_") or name not in accepted:
            continue
        if not isinstance(entry, list):  # a pipeline setting, not a component
            index[name] = entry
            continue
        if isinstance(pipe.components.get(name), torch.nn.Module) or entry[0] is None:
            continue  # weights merged here, or the base has none of it
        if not (base / name).is_dir():  # not downloaded (a partial snapshot): as saved
            continue
        shutil.rmtree(merged / name, ignore_errors=True)
        shutil.copytree(base / name, merged / name)
        index[name] = entry
    _keep_prediction_type(merged, pipe)
    (merged / "model_index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n",
                                             encoding="utf-8")


def _keep_prediction_type(merged: Path, pipe: Any) -> None:
    """The base's scheduler with the prediction type the run trained with: a single
    file's model.prediction_type (an SD2-768 file read with SD2-base configs) overrides
    its config folder's, and merged/ must draw as the run's validation did."""
    import json

    trained = getattr(getattr(pipe, "scheduler", None), "config", {}).get("prediction_type")
    path = merged / "scheduler" / "scheduler_config.json"
    if trained is None or not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("prediction_type", trained) != trained:
        config["prediction_type"] = trained
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _read_index(folder: Path) -> dict[str, Any] | None:
    import json

    try:
        return json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not a diffusers folder after all: nothing to keep
        return None
