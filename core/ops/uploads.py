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
    """The dataset entry for the upload folder `datasets/<name>`, its latents cached
    outside the images in a folder named after its (unique) id, so no two datasets
    share one."""
    from core.config import DatasetConfig
    from core.data.upload import DATASETS_DIR

    dataset_id = dataset_id or name
    return DatasetConfig(id=dataset_id, images=f"{DATASETS_DIR}/{name}",
                         vae_cache=f"cache/{dataset_id}/vae")


def upload_images(files: list[str | Path], workspace: str | Path, name: str) -> UploadResult:
    """Copy the image files into `<workspace>/datasets/<name>`; what was copied, renamed
    and skipped (core/data/upload.py). Nothing there is overwritten."""
    from core.data.upload import upload_images as upload

    return upload(files, workspace, name)
