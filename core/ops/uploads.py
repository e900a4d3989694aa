"""Uploads: images dropped on the UI copied into a dataset folder of the workspace."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config import DatasetConfig
    from core.data.upload import UploadResult

__all__ = ["dataset_name", "upload_images", "uploaded_dataset"]


def dataset_name(text: str) -> str:
    """The folder name an upload named `text` goes to."""
    from core.data.upload import dataset_name as name

    return name(text)


def uploaded_dataset(name: str, dataset_id: str | None = None) -> DatasetConfig:
    """The dataset entry that reads the upload folder `name`."""
    from core.data.upload import uploaded_dataset as dataset

    return dataset(name, dataset_id)


def upload_images(files: list[str | Path], workspace: str | Path, name: str) -> UploadResult:
    """Copy the image files into `<workspace>/datasets/<name>`; what was copied, renamed
    and skipped (core/data/upload.py). Nothing there is overwritten."""
    from core.data.upload import upload_images as upload

    return upload(files, workspace, name)
