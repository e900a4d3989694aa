"""Half-precision checkpoints, as real ones are stored (SDXL's fp16 files, Flux and SD3.5
in bf16), train and validate under mixed_precision "no" and "bf16".

Each tiny model is re-saved with every component in fp16 or bf16, then trained for four
steps with validation images at step 2 and at the end: the run must finish, its losses
must be finite and its validation images must not be blank (a NaN decodes to black).
The trainer runs in this process (accelerate's state is reset between runs) to keep the
twenty runs fast; tests/test_train.py covers `accelerate launch` itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.models.registry import FAMILY_NAMES
from tests.conftest import small_config, train_in_process

STORED = {"fp16": "F16", "bf16": "BF16"}
# Four short runs per family (over 50 in all, about two minutes on one worker): the full
# suite's, not `make test-fast`'s.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stored_models(tmp_path_factory: pytest.TempPathFactory, tiny_workspace: Path
                  ) -> dict[tuple[str, str], Path]:
    """Every family's tiny model re-saved in each half precision: {(family, dtype): dir}."""
    import torch
    from diffusers import DiffusionPipeline

    from core.models.tiny import resolve_model_path

    out = {}
    root = tmp_path_factory.mktemp("stored")
    for family in FAMILY_NAMES:
        source = resolve_model_path(f"tiny:{family}", tiny_workspace)
        for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            folder = root / f"{family}-{name}"
            if not (Path(source) / "model_index.json").is_file():  # modular only: FLUX.3
                _resave_modular(Path(source), dtype, folder)
                out[(family, name)] = folder
                continue
            pipe = DiffusionPipeline.from_pretrained(source, dtype=dtype,
                                                     **_processor(Path(source)))
            pipe.save_pretrained(str(folder), safe_serialization=True)
            out[(family, name)] = folder
    return out


def _resave_modular(source: Path, dtype, folder: Path) -> None:
    """A modular pipeline's folder (modular_model_index.json) re-saved in `dtype`."""
    from diffusers import ModularPipeline

    pipe = ModularPipeline.from_pretrained(str(source))
    pipe.load_components(pretrained_model_name_or_path=str(source), dtype=dtype)
    pipe.save_pretrained(str(folder), safe_serialization=True, overwrite_modular_index=True)


def _processor(folder: Path) -> dict:
    """A `processor` component (Qwen-Image-Edit's), loaded as the family loads it:
    transformers builds a Qwen2VLProcessor only with torchvision, which is not installed."""
    if not (folder / "processor").is_dir():
        return {}
    from core.models.families.qwen_image_edit.processor import load_processor

    return {"processor": load_processor(str(folder), local_only=True)}


def _stored_dtypes(folder: Path) -> set[str]:
    """The dtypes the denoiser's weights are stored in, leaving out the modules its class
    keeps in fp32 (`_keep_in_fp32_modules`: Wan's norms and time embedding, as real fp16
    Wan files store them). Only the denoiser: transformers keeps T5's `wo` in fp32 when
    saving fp16, as real fp16 T5 files do, so the encoders may mix."""
    import json

    import diffusers
    from safetensors import safe_open

    denoiser = folder / "unet" if (folder / "unet").is_dir() else folder / "transformer"
    class_name = json.loads((denoiser / "config.json").read_text())["_class_name"]
    kept = getattr(diffusers, class_name)._keep_in_fp32_modules or []
    found = set()
    for weights in denoiser.rglob("*.safetensors"):
        with safe_open(str(weights), "pt") as fh:
            found |= {fh.get_slice(key).get_dtype() for key in fh.keys()
                      if not any(part in key.split(".") for part in kept)}
    return found


def _not_blank(png: Path) -> bool:
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(png).convert("RGB"), dtype=np.float32)
    return pixels.std() > 2.0 and pixels.mean() > 2.0


@pytest.mark.parametrize("precision", ["no", "bf16"])
@pytest.mark.parametrize("stored", ["fp16", "bf16"])
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_half_precision_checkpoint_trains_and_validates(
        tmp_path: Path, stored_models: dict, family: str, stored: str, precision: str):
    from core.config import save_config

    folder = stored_models[(family, stored)]
    assert _stored_dtypes(folder) == {STORED[stored]}  # stored in half precision
    cfg = small_config(tmp_path, images=4, family=family)
    cfg.model.path = str(folder)
    cfg.train.max_steps, cfg.train.mixed_precision = 4, precision
    cfg.train.eval_every, cfg.train.eval_images, cfg.train.checkpoint_every = 100, 2, 100
    cfg.validation.every, cfg.validation.prompts = 2, ["a red circle"]
    cfg.launch.cpu = True
    save_config(cfg, tmp_path / "config.toml")

    assert train_in_process(tmp_path / "config.toml", tmp_path) == 0
    run_dir = Path(cfg.output.dir)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["type"] == "step"]
    assert len(losses) == 4 and all(abs(x) < 1e6 for x in losses), losses
    images = sorted(run_dir.glob("validation/step_*/00.png"))
    assert [p.parent.name for p in images] == ["step_000002", "step_000004"]
    assert all(_not_blank(p) for p in images), images
    phases = [e["phase"] for e in events if e["type"] == "memory"]
    # validation at step 2; the final step's eval and checkpoint at 4
    assert phases == ["loaded", "cached", "first_step", "validation", "eval", "checkpoint",
                      "peak"]
