"""Tiny random models, built offline once per workspace: `tiny:<family>` in model.path.

`materialize_tiny` writes `<workspace>/models/tiny-<family>/` with the `build(out_dir,
seed)` of core/models/tiny/<family>.py (`tiny_builder`). The build goes to a temporary
sibling folder that is renamed into place only after a marker file is written last, so
a crashed build never leaves a folder that looks loadable. A lock file serialises
concurrent builders (two training processes starting together); without `fcntl` the
rename race is tolerated instead: the loser deletes its copy and uses the winner's.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from core.models.registry import FAMILY_NAMES

TINY_PREFIX = "tiny:"
TINY_SEED = 0
# Bump when a family's tiny config changes so existing workspaces rebuild.
TINY_VERSION = 2  # 2: calibrated VAE latent scaling
MARKER = ".tiny-complete.json"


def tiny_builder(family: str) -> Callable[[Path, int], None]:
    """The `build(out_dir, seed)` of core/models/tiny/<family>.py, imported on first use
    (torch and diffusers load only then)."""
    _require_known(family)
    return importlib.import_module(f"core.models.tiny.{family}").build


def _require_known(family: str) -> None:
    if family not in FAMILY_NAMES:
        raise ValueError(f"unknown tiny model 'tiny:{family}'; choose one of "
                         + ", ".join(f"tiny:{f}" for f in FAMILY_NAMES))


def tiny_dir(family: str, workspace: Path) -> Path:
    return Path(workspace).expanduser().absolute() / "models" / f"tiny-{family}"


def _marker_ok(folder: Path, family: str) -> bool:
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return data == {"family": family, "seed": TINY_SEED, "version": TINY_VERSION}


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: rely on the atomic rename alone
        yield
        return
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def build_tiny_folder(family: str, out_dir: Path, seed: int = TINY_SEED) -> None:
    """Build a tiny model straight into `out_dir` (no marker, no atomicity): for tests."""
    tiny_builder(family)(Path(out_dir), seed)


def _build_keeping_rng(family: str, out_dir: Path) -> None:
    """Build with a private RNG: the build seeds torch itself, and a trainer that happens
    to build the model must draw the same noise as one that found it built."""
    import torch

    with torch.random.fork_rng(devices=[]):
        tiny_builder(family)(out_dir, TINY_SEED)


def materialize_tiny(family: str, workspace: Path) -> Path:
    """The folder of the tiny `family` model in this workspace, built if missing."""
    _require_known(family)
    final = tiny_dir(family, workspace)
    if _marker_ok(final, family):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final.parent / f".tiny-{family}.lock"):
        if _marker_ok(final, family):  # another process built it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".tiny-{family}.", suffix=".tmp", dir=final.parent))
        try:
            _build_keeping_rng(family, tmp)
            marker = {"family": family, "seed": TINY_SEED, "version": TINY_VERSION}
            (tmp / MARKER).write_text(json.dumps(marker), encoding="utf-8")
            _swap_in(tmp, final, family)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def _swap_in(tmp: Path, final: Path, family: str) -> None:
    """Rename the finished build into place; an old/broken folder is moved aside first."""
    if final.exists():
        if _marker_ok(final, family):
            return  # lost a lock-free race: keep the winner's identical build
        trash = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.replace(tmp, final)
    except OSError:
        if not _marker_ok(final, family):
            raise


def resolve_model_path(path: str, workspace: Path) -> str:
    """Turn `tiny:<family>` into its built folder; return any other path unchanged."""
    if path.startswith(TINY_PREFIX):
        return str(materialize_tiny(path[len(TINY_PREFIX):], workspace))
    return path
