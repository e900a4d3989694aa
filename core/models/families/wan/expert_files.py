"""The LoRA files of a two-expert (Wan 2.2) run, and which expert each loads into.

One set of files per trained expert, each a plain Wan LoRA of one WanTransformer3DModel
(what each expert's own peft adapter holds), so every reader of Wan 2.1 LoRAs reads them:

- `pytorch_lora_weights.safetensors` (the run-folder contract's name): the high-noise
  expert's, loaded with `WanPipeline.load_lora_weights(folder)`; in a low_noise run, the
  low-noise expert's (the only one trained; the same file as the next).
- `pytorch_lora_weights_low_noise.safetensors`: the low-noise expert's, loaded with
  `load_lora_weights(folder, weight_name=..., load_into_transformer_2=True)`. Its name
  does not end in diffusers' default name, so `load_lora_weights(folder)` without a
  weight_name still picks the file above.
- `lora_comfyui_high_noise.safetensors`, `lora_comfyui_low_noise.safetensors`: Wan's
  original names under "diffusion_model." (as the single-expert lora_comfyui), one per
  expert, as ComfyUI's Wan 2.2 workflows load one LoRA into each model.

Each diffusers file records its expert in the safetensors metadata ("expert":
high_noise/low_noise; diffusers reads only its own key and ignores it). `expert_files`
reads it back, so this family's validation pipeline (which `--stage merge` uses) loads a
run's files into the expert each was trained for.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.files import atomic_path
from core.models.adapters import adapter_kind
from core.models.families.wan.expert_checks import HIGH, LOW
from core.models.file_names import LORA_WEIGHTS_NAME
from core.models.lora_files import adapter_weights, has_adapter, save_diffusers_lora

LOW_FILE = "pytorch_lora_weights_low_noise.safetensors"
COMFY_FILES = {HIGH: "lora_comfyui_high_noise.safetensors",
               LOW: "lora_comfyui_low_noise.safetensors"}
EXPERT_KEY = "expert"
# The files by the key save_lora returns them under.
DIFFUSERS_KEYS = {LORA_WEIGHTS_NAME: "diffusers", LOW_FILE: "diffusers_low_noise"}

WriteComfy = Callable[[Any, dict[str, Any], Any, Path], Path | None]


def save_expert_loras(experts: dict[str, Any], out_dir: Path, save_fn: Callable[..., Any],
                      diffusers_kinds: tuple[str, ...], write_comfy: WriteComfy
                      ) -> dict[str, Path]:
    """Every adapted expert's files (the module docstring), by key: "diffusers" and
    "comfyui" the high-noise expert's (or the only trained one's), "diffusers_low_noise"
    and, when both trained, "comfyui_low_noise" the low-noise expert's.

    experts: name -> WanTransformer3DModel; save_fn: WanPipeline.save_lora_weights;
    write_comfy(module, peft_sd, config, path): the family's ComfyUI writer."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    adapted = {name: module for name, module in experts.items() if has_adapter(module)}
    if not adapted:
        raise ValueError("neither Wan expert has a LoRA adapter: add one with "
                         "add_adapter(LoraConfig(...)) before saving a LoRA")
    main = next(iter(adapted))  # high_noise first, as experts() lists them
    files: dict[str, Path] = {}
    for name, module in adapted.items():
        peft_sd, config = adapter_weights(module)
        if adapter_kind(config) in diffusers_kinds:
            for weight_name in _diffusers_names(name, name == main):
                path = save_diffusers_lora(save_fn, "transformer_lora_layers", peft_sd,
                                           config, out_dir, {"weight_name": weight_name})
                files[DIFFUSERS_KEYS[weight_name]] = _mark_expert(
                    path.with_name(weight_name), name)
        comfy = write_comfy(module, peft_sd, config, out_dir / COMFY_FILES[name])
        if comfy is not None:
            files["comfyui" if name == main else f"comfyui_{name}"] = comfy
    return files


def _diffusers_names(expert: str, main: bool) -> list[str]:
    """The run-folder's file for the main expert; the low-noise file for the low one."""
    return ([LORA_WEIGHTS_NAME] if main else []) + ([LOW_FILE] if expert == LOW else [])


def _mark_expert(path: Path, expert: str) -> Path:
    """Add {"expert": expert} to the file's metadata (rewritten, then renamed)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as fh:
        metadata = dict(fh.metadata() or {})
    tensors = load_file(str(path))
    with atomic_path(path, temp=path.name + ".tmp") as tmp:
        save_file(tensors, str(tmp), metadata={**metadata, EXPERT_KEY: expert})
    return path


def file_expert(path: Path) -> str | None:
    """The expert a diffusers file of this family was saved for; None for a file that
    does not say (a Wan 2.1 LoRA, anyone else's) or is not a safetensors file here."""
    from safetensors import safe_open

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as fh:
            return (fh.metadata() or {}).get(EXPERT_KEY)
    except Exception:  # noqa: BLE001 - not a safetensors file: diffusers will say so
        return None


def expert_files(source: Any, weight_name: str | None) -> list[tuple[Path, bool]] | None:
    """What `load_lora_weights(source, weight_name=...)` of a two-expert pipeline loads:
    (file, into transformer_2) for the named file (or pytorch_lora_weights.safetensors
    of a folder) by its recorded expert, and, when that is a high-noise run-folder file
    with the low-noise file beside it (a "both" run), that file into transformer_2 too.
    None when the file records no expert: diffusers' own loading applies."""
    if not isinstance(source, str | os.PathLike):
        return None
    path = Path(source)
    file = path / (weight_name or LORA_WEIGHTS_NAME) if path.is_dir() else path
    expert = file_expert(file)
    if expert not in (HIGH, LOW):
        return None
    plan = [(file, expert == LOW)]
    low = file.with_name(LOW_FILE)
    if expert == HIGH and file.name == LORA_WEIGHTS_NAME and file_expert(low) == LOW:
        plan.append((low, True))
    return plan
