"""Datasets: the demo's images, a dataset's index (the preview and the check read it)
and the bucket histogram."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.config import Config, DatasetConfig, resolved
from core.data.buckets import bucket_histogram
from core.models.tags import TAGS
from core.ops.errors import OpError
from core.problems import error
from core.runs.folder import RunFolder

if TYPE_CHECKING:
    from core.data.index import DatasetIndex

__all__ = ["TAG_NAMES", "bucket_histogram", "family_has", "index_dataset", "latest_demo_run",
           "prepare_demo"]


def prepare_demo(cfg: Config, workspace: Path, *, new_output: bool) -> list[str]:
    """The demo presets bring their own images (clips for a video family's demo):
    generate them once into the workspace.

    With `new_output`, a demo never refuses to run again: an output folder that holds a
    run gets a free `-N` sibling (cfg is changed). Returns notes for the user.
    """
    from core.data.synthetic import generate_demo_dataset
    from core.data.synthetic_video import generate_demo_clips

    folder = Path(resolved(cfg, workspace).datasets[0].images)
    video = family_has("video", cfg.model.family)
    try:
        count = (generate_demo_clips if video else generate_demo_dataset)(folder)
    except FileExistsError as exc:
        raise OpError(str(exc), [error("datasets.0.images", str(exc))]) from None
    notes = [f"demo {'clips' if video else 'images'}: {count}, with captions, in {folder}"]
    if new_output:
        base = cfg.output.dir.rstrip("/")
        candidate, n = base, 2
        while RunFolder(workspace / candidate).config.exists():
            candidate, n = f"{base}-{n}", n + 1
        if candidate != base:
            notes.append(f"{workspace / base} holds an earlier demo run; this one goes to "
                         f"{workspace / candidate}")
        cfg.output.dir = candidate
    return notes


def latest_demo_run(cfg: Config, workspace: Path) -> list[str]:
    """Point cfg.output.dir at the demo run trained last, for `--stage merge` and
    `--resume`: each new demo run moved on to a free `-N` sibling (prepare_demo), so the
    preset's own output.dir is the first run, not the one just trained. The last one is
    the folder whose config.toml was written last (launch writes it; a deleted `-2` may
    be reused after `-3`, so the highest number is not it). Returns a note; none when the
    preset's folder is the latest (or no run exists: the action says so)."""
    import re

    base = cfg.output.dir.rstrip("/")
    root = workspace / base
    sibling = re.compile(re.escape(root.name) + r"(-[0-9]+)?")
    runs = [p for p in root.parent.glob(f"{root.name}*")
            if sibling.fullmatch(p.name) and RunFolder(p).config.is_file()]
    if not runs:
        return []
    latest = max(runs, key=lambda p: (RunFolder(p).config.stat().st_mtime_ns, p.name))
    if latest == root:
        return []
    cfg.output.dir = str(Path(base).parent / latest.name)
    return [f"the demo's latest run is {latest} (the preset names {root})"]


def index_dataset(ds: DatasetConfig, dataset_key: str, family: str = "") -> DatasetIndex:
    """The images of `ds` (paths absolute) with their sizes and captions, read from the
    files' headers (core/data/index.py), and its clips for a video `family`; problems
    name `dataset_key`. Reads only."""
    from core.data.index import index_dataset as index

    return index(ds, dataset_key, video=family_has("video", family))


TAG_NAMES = tuple(TAGS)  # the tags a config key's metadata may carry


def family_has(tag: str, family: str, method: str = "lora") -> bool:
    """Whether keys tagged `tag` (core/models/tags.py: video, edit, audio, flow, ddpm,
    guidance, routing, lora, blocks, conditioned) apply to model.family `family` and
    train.method `method`; False for an unknown family name."""
    from core.models.tags import tag_holds

    return tag_holds(tag, family, method)
