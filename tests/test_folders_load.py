"""The diffusers folders this tool writes load with `DiffusionPipeline.from_pretrained`,
as a downstream tool loads them (issue 40 item 3): every tiny model's folder and every
family's merged/ folder, in this venv (diffusers and transformers, no torchvision).

Qwen-Image-Edit's and Qwen-Image 2.1's pipelines need torchvision for their processors
(transformers 5 builds Qwen2VLProcessor's and Qwen3VLProcessor's video part only with
it), which this venv does not install: there the processor is loaded by the family's
processor.py and handed over, and transformers' own reader shows
that processor/ holds the video config the stock class would read (the file whose
absence made these folders fail with torchvision installed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core import ops
from core.models.registry import list_families
from core.models.tiny import resolve_model_path
from core.models.tiny.materialize import tiny_names

# What the real Qwen/Qwen-Image-Edit* processor/ folders hold beside the tokenizer.
PROCESSOR_FILES = ("chat_template.jinja", "preprocessor_config.json",
                   "video_preprocessor_config.json")
# The processors a family's folder names that need torchvision in transformers 5: the
# family's loader module (load_processor) and the video processor its folder names.
PROCESSOR_LOADERS = {
    "Qwen2VLProcessor": ("core.models.families.qwen_image_edit.processor",
                         "Qwen2VLVideoProcessor"),
    "Qwen3VLProcessor": ("core.models.families.qwen_image21.processor",
                         "Qwen3VLVideoProcessor")}


def load_as_downstream(folder: Path) -> object:
    """DiffusionPipeline.from_pretrained(folder) of the class model_index.json names; a
    modular-only model's folder (FLUX.3: modular_model_index.json) as diffusers loads a
    modular pipeline."""
    from diffusers import DiffusionPipeline
    from transformers.utils import is_torchvision_available

    if not (folder / "model_index.json").is_file():
        return load_modular(folder)
    index = json.loads((folder / "model_index.json").read_text())
    given = {}
    processor = (index.get("processor") or [None, None])[1]
    if processor in PROCESSOR_LOADERS:
        import importlib

        from transformers.video_processing_utils import BaseVideoProcessor

        module, video_type = PROCESSOR_LOADERS[processor]
        assert sorted(f for f in PROCESSOR_FILES if not (folder / "processor" / f).is_file()) \
            == []
        video, _ = BaseVideoProcessor.get_video_processor_dict(str(folder),
                                                               subfolder="processor")
        assert video["video_processor_type"] == video_type
        if not is_torchvision_available():  # the stock class cannot be built here
            given["processor"] = importlib.import_module(module).load_processor(
                str(folder), True)
    pipe = DiffusionPipeline.from_pretrained(str(folder), local_files_only=True, **given)
    assert type(pipe).__name__ == index["_class_name"]
    return pipe


def load_modular(folder: Path) -> object:
    """ModularPipeline.from_pretrained(folder), then load_components() from this folder
    (each index entry records where it was saved, which a moved folder is not)."""
    from diffusers import ModularPipeline

    index = json.loads((folder / "modular_model_index.json").read_text())
    pipe = ModularPipeline.from_pretrained(str(folder))
    pipe.load_components(pretrained_model_name_or_path=str(folder))
    assert type(pipe).__name__ == index["_class_name"]
    assert pipe.transformer is not None and pipe.text_encoder is not None
    return pipe


@pytest.mark.parametrize("name", tiny_names())
def test_every_tiny_folder_loads_with_diffusers(name: str, tiny_workspace: Path) -> None:
    load_as_downstream(Path(resolve_model_path(f"tiny:{name}", tiny_workspace)))


@pytest.mark.parametrize("family", list_families())
def test_every_familys_merged_folder_loads_with_diffusers(family: str, tmp_path: Path,
                                                          tiny_workspace: Path) -> None:
    from test_merge import make_run

    merged = ops.merge_run(make_run(tmp_path, tiny_workspace, family), tiny_workspace)
    load_as_downstream(merged)


def test_a_tiny_edit_folder_built_before_its_revision_is_rebuilt(tmp_path: Path) -> None:
    """A workspace's tiny:qwen_image_edit from before its processor files were written
    (marker without the family's TINY_REVISION) is rebuilt on next use, with them."""
    from core.models.tiny.materialize import MARKER, materialize_tiny

    folder = materialize_tiny("qwen_image_edit", tmp_path)
    (folder / "processor/video_preprocessor_config.json").unlink()
    marker = json.loads((folder / MARKER).read_text())
    marker.pop("revision")
    (folder / MARKER).write_text(json.dumps(marker))
    assert materialize_tiny("qwen_image_edit", tmp_path) == folder
    assert (folder / "processor/video_preprocessor_config.json").is_file()
