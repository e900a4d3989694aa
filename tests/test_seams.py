"""The seams a contributor relies on hold: shared code never imports a family's package
(a family is found through the registry) and its help texts name no family (a list of
families is built from the registry), no module in core/ or ui/ passes 400 lines, and
every dataset key either enters the VAE cache entry's metadata (so a change rebuilds
stale latents) or is declared irrelevant to it. Static checks and one cache plan: fast."""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from core.cache.plan import IN_ENTRY_METADATA, NOT_IN_LATENTS, plan_caches
from core.config import Config, DatasetConfig
from core.models.registry import list_families

REPO = Path(__file__).resolve().parent.parent
FAMILIES = REPO / "core" / "models" / "families"
MAX_LINES = 400
# How help texts would name a family besides its registry name (the models' own names).
MODEL_NAMES = ("Wan", "LTX", "FLUX", "Flux", "SDXL", "SD1", "SD2", "SD3", "SD 1", "SD 2",
               "Stable Diffusion", "Chroma", "Qwen", "Hunyuan", "Z-Image", "Krea", "Ideogram",
               "Kontext", "ERNIE")
HELP_KEYWORDS = ("help", "label", "info")  # core.fields._f / meta, and gradio's components


def shared_modules() -> list[Path]:
    files = [REPO / "app.py", *(REPO / "core").rglob("*.py"), *(REPO / "ui").rglob("*.py")]
    return sorted(f for f in files if FAMILIES not in f.parents)


def imported_names(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_shared_code_never_imports_a_familys_package() -> None:
    reaching = {str(path.relative_to(REPO)): name for path in shared_modules()
                for name in imported_names(path) if name.startswith("core.models.families.")}
    assert reaching == {}, "find the family through core.models.registry instead"


def literal_texts(node: ast.AST) -> Iterator[str]:
    """The text written out in a help expression: string literals, an f-string's literal
    parts (not the code in its braces, which builds a list from the registry), sums."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.JoinedStr):
        yield from (v.value for v in node.values if isinstance(v, ast.Constant))
    elif isinstance(node, ast.BinOp):
        yield from literal_texts(node.left)
        yield from literal_texts(node.right)


def test_help_texts_in_shared_code_name_no_family() -> None:
    """A config key's help or label (core/config, core/fields.py) and the UI's texts list
    families from the registry (registry.names_where, frame_rules, ...): a help text
    naming some would go stale when a family is added."""
    names = (*list_families(), *MODEL_NAMES)
    pattern = re.compile(rf"(?<![\w.])(?:{'|'.join(map(re.escape, names))})(?!\w)")
    files = [*(REPO / "core" / "config").glob("*.py"), REPO / "core" / "fields.py",
             *(REPO / "ui").rglob("*.py")]
    naming = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for kw in node.keywords if isinstance(node, ast.Call) else []:
                for text in literal_texts(kw.value) if kw.arg in HELP_KEYWORDS else []:
                    if found := pattern.search(text):
                        naming[f"{path.relative_to(REPO)}:{kw.value.lineno}"] = found[0]
    assert naming == {}, "build the list from core.models.registry (names_where)"


def test_no_module_in_core_or_ui_passes_400_lines() -> None:
    files = [*(REPO / "core").rglob("*.py"), *(REPO / "ui").rglob("*.py")]
    long = {str(f.relative_to(REPO)): n for f in files
            if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"split these below {MAX_LINES} lines"


def test_every_dataset_key_enters_the_cache_metadata_or_is_declared_irrelevant() -> None:
    keys = {f.name for f in dataclasses.fields(DatasetConfig)}
    undeclared = keys - IN_ENTRY_METADATA.keys() - NOT_IN_LATENTS.keys()
    assert not undeclared, ("say in core/cache/plan.py whether the latents depend on "
                            f"{sorted(undeclared)}")
    assert not IN_ENTRY_METADATA.keys() & NOT_IN_LATENTS.keys()
    assert not (IN_ENTRY_METADATA.keys() | NOT_IN_LATENTS.keys()) - keys, "stale names"


def test_a_still_images_entry_records_each_key_it_depends_on(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (96, 64), "red").save(images / "a.png")
    (images / "a.txt").write_text("a red square")
    ds = DatasetConfig(id="a", images=str(images), vae_cache=str(tmp_path / "cache"),
                       resolution=64, flip=True)  # an entry records flip when on
    cfg = Config(datasets=[ds])
    cfg.text_cache.dir = str(tmp_path / "text")
    meta = plan_caches(cfg, {"family": "sd15"}).datasets[0].vae_jobs[0].meta
    # a clip's keys (audio: ltx2's)
    clip_keys = ("frames", "fps", "clips", "clip_count", "clip_stride", "audio")
    still = [k for k in IN_ENTRY_METADATA if k not in clip_keys and not k.startswith("control")]
    assert {IN_ENTRY_METADATA[k] for k in still} <= meta.keys()
