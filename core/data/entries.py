"""What the data layer reads of the typed config, as structural types.

core/data sits below core/config (the config's checks read the data layer), so it
cannot import the config's dataclasses; these protocols name the fields it reads, and
core.config's DatasetConfig and Config satisfy them as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class DatasetEntry(Protocol):
    """One `[[datasets]]` entry: its folders and how its captions are read."""

    id: str
    images: str
    vae_cache: str
    masks: str
    caption: str
    instance_prompt: str
    # video families: frames per sample, resampling rate, and clips per video
    frames: int
    fps: float
    clips: str
    clip_count: int
    clip_stride: int
    # edit families: folders of control images matched to the targets by stem
    control: str
    control_2: str
    control_3: str


class HasDir(Protocol):
    @property
    def dir(self) -> str: ...


class FolderLayout(Protocol):
    """The folders of a whole config: every dataset's, the text cache's, the output's."""

    @property
    def datasets(self) -> Sequence[DatasetEntry]: ...
    @property
    def text_cache(self) -> HasDir: ...
    @property
    def output(self) -> HasDir: ...
