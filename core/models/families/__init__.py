"""One folder per model family: `core/models/families/<name>/`.

Each folder is a package whose `__init__.py` exports `FAMILY` (the object satisfying
core.models.base.ModelFamily, defined in its family.py) and `ORDER` (its place in the
family lists), and holds everything else that is only that family's: tiny.py (the tiny
random model's `build(out_dir, seed)`, `tiny:<name>`), full_size/ (the real model's
configs in diffusers-folder layout, `random:<name>`) and any helper of its own.

core.models.registry discovers the folders (pkgutil over this package's path); no list of
names is kept anywhere else. EXTRA_MODEL_FAMILIES (folders, os.pathsep-separated) adds
folders whose sub-packages are discovered as families too: the test that copies a family
under a new name uses it, so a copy never has to be written into the source tree.
"""

from __future__ import annotations

import os

EXTRA_PATH_VARIABLE = "EXTRA_MODEL_FAMILIES"

# Extra family folders import as core.models.families.<name>, like the shipped ones.
__path__ += [p for p in os.environ.get(EXTRA_PATH_VARIABLE, "").split(os.pathsep) if p]
