"""Find a model family by name without importing torch until one is used.

The families are the packages under core/models/families/ (one folder each, see that
package's docstring), discovered with pkgutil: adding a folder adds a family, and no list
of names is kept by hand. A family's package declares only ORDER; its family.py (FAMILY)
is imported here on first use, and its options.py (OPTIONS, its own config keys) when
the schema is built. Importing a family is cheap (torch, diffusers and transformers load
inside its functions).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.models.base import ModelFamily

_PACKAGE = "core.models.families"


@functools.cache
def _modules() -> dict[str, ModuleType]:
    """Every family package by name, in ORDER (then name). The packages only declare
    ORDER and import their family.py on first use of FAMILY, so this imports nothing else
    (core.config.schema reads the names while core.config is being imported)."""
    package = importlib.import_module(_PACKAGE)
    names = sorted({m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg})
    modules = {name: importlib.import_module(f"{_PACKAGE}.{name}") for name in names}
    return dict(sorted(modules.items(), key=lambda kv: (getattr(kv[1], "ORDER", 1000),
                                                        kv[0])))


def list_families() -> list[str]:
    """Every family name, in display order."""
    return list(_modules())


def family_module(name: str) -> ModuleType:
    """The package core.models.families.<name> (its folder is `family_folder`)."""
    modules = _modules()
    if name not in modules:
        raise ValueError(f"unknown model family {name!r}; choose one of "
                         f"{', '.join(modules)}")
    return modules[name]


def get_family(name: str) -> ModelFamily:
    """The `FAMILY` object of core.models.families.<name>.family (imported on first use:
    listing the families imports only their packages)."""
    family_module(name)  # an unknown name is refused naming the known ones
    family = importlib.import_module(f"{_PACKAGE}.{name}.family").FAMILY
    if family.name != name:
        raise RuntimeError(f"core/models/families/{name}: FAMILY.name is {family.name!r}, "
                           f"not its folder's name {name!r}; make them the same")
    return family


def family_or_defaults(name: str) -> ModelFamily:
    """The family `name`, or an object with every optional member's default
    (FamilyDefaults) where no such family exists: what checks read before the unknown
    name itself is reported."""
    from core.models.base import FamilyDefaults

    return get_family(name) if name in _modules() else FamilyDefaults()  # type: ignore[return-value]


def family_options(section: str) -> list[tuple[str, type]]:
    """(family name, dataclass) of every family that declares its own keys of the config
    section `section` ("model", "train", ...): the `OPTIONS` table of its options.py,
    {section: dataclass}, which imports nothing heavy (core/config/family_options.py
    merges them into the schema)."""
    out = []
    for name in _modules():
        module_name = f"{_PACKAGE}.{name}.options"
        if importlib.util.find_spec(module_name) is None:
            continue
        declared = importlib.import_module(module_name).OPTIONS
        if section in declared:
            out.append((name, declared[section]))
    return out


def names_where(holds: Callable[[ModelFamily], object]) -> str:
    """The families for which `holds(family)` is true, comma-separated ("none"), for a
    help text or a message: from the registry, so a new family is listed by itself and
    shared code names none."""
    return ", ".join(f.name for f in families() if holds(f)) or "none"


def frame_rules() -> str:
    """Each video family's frame rule, for help texts ("wan: 4k + 1")."""
    return "; ".join(f"{f.name}: {f.geometry.frame_rule()}" for f in families()
                     if f.geometry.video) or "no video family"


def frame_rates() -> str:
    """Each video family's frame rate, for help texts ("wan: 16")."""
    return "; ".join(f"{f.name}: {f.geometry.fps:g}" for f in families()
                     if f.geometry.fps) or "no video family"


def families() -> list[ModelFamily]:
    """Every FAMILY, in display order."""
    return [get_family(name) for name in _modules()]


def __getattr__(attr: str) -> tuple[str, ...] | str:
    """FAMILY_NAMES, DEFAULT_FAMILY, FLOW_FAMILIES and GUIDANCE_FAMILIES, computed from
    the families on first use (a module attribute, so `from registry import FAMILY_NAMES`
    works)."""
    if attr == "FAMILY_NAMES":
        return tuple(list_families())
    # The config's default model.family (and tiny:<it> its default model.path): the first
    # family in display order, the one with the lowest ORDER.
    if attr == "DEFAULT_FAMILY":
        return list_families()[0]
    # Trained by flow matching: their target is fixed, so model.prediction_type (the
    # epsilon/v choice of the others) must stay "auto".
    if attr == "FLOW_FAMILIES":
        return tuple(f.name for f in families() if f.prediction == "flow_matching")
    # Guidance-distilled models (a guidance embedding given train.guidance in training).
    if attr == "GUIDANCE_FAMILIES":
        return tuple(f.name for f in families() if f.train_guidance is not None)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
