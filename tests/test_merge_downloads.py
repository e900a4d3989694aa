"""Issue 54 item 4, merged models that leave the machine: a stale merged/ (merged, then
the run extended) is replaced only when the person ticks the Runs tab's Replace box, and
merged/ downloads whole as one .zip made inside the workspace. (The Runs tab's browser
test in test_merge.py clicks both.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_merge import base_pipeline, image, make_run

from core import ops


@pytest.fixture(scope="module")
def base_picture(tiny_workspace: Path) -> torch.Tensor:
    """What the tiny sd15 base draws (a merge at scale 0 draws the same)."""
    return image(base_pipeline("sd15", tiny_workspace), "sd15")


def test_a_stale_merged_folder_is_replaced_only_when_the_person_ticks_replace(
        tmp_path: Path, tiny_workspace: Path, base_picture: torch.Tensor):
    """Issue 54 item 4, Extend then Merge: a merged/ from before the run was extended is
    refused without the Runs tab's Replace box (beside the button, saying to tick it;
    nothing of it changes), and replaced with it (its old files gone, the new one
    drawing base + LoRA at the scale asked); the one-file checkpoint too."""
    import html

    from diffusers import DiffusionPipeline

    from ui.context import AppContext
    from ui.tab_runs_merge import REPLACE_LABEL, merge_message, replace_box

    run = make_run(tmp_path, tiny_workspace, "sd15")
    (run / "merged").mkdir()
    (run / "merged" / "stale.txt").write_text("merged before the extension")
    (run / "merged.safetensors").write_bytes(b"old")
    context = AppContext(tiny_workspace, monitor=False)
    try:
        assert replace_box(str(run))["visible"] is True
        text = html.unescape(merge_message(context, str(run), 0.0))
        assert "exists already" in text and f'tick "{REPLACE_LABEL}"' in text, text
        assert (run / "merged" / "stale.txt").exists()
        with pytest.raises(ops.OpError, match="exists already; nothing was overwritten"):
            ops.merge_run(run, tiny_workspace, 0.0)
        text = merge_message(context, str(run), 0.0, replace=True)
        assert "merged (base + LoRA at scale 0)" in text, text
    finally:
        context.close()
    assert not (run / "merged" / "stale.txt").exists()
    assert (run / "merged.safetensors").stat().st_size > 3
    got = image(DiffusionPipeline.from_pretrained(str(run / "merged"), local_files_only=True),
                "sd15")
    assert torch.allclose(got, base_picture, atol=2e-4), (got - base_picture).abs().max()


def test_merged_folder_downloads_as_one_zip_inside_the_workspace(tmp_path: Path):
    """The Runs tab's "whole merged model" download: every file of merged/ in one .zip
    under merged/ (made in the workspace's .downloads/, not in the run folder), made
    again once merged/ is replaced, deleted with the run; a run outside the workspace and a
    run without merged/ are refused."""
    import os
    import time
    import zipfile

    from core.runs.registry import RunRecord, register_run
    from core.runs.status import write_status

    workspace = tmp_path / "ws"
    run = workspace / "runs" / "r1"
    (run / "merged" / "unet").mkdir(parents=True)
    (run / "merged" / "model_index.json").write_text("{}")
    (run / "merged" / "unet" / "weights.safetensors").write_bytes(b"w" * 100)
    archive = ops.merged_archive(run, workspace)
    assert archive == (workspace / ".downloads/runs/r1/r1-merged.zip").resolve()
    with zipfile.ZipFile(archive) as z:
        assert sorted(z.namelist()) == ["merged/model_index.json",
                                        "merged/unet/weights.safetensors"]
        assert z.read("merged/unet/weights.safetensors") == b"w" * 100
    stamp = archive.stat().st_mtime_ns
    assert ops.merged_archive(run, workspace).stat().st_mtime_ns == stamp  # reused
    newer = run / "merged" / "unet" / "weights.safetensors"
    newer.write_bytes(b"v" * 10)
    os.utime(newer, ns=(stamp + 10**9, stamp + 10**9))  # a merge replaced it
    with zipfile.ZipFile(ops.merged_archive(run, workspace)) as z:
        assert z.read("merged/unet/weights.safetensors") == b"v" * 10
    with pytest.raises(ops.OpError, match="outside the workspace"):
        ops.merged_archive(run, tmp_path / "elsewhere")
    # Deleting the run (confirmed) takes its archive with it: nothing left of it.
    (run / "config.toml").write_text("version = 1\n")
    write_status(run, state="done", step=1, max_steps=1)
    register_run(workspace, RunRecord(str(run.resolve()), started_at=time.time()))
    ops.delete_run(run, workspace, confirm=True)
    assert not archive.exists() and not (workspace / ".downloads/runs/r1").exists()
    with pytest.raises(ops.OpError, match="merge the run first"):
        ops.merged_archive(workspace / "runs" / "none", workspace)
