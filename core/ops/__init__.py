"""The actions of the tool, one set for both front ends.

`python app.py --no-ui` (core/headless.py) and the web UI (ui/actions.py, behind its
buttons and API endpoints) call these and nothing below them, so a click, an API call
and a command line do the same thing: check, prepare the demo data, build the caches,
caption the images, launch or resume a run, stop it, read its status, list the runs.
The UI imports core only from here (and core.config, core.problems, core.exits for
types): tests/test_layering.py holds it to that.

One module per subject: checks (configs, the check, the model source, the memory
estimate), datasets, uploads, caches, captions, runs, queued (the UI's run queue),
downloads, merging, videos, edits (edit pairs as the UI shows them),
and following (what the UI reads to follow runs and jobs).

Refusals raise `OpError`: a message for a person, the problems behind it (each naming a
key or a path) and the CLI exit code it maps to. Nothing here prints. Importing this
package loads no torch, diffusers or PIL: the heavy parts are imported inside the
functions that use them.
"""

from __future__ import annotations

from core.ops.caches import cache_files, cache_status, caches_complete, clear_cache, start_cache
from core.ops.captions import (
    EDITS,
    CaptionEdit,
    apply_caption_edit,
    caption_config,
    check_captioning,
    dataset_tags,
    preview_caption_edit,
    read_caption,
    save_caption,
    start_caption,
    undo_caption_edit,
)
from core.ops.checks import (
    FIT_KEYS,
    PRESETS_DIR,
    CheckReport,
    FitPlan,
    check,
    check_model_source,
    estimate_inputs,
    estimate_memory,
    gated_note,
    is_demo,
    list_presets,
    load_run_config,
    output_dir,
    require_ok,
    require_workspace,
)
from core.ops.datasets import (
    TAG_NAMES,
    bucket_histogram,
    family_has,
    index_dataset,
    latest_demo_run,
    prepare_demo,
)
from core.ops.downloads import merged_archive, run_downloads, saved_loras, tensorboard_command
from core.ops.edits import edit_pair_thumbnail, validation_controls
from core.ops.errors import OpError
from core.ops.following import (
    LIVE_STATES,
    SERIES,
    CacheJob,
    CaptionJob,
    LogTail,
    RunFolder,
    RunFollower,
    RunHandle,
    RunInfo,
    attach,
    format_memory,
    grid_steps,
    last_lines,
    read_status,
    run_info,
)
from core.ops.merging import merge, merge_run
from core.ops.queued import (
    cancel_queued,
    move_queued,
    queue_entries,
    queued_runs,
    start_next_queued,
)
from core.ops.runs import (
    Launched,
    delete_run,
    extend,
    launch,
    list_runs,
    reconcile_runs,
    resume,
    run_status,
    run_status_or_none,
    saved_config,
    stop,
)
from core.ops.terminal import follow_in_terminal, run_summary
from core.ops.uploads import dataset_name, upload_images, uploaded_dataset
from core.ops.videos import clip_frames, validation_videos, write_gif

__all__ = [
    "FIT_KEYS", "FitPlan", "LIVE_STATES", "PRESETS_DIR", "SERIES", "CacheJob", "CaptionJob",
    "CheckReport",
    "follow_in_terminal", "run_summary",
    "Launched", "LogTail", "OpError", "RunFolder", "RunFollower", "RunHandle", "RunInfo",
    "attach", "bucket_histogram", "cache_files", "cache_status", "caches_complete",
    "EDITS", "CaptionEdit", "apply_caption_edit", "cancel_queued", "caption_config", "dataset_tags",
    "preview_caption_edit", "undo_caption_edit", "check", "check_captioning", "check_model_source",
    "clear_cache", "clip_frames", "dataset_name", "delete_run", "edit_pair_thumbnail",
    "estimate_inputs", "estimate_memory", "extend",
    "family_has", "format_memory", "gated_note", "grid_steps", "TAG_NAMES",
    "index_dataset", "is_demo",
    "last_lines", "launch",
    "list_presets", "list_runs", "load_run_config", "merge", "merge_run", "move_queued",
    "latest_demo_run", "output_dir", "prepare_demo", "queue_entries", "queued_runs", "read_status",
    "merged_archive", "reconcile_runs", "require_ok", "require_workspace", "resume",
    "run_downloads",
    "read_caption", "run_info", "run_status", "run_status_or_none", "save_caption",
    "saved_config", "saved_loras",
    "start_cache", "start_caption", "start_next_queued", "stop", "tensorboard_command",
    "upload_images", "uploaded_dataset", "validation_controls", "validation_videos", "write_gif",
]
