"""A FLUX.3 folder as diffusers writes it: modular_model_index.json (no model_index.json;
FLUX.3 ships modular pipelines only) naming the pipeline class (Flux3ModularPipeline or,
step-distilled, Flux3DistilledModularPipeline), its blocks and each component, stored in
the sub-folder of its name (transformer/, vae/, text_encoder/, tokenizer/; the scheduler
and guider are built from the blocks' configs where no scheduler/ is there).

Why the components load one by one here rather than through
`ModularPipeline.from_pretrained(...).load_components()`: each index entry records where
the component was saved (`pretrained_model_name_or_path`: the hub id of the upload, or the
absolute path a local save_pretrained wrote), so a downloaded or moved folder would be
read from that place and not from itself. Reading each sub-folder of the folder given
loads what model.path holds, offline.

The text tokenizer: FLUX.3's `tokenizer` is a Qwen3-VL processor (AutoProcessor), of which
the text encoder step uses two things, `apply_chat_template` and `.tokenizer`.
transformers builds that processor only with torchvision (its video processor), which this
project does not install, so the family loads the text tokenizer of tokenizer/ and
hands diffusers' step `TextProcessor`, which offers those two.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

INDEX = "modular_model_index.json"
BASE_CLASS = "Flux3ModularPipeline"
DISTILLED_CLASS = "Flux3DistilledModularPipeline"


def read_index(folder: Path) -> dict[str, Any]:
    """The folder's modular_model_index.json, or {} when it is absent or unreadable."""
    try:
        data = json.loads((Path(folder) / INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def index_components(index: dict[str, Any]) -> dict[str, str]:
    """name -> class of each component the index records ([library, class, spec])."""
    return {name: str(entry[1]) for name, entry in index.items()
            if not name.startswith("_") and isinstance(entry, list) and len(entry) >= 2
            and isinstance(entry[0], str) and isinstance(entry[1], str)}


def blocks_for(distilled: bool) -> Any:
    """The pipeline's auto blocks (Flux3AutoBlocks, or Flux3DistilledAutoBlocks) less the
    prompt upsampler: diffusers' documented way to encode a prompt as given (the
    upsampler is a separate Qwen3.5 model that rewrites captions)."""
    from diffusers import Flux3AutoBlocks, Flux3DistilledAutoBlocks

    blocks = Flux3DistilledAutoBlocks() if distilled else Flux3AutoBlocks()
    blocks.sub_blocks.pop("prompt_upsampler", None)
    return blocks


def default_scheduler() -> Any:
    """The scheduler the pipeline creates from its config when a folder has none: the
    FlowMatchEulerDiscreteScheduler of Flux3SetTimestepsStep's spec (a constant shift)."""
    from diffusers.modular_pipelines.flux3.before_denoise import Flux3SetTimestepsStep

    [spec] = [s for s in Flux3SetTimestepsStep().expected_components if s.name == "scheduler"]
    return spec.create()


class TextProcessor:
    """What diffusers' Flux3TextEncoderStep asks of its `tokenizer` (a Qwen3-VL processor):
    the chat template and the text tokenizer (`.tokenizer`), over a text tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer.apply_chat_template(*args, **kwargs)


def load_parts(folder: str, dtype: Any, local_only: bool,
               transformer: Any = None) -> dict[str, Any]:
    """The components of a FLUX.3 folder or hub id (see the module docstring);
    `transformer`: built already (the streamed load), taken in place of reading it."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler
    from diffusers import Flux3Transformer2DModel as Transformer
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    def model(cls: Any, name: str) -> Any:
        kwargs = {"dtype": dtype} if dtype is not None else {}
        return cls.from_pretrained(folder, subfolder=name, local_files_only=local_only,
                                   **kwargs)

    parts = {"transformer": transformer or model(Transformer, "transformer"),
             "vae": model(AutoencoderKLFlux2, "vae"),
             "text_encoder": model(Qwen3VLForConditionalGeneration, "text_encoder"),
             "tokenizer": AutoTokenizer.from_pretrained(folder, subfolder="tokenizer",
                                                        local_files_only=local_only)}
    try:
        parts["scheduler"] = FlowMatchEulerDiscreteScheduler.from_pretrained(
            folder, subfolder="scheduler", local_files_only=local_only)
    except (OSError, ValueError):  # none shipped: the pipeline builds it from its config
        parts["scheduler"] = default_scheduler()
    return parts
