"""Writes the presets for the cards people own (presets/<model>-<card>gb.toml): each large
model's LoRA settings with the quantization, swapped blocks and streamed text encoders
that make the memory estimate at least 1.5 GiB under a 24 or a 16 GiB card, and a header
saying what the check estimates. Run after a change to the estimate or the presets:

    .venv/bin/python tools/card_presets.py            # rewrite them
    .venv/bin/python tools/card_presets.py --check    # exit 1 when one is out of date

The estimate reads the real model's configs (random:<family>[:<variant>], shipped in each
family's folder); docs/memory.md has the table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GIB = 1024 ** 3
MARGIN_GIB = 1.5


@dataclass
class CardPreset:
    name: str  # presets/<name>.toml
    base: str  # the model's preset it starts from
    title: str
    path: str  # model.path: the real checkpoint
    sizes: str  # model.path for the estimate: random:<family>[:<variant>]
    card: int  # GiB
    overrides: list[str] = field(default_factory=list)


PRESETS = [
    CardPreset("qwen-image-lora-24gb", "qwen-image-lora", "Qwen-Image (20B) LoRA, 1024 px",
               "Qwen/Qwen-Image", "random:qwen_image", 24, ["model.quantize=int8"]),
    CardPreset("qwen-image-lora-16gb", "qwen-image-lora", "Qwen-Image (20B) LoRA, 1024 px",
               "Qwen/Qwen-Image", "random:qwen_image", 16,
               ["model.quantize=int8", "model.stream_text_encoders=true"]),
    CardPreset("qwen-image-edit-lora-24gb", "qwen-image-edit-lora",
               "Qwen-Image-Edit-2509 (20B) LoRA, 1024 px", "Qwen/Qwen-Image-Edit-2509",
               "random:qwen_image_edit", 24,
               ["model.quantize=int8", "datasets.0.resolution=1024"]),
    CardPreset("qwen-image-edit-lora-16gb", "qwen-image-edit-lora",
               "Qwen-Image-Edit-2509 (20B) LoRA, 1024 px", "Qwen/Qwen-Image-Edit-2509",
               "random:qwen_image_edit", 16,
               ["model.quantize=int8", "datasets.0.resolution=1024",
                "model.stream_text_encoders=true", "validation.resolution=768"]),
    CardPreset("wan21-14b-lora-24gb", "wan-lora", "Wan 2.1 T2V 14B LoRA, 480 px, 33 frames",
               "Wan-AI/Wan2.1-T2V-14B-Diffusers", "random:wan:14b", 24,
               ["model.quantize=int8"]),
    CardPreset("wan21-14b-lora-16gb", "wan-lora", "Wan 2.1 T2V 14B LoRA, 480 px, 33 frames",
               "Wan-AI/Wan2.1-T2V-14B-Diffusers", "random:wan:14b", 16,
               ["model.quantize=int8", "model.stream_text_encoders=true"]),
    CardPreset("wan22-a14b-lora-24gb", "wan-lora",
               "Wan 2.2 T2V A14B (two 14B experts, both trained) LoRA, 480 px, 33 frames",
               "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "random:wan:a14b", 24,
               ["model.quantize=int8"]),
    CardPreset("wan22-a14b-lora-16gb", "wan-lora",
               "Wan 2.2 T2V A14B (two 14B experts, both trained) LoRA, 480 px, 33 frames",
               "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "random:wan:a14b", 16,
               ["model.quantize=int8", "model.stream_text_encoders=true"]),
    # LTX-2.3: LTX-2's preset at 2.3's sizes (its smaller VAE), validated at the video
    # guidance its pipeline suggests (3.0; the audio, STG and modality guidance follow).
    CardPreset("ltx23-lora-24gb", "ltx2-lora",
               "LTX-2.3 LoRA, 512 px, 49 frames at 24 fps with their audio",
               "Lightricks/LTX-2.3", "random:ltx2:2.3", 24,
               ["model.quantize=int8", "model.stream_text_encoders=true",
                "validation.guidance_scale=3.0", "text_cache.dir=cache/ltx23/text",
                "datasets.0.vae_cache=cache/ltx23/mydata/vae"]),
    CardPreset("flux2-dev-lora-24gb", "flux2-lora", "FLUX.2-dev (32B) LoRA, 1024 px",
               "black-forest-labs/FLUX.2-dev", "random:flux2:dev", 24,
               ["model.quantize=int8", "model.stream_text_encoders=true"]),
    CardPreset("flux2-dev-lora-16gb", "flux2-lora", "FLUX.2-dev (32B) LoRA, 1024 px",
               "black-forest-labs/FLUX.2-dev", "random:flux2:dev", 16,
               ["model.quantize=int8", "model.stream_text_encoders=true"]),
    CardPreset("ideogram4-lora-24gb", "ideogram4-lora", "Ideogram 4 (9.3B) LoRA, 1024 px",
               "ideogram-ai/ideogram-v4", "random:ideogram4", 24, ["model.quantize=int8"]),
    # No validation: it brings Ideogram 4's unconditional transformer (int8, ~9 GiB) beside
    # the denoiser, which a 16 GB card cannot hold (docs/memory.md).
    CardPreset("ideogram4-lora-16gb", "ideogram4-lora",
               "Ideogram 4 (9.3B) LoRA, 1024 px, no validation images",
               "ideogram-ai/ideogram-v4", "random:ideogram4", 16,
               ["model.quantize=int8", "model.stream_text_encoders=true",
                "validation.prompts=[]"]),
    CardPreset("krea2-lora-24gb", "krea2-lora", "Krea 2 (12.8B) LoRA, 1024 px",
               "krea/Krea-2-Raw", "random:krea2", 24, ["model.quantize=int8"]),
    CardPreset("krea2-lora-16gb", "krea2-lora", "Krea 2 (12.8B) LoRA, 1024 px",
               "krea/Krea-2-Raw", "random:krea2", 16,
               ["model.quantize=int8", "model.stream_text_encoders=true"]),
    CardPreset("ernie-image-lora-24gb", "ernie-image-lora", "ERNIE-Image (8B) LoRA, 1024 px, bf16",
               "baidu/ERNIE-Image", "random:ernie_image", 24, []),
    CardPreset("ernie-image-lora-16gb", "ernie-image-lora", "ERNIE-Image (8B) LoRA, 1024 px",
               "baidu/ERNIE-Image", "random:ernie_image", 16, ["model.quantize=int8"]),
    CardPreset("flux3-lora-24gb", "flux3-lora", "FLUX.3 (5.5B) LoRA, 1024 px",
               "models/FLUX.3", "random:flux3", 24, []),
    CardPreset("flux3-lora-16gb", "flux3-lora", "FLUX.3 (5.5B) LoRA, 1024 px",
               "models/FLUX.3", "random:flux3", 16, ["model.stream_text_encoders=true"]),
    CardPreset("qwen-image21-lora-24gb", "qwen-image21-lora",
               "Qwen-Image 2.1 (7.1B) LoRA, 1024 px, bf16", "Qwen/Qwen-Image-2.1",
               "random:qwen_image21", 24, []),
    CardPreset("qwen-image21-lora-16gb", "qwen-image21-lora",
               "Qwen-Image 2.1 (7.1B) LoRA, 1024 px",
               "Qwen/Qwen-Image-2.1", "random:qwen_image21", 16,
               ["model.quantize=int8", "model.stream_text_encoders=true"]),
    CardPreset("anima-lora-24gb", "anima-lora", "Anima (2B) LoRA, 1024 px, bf16",
               "circlestone-labs/Anima-Base-v1.0-Diffusers", "random:anima", 24, []),
    CardPreset("anima-lora-16gb", "anima-lora", "Anima (2B) LoRA, 1024 px, bf16",
               "circlestone-labs/Anima-Base-v1.0-Diffusers", "random:anima", 16, []),
    CardPreset("chroma-lora-24gb", "chroma-lora", "Chroma1-HD (8.9B) LoRA, 1024 px, bf16",
               "lodestones/Chroma1-HD", "random:chroma", 24, []),
    CardPreset("chroma-lora-16gb", "chroma-lora", "Chroma1-HD (8.9B) LoRA, 1024 px, bf16",
               "lodestones/Chroma1-HD", "random:chroma", 16,
               ["model.stream_text_encoders=true"]),
]


def fitted(preset: CardPreset, workspace: Path):
    """(config, estimate): the smallest model.blocks_to_swap with the estimate at least
    MARGIN_GIB under the card."""
    from core.config import apply_overrides, load_config, resolved
    from core.memory.estimate import estimate_memory
    from core.presets import preset_path

    cfg = apply_overrides(load_config(preset_path(preset.base)),
                          [f"model.path={preset.sizes}", f"output.dir=runs/{preset.name}",
                           *preset.overrides])
    cfg.launch.gpu_memory_gib = preset.card
    for count in range(0, 200):
        cfg.model.blocks_to_swap = count
        estimate = estimate_memory(resolved(cfg, workspace), workspace, caches_built=False)
        if estimate.unknown or (estimate.max_blocks or 0) < count:
            break
        if estimate.total_bytes <= (preset.card - MARGIN_GIB) * GIB:
            cfg.model.path, cfg.launch.gpu_memory_gib = preset.path, 0.0
            return cfg, estimate
    raise SystemExit(f"{preset.name}: no blocks_to_swap fits {preset.card} GiB")


def header(preset: CardPreset, cfg, estimate) -> str:
    host = sum(p.bytes for p in estimate.host) / GIB
    phases = {"training": estimate.training_bytes, "caching": estimate.caching_bytes,
              "validation": estimate.validation_bytes}
    lines = [
        f"{preset.title}, for a {preset.card} GB card.",
        f"`--stage check` with model.path = {preset.sizes} (the real sizes) estimates "
        f"{estimate.total_bytes / GIB:.1f} GiB per GPU ({estimate.dominant} is the peak; "
        + ", ".join(f"{k} {v / GIB:.1f}" for k, v in phases.items() if v) + ")"
        + (f" and {host:.1f} GiB of pinned host RAM" if host else "") + ":",
        f"model.quantize = \"{cfg.model.quantize}\", model.blocks_to_swap = "
        f"{cfg.model.blocks_to_swap}"
        + (", model.stream_text_encoders = true" if cfg.model.stream_text_encoders else "")
        + ". Written by tools/card_presets.py; docs/memory.md has the table.",
    ]
    import textwrap

    wrapped = textwrap.wrap(" ".join(lines), width=88)
    return "".join(f"# {line}\n" for line in wrapped)


def render(preset: CardPreset, workspace: Path) -> str:
    from core.config import dumps_config

    cfg, estimate = fitted(preset, workspace)
    return header(preset, cfg, estimate) + dumps_config(cfg)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    from core.notices import quiet_library_notices

    quiet_library_notices()
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in PRESETS:
            text = render(preset, Path(tmp))
            path = REPO / "presets" / f"{preset.name}.toml"
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
                if not args.check:
                    path.write_text(text, encoding="utf-8")
    if stale:
        print(("out of date: " if args.check else "wrote: ") + ", ".join(stale))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
