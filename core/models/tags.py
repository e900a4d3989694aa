"""One table of capability tags: which config keys apply to which runs.

A config key that applies to some runs only carries a tag in its field metadata
(`video=True`, `edit=True`, ... : core/fields.py). Each tag here has its predicate on the
family (and train.method), which the Training and Dataset tabs' forms show a key by
(ui/form.py through core.ops.family_has), and says whether its keys leave a saved TOML for
a family it does not hold for (core/config/files.py), so a still family's preset carries
no clip keys. A capability's keys cost its spec field (core/models/capabilities.py) and
one row here; nothing else asks which family a run trains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tag:
    holds: Callable[[Any, str], bool]  # (family object, train.method) -> applies
    leaves_toml: bool = False  # its keys are left out of a saved TOML where it does not hold


def _flow(family: Any) -> bool:
    return family.prediction == "flow_matching"


TAGS: dict[str, Tag] = {
    "video": Tag(lambda f, m: f.geometry.video, leaves_toml=True),
    "edit": Tag(lambda f, m: f.edit is not None, leaves_toml=True),
    # Validation's control images: an edit family's references or a first frame.
    "conditioned": Tag(lambda f, m: f.edit is not None or f.first_image is not None,
                       leaves_toml=True),
    "audio": Tag(lambda f, m: f.audio is not None, leaves_toml=True),
    "flow": Tag(lambda f, m: _flow(f)),
    # An unknown name (FamilyDefaults, no name) is neither flow nor DDPM.
    "ddpm": Tag(lambda f, m: bool(f.name) and not _flow(f)),
    "guidance": Tag(lambda f, m: f.train_guidance is not None),
    "routing": Tag(lambda f, m: f.routing is not None),
    "lora": Tag(lambda f, m: m == "lora"),
    "blocks": Tag(lambda f, m: bool(f.block_lists) and m == "lora"),
}


def tag_holds(tag: str, family_name: str, method: str = "lora") -> bool:
    """Whether keys tagged `tag` apply to model.family `family_name` (an unknown name has
    no capability) and train.method `method`."""
    from core.models.registry import family_or_defaults

    return TAGS[tag].holds(family_or_defaults(family_name), method)


def dropped_tags(family_name: str) -> list[str]:
    """The tags whose keys a saved TOML of this family leaves out."""
    return [name for name, tag in TAGS.items()
            if tag.leaves_toml and not tag_holds(name, family_name)]
