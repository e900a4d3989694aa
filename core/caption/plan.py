"""What auto-captioning will do, and writing its captions, without torch.

- `caption_problems`: the check of `[captioning]` (the model, which datasets), each
  problem naming its key.
- `plan_dataset`: the images of one dataset that get a caption: with `overwrite` off only
  those without a `.txt` sidecar or with an empty one; with it on, all of them.
- `write_caption`: writes `<stem>.txt` atomically. An old non-empty caption is first kept
  as `<stem>.txt.bak` (or `.txt.bak2`, ... when that exists: a backup is never
  overwritten), so nothing a user wrote is lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from core.caption.tiny import is_tiny_captioner, materialize_tiny_captioner
from core.config import Config, DatasetConfig
from core.config.paths import resolve_path
from core.files import write_text
from core.problems import Problem, error

KEY = "captioning"
MAX_BACKUPS = 99  # .txt.bak .. .txt.bak99; past that we refuse rather than overwrite


class CaptionWriteError(OSError):
    """A caption could not be written safely; the message names the file and the fix."""


# ---------------------------------------------------------------- the check


def resolve_captioner(value: str, workspace: Path) -> str:
    """captioning.model: a folder (relative ones against the workspace, when it exists
    there) or else a hub id, kept as written; `tiny:blip` is built in the workspace."""
    if is_tiny_captioner(value):
        return str(materialize_tiny_captioner(Path(workspace)))
    value = value.strip()
    candidate = resolve_path(value, Path(workspace))
    if Path(value).expanduser().is_absolute() or candidate.exists():
        return str(candidate)
    return value


def _model_problems(value: str, workspace: Path) -> list[Problem]:
    where = f"{KEY}.model"
    if not value.strip():
        return [error(where, "no captioning model set: set captioning.model to a "
                             "transformers image-to-text model, a hub id in the HF cache "
                             "(e.g. Salesforce/blip-image-captioning-base) or a folder")]
    if is_tiny_captioner(value):  # built offline when captioning starts
        return []
    source = resolve_captioner(value, workspace)
    path = Path(source)
    if path.is_absolute():
        if not path.is_dir() or not (path / "config.json").is_file():
            what = "does not exist" if not path.exists() else "has no config.json"
            return [error(where, f"{path} {what}; give a transformers model folder (one "
                                 "saved with save_pretrained) or a hub id")]
        return []
    if value.strip().startswith((".", "~")):  # clearly a path, not a hub id
        return [error(where, f"folder {value} not found under {workspace}")]
    return _hub_problems(source, where)


def _hub_problems(repo_id: str, where: str) -> list[Problem]:
    from core.models.loading import hub_reachable

    try:
        from huggingface_hub import try_to_load_from_cache

        cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # not a valid repo id at all
        cached = False
    if cached or hub_reachable():
        return []
    return [error(where, f"{repo_id} is neither a folder under the workspace nor a hub "
                         "model in the HF cache, and there is no network to download it: "
                         "download it where there is network (huggingface-cli download) "
                         "or give a local folder")]


def target_datasets(cfg: Config) -> list[tuple[int, DatasetConfig]]:
    """(index, dataset) of every dataset to caption: the listed ids that exist, or every
    textfile dataset when the list is empty."""
    wanted = cfg.captioning.datasets
    if not wanted:
        return [(i, ds) for i, ds in enumerate(cfg.datasets) if ds.caption == "textfile"]
    by_id = {ds.id: i for i, ds in enumerate(cfg.datasets)}
    return [(by_id[d], cfg.datasets[by_id[d]]) for d in dict.fromkeys(wanted) if d in by_id]


def _dataset_problems(cfg: Config, workspace: Path) -> list[Problem]:
    where = f"{KEY}.datasets"
    known = ", ".join(repr(ds.id) for ds in cfg.datasets) or "none"
    problems = [error(where, f"unknown dataset id {d!r} (datasets: {known}); fix the id "
                             "or remove it from captioning.datasets")
                for d in cfg.captioning.datasets if d not in {ds.id for ds in cfg.datasets}]
    targets = target_datasets(cfg)
    if not targets and not problems:
        problems.append(error(where, "no dataset to caption: none has caption = "
                                     "\"textfile\" (the only strategy that reads .txt files)"))
    for i, ds in targets:
        if ds.caption != "textfile":
            problems.append(error(where, (
                f"dataset {ds.id!r} has datasets.{i}.caption = {ds.caption!r}, but "
                "captions are written to .txt files, which only \"textfile\" reads: set "
                f"datasets.{i}.caption = \"textfile\" or remove {ds.id!r} from "
                "captioning.datasets")))
        folder = resolve_path(ds.images, workspace) if ds.images.strip() else None
        if folder is None or not folder.is_dir():
            problems.append(error(f"datasets.{i}.images", (
                f"images folder {folder or '(not set)'} not found; set datasets.{i}.images "
                "to the folder of the images to caption")))
    return problems


def caption_problems(cfg: Config, workspace: str | Path) -> list[Problem]:
    """Every problem that blocks captioning `cfg`, naming the key. Reads, never writes."""
    from core.config import validate_config

    workspace = Path(workspace).expanduser().absolute()
    problems = [p for p in validate_config(cfg) if p.where.startswith((KEY, "datasets"))]
    problems += _model_problems(cfg.captioning.model, workspace)
    problems += _dataset_problems(cfg, workspace)
    return problems


# ---------------------------------------------------------------- the plan


def caption_file(image: Path) -> Path:
    """The sidecar the textfile strategy reads (core/data/captions.py)."""
    return image.with_suffix(".txt")


def has_caption(image: Path) -> bool:
    """A caption file with text in it (an empty one counts as none)."""
    from core.data.captions import decode_text

    try:
        return bool(decode_text(caption_file(image).read_bytes())[0].strip())
    except FileNotFoundError:
        return False
    except OSError:  # there but unreadable: the user's file, left alone
        return True


@dataclass
class DatasetPlan:
    id: str
    todo: list[Path] = field(default_factory=list)
    kept: int = 0  # images whose caption stays as it is
    shared: list[Path] = field(default_factory=list)  # a second image of one .txt: skipped


def plan_dataset(ds: DatasetConfig, overwrite: bool) -> DatasetPlan:
    """The images of `ds` (paths resolved) that get a caption; see the module docstring."""
    from core.data.scan import scan_images

    exclude = [ds.vae_cache] if ds.vae_cache.strip() else []
    plan = DatasetPlan(ds.id)
    seen: set[Path] = set()
    for image in scan_images(ds.images, exclude=exclude):
        txt = caption_file(image)
        if txt in seen:  # a.png and a.jpg read the same a.txt: caption it once
            plan.shared.append(image)
            continue
        seen.add(txt)
        if overwrite or not has_caption(image):
            plan.todo.append(image)
        else:
            plan.kept += 1
    return plan


# ---------------------------------------------------------------- writing


def join_caption(prefix: str, text: str, suffix: str) -> str:
    """prefix, text and suffix as one line: "ohwx" + "a photo of a dog" gives
    "ohwx, a photo of a dog" (a comma the user put at a seam is not doubled)."""
    parts = [" ".join(prefix.split()).rstrip(", "), " ".join(text.split()).strip(", "),
             " ".join(suffix.split()).lstrip(", ")]
    return ", ".join(p for p in parts if p)


def _backup_name(txt: Path) -> Path:
    for n in range(1, MAX_BACKUPS + 1):
        candidate = txt.with_name(txt.name + (".bak" if n == 1 else f".bak{n}"))
        if not candidate.exists():
            return candidate
    raise CaptionWriteError(f"{txt}: {txt.name}.bak to .bak{MAX_BACKUPS} all exist; move "
                            "old backups away before captioning with overwrite = true")


def _keep_backup(txt: Path, old: bytes) -> Path:
    """Copy the old caption to a fresh backup name; exclusive create, so a backup that
    appeared meanwhile is never overwritten."""
    while True:
        backup = _backup_name(txt)
        try:
            with open(backup, "xb") as handle:
                handle.write(old)
            return backup
        except FileExistsError:
            continue


def write_caption(image: Path, caption: str, overwrite: bool) -> tuple[Path | None, Path | None]:
    """(the .txt written, its backup) or (None, None) when a caption appeared meanwhile
    and `overwrite` is off (the user's file is left alone)."""
    txt = caption_file(image)
    backup = None
    try:
        old = txt.read_bytes()
    except FileNotFoundError:
        old = b""
    if old.strip():
        if not overwrite and has_caption(image):
            return None, None
        backup = _keep_backup(txt, old)
    write_text(txt, caption + "\n", temp=f".{txt.name}.captioning.tmp")
    return txt, backup
