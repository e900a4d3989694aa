"""Tiny models, built offline once per workspace: `tiny:<name>` in model.path.

Each family has a random one, `tiny:<family>` (core/models/families/<family>/tiny.py), which the
tests use; a family's `trained_tiny` adds trained ones of it, such as the demo's
`tiny:sd15-shapes`, whose committed weights the build loads.

`materialize_tiny` writes `<workspace>/models/tiny-<name>/` with the `build(out_dir,
seed)` of the name's module (`tiny_builder`). The build goes to a temporary
sibling folder that is renamed into place only after a marker file is written last, so
a crashed build never leaves a folder that looks loadable. A lock file serialises
concurrent builders (two training processes starting together); without `fcntl` the
rename race is tolerated instead: the loser deletes its copy and uses the winner's.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from core.files import atomic_path, replace_folder
from core.models.registry import list_families
from core.models.source import TINY_PREFIX, model_source  # noqa: F401  (core.models.tiny re-exports the prefix)

TINY_SEED = 0
# Bump when a family's tiny config changes so existing workspaces rebuild.
TINY_VERSION = 3  # 2: calibrated VAE latent scaling; 3: one tiny Qwen3 for z_image, flux2
MARKER = ".tiny-complete.json"


def trained_tiny() -> dict[str, tuple[str, str]]:
    """Trained tiny models, as the families declare them (`trained_tiny`): name ->
    (family, module whose build() loads the committed weights)."""
    from core.models.registry import families

    return {name: (f.name, module) for f in families() for name, module in f.trained_tiny}


def tiny_names() -> list[str]:
    """Every name `tiny:<name>` accepts."""
    return [*list_families(), *trained_tiny()]


def tiny_family(name: str) -> str | None:
    """The family of the tiny model `name` (None for an unknown name)."""
    if name in list_families():
        return name
    trained = trained_tiny()
    return trained[name][0] if name in trained else None


def _builder_module(name: str) -> object:
    _require_known(name)
    trained = trained_tiny()
    module = trained[name][1] if name in trained else f"core.models.families.{name}.tiny"
    return importlib.import_module(module)


def tiny_builder(name: str) -> Callable[[Path, int], None]:
    """The `build(out_dir, seed)` of the tiny model's module, imported on first use
    (torch and diffusers load only then: the modules import them inside build)."""
    return _builder_module(name).build  # type: ignore[attr-defined]


def _revision(name: str) -> int:
    """The builder module's TINY_REVISION (0 without one): a family bumps it when its
    tiny folder changes, so existing workspaces rebuild that family's alone (TINY_VERSION
    rebuilds every tiny model, the demo's included)."""
    return int(getattr(_builder_module(name), "TINY_REVISION", 0))


def _require_known(name: str) -> None:
    if tiny_family(name) is None:
        raise ValueError(f"unknown tiny model 'tiny:{name}'; choose one of "
                         + ", ".join(f"tiny:{n}" for n in tiny_names()))


def tiny_dir(name: str, workspace: Path) -> Path:
    return Path(workspace).expanduser().absolute() / "models" / f"tiny-{name}"


@functools.cache
def _weights_digest(name: str) -> str | None:
    """A trained model's committed weights, hashed: new weights rebuild the folder.
    Once per process: the live checks ask on every edit, and the file is part of the code."""
    if name not in trained_tiny():
        return None
    spec = importlib.util.find_spec(trained_tiny()[name][1])
    assert spec is not None and spec.submodule_search_locations
    weights = Path(next(iter(spec.submodule_search_locations))) / "weights.safetensors"
    return hashlib.sha256(weights.read_bytes()).hexdigest()[:16]


def _marker(name: str) -> dict[str, object]:
    marker: dict[str, object] = {"family": name, "seed": TINY_SEED, "version": TINY_VERSION}
    if _revision(name):
        marker["revision"] = _revision(name)
    digest = _weights_digest(name)
    if digest:
        marker["weights"] = digest
    return marker


def _marker_ok(folder: Path, name: str) -> bool:
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return data == _marker(name)


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


def tiny_is_built(name: str, workspace: Path) -> bool:
    """Whether the workspace holds a complete, current build of the tiny model `name`."""
    return _marker_ok(tiny_dir(name, workspace), name)


def build_tiny_folder(name: str, out_dir: Path, seed: int = TINY_SEED) -> None:
    """Build a tiny model straight into `out_dir` (no marker, no atomicity): for tests."""
    from core.models.empty import MODEL_BUILD_LOCK

    with MODEL_BUILD_LOCK:
        tiny_builder(name)(Path(out_dir), seed)


def _build_keeping_rng(name: str, out_dir: Path) -> None:
    """Build with a private RNG: the build seeds torch itself, and a trainer that happens
    to build the model must draw the same noise as one that found it built."""
    import torch

    from core.models.empty import MODEL_BUILD_LOCK

    with MODEL_BUILD_LOCK, torch.random.fork_rng(devices=[]):
        tiny_builder(name)(out_dir, TINY_SEED)


def materialize_tiny(name: str, workspace: Path) -> Path:
    """The folder of the tiny model `name` in this workspace, built if missing."""
    _require_known(name)
    final = tiny_dir(name, workspace)
    if _marker_ok(final, name):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _locked(final.parent / f".tiny-{name}.lock"):
        if _marker_ok(final, name):  # another process built it while we waited
            return final
        with atomic_path(final, unique=(f".tiny-{name}.", ".tmp"), folder=True,
                         swap=functools.partial(_swap_in, name=name)) as tmp:
            _build_keeping_rng(name, tmp)
            (tmp / MARKER).write_text(json.dumps(_marker(name)), encoding="utf-8")
    return final


def _swap_in(tmp: Path, final: Path, name: str) -> None:
    """Rename the finished build into place; an old/broken folder is moved aside first."""
    if final.exists() and _marker_ok(final, name):
        return  # lost a lock-free race: keep the winner's identical build
    try:
        replace_folder(tmp, final)
    except OSError:
        if not _marker_ok(final, name):
            raise


def resolve_model_path(path: str, workspace: Path) -> str:
    """Turn `tiny:<name>` into its built folder; return any other path unchanged."""
    source = model_source(path)
    if source.kind == "tiny":
        return str(materialize_tiny(source.name, workspace))
    return path
