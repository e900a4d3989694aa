"""What the buttons do: `core.ops` (the same actions `python app.py --no-ui` takes), with
its refusals turned into messages for a person in the browser.

The UI's events and its API endpoints both call these. Refusals raise `ActionError` (a
message plus the problems behind it); the UI shows it as a warning and a visible panel,
the API as an error message. What is the app's own state (the runs it follows, its one
cache build) lives in `AppContext`; everything else is in `core.ops`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

from core import ops
from core.config import Config, resolved
from core.ops import CheckReport, RunFolder
from core.problems import Hint, Problem
from ui.context import AppContext
from ui.state import field_label

STOP_GRACE_S = 60.0


class ActionError(ops.OpError):
    """A refusal worded for the browser (the UI shows `message` and the problems)."""


# Where the browser shows the problems behind a refusal (the CLI prints them below it).
LISTED = " (each is marked at its field; the check panel on the Dataset tab lists them)"


def _for_the_browser(message: str, hint: Hint | None) -> str:
    """A refusal said with the form's controls: core's hint (the key, the value it
    suggests) worded with the key's label and the UI's buttons; one without a hint as
    core says it."""
    if hint is None:
        return message
    label = field_label(hint.key) or hint.key
    return hint.say({"key": label, "set": f"{label} = {hint.value}", "resume": "Resume",
                     "extend": f"set {label} higher (e.g. {hint.value}) and click Extend "
                               f"to {label}", "listed": LISTED})


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """Turn `core.ops` refusals into `ActionError`s worded for the browser."""
    try:
        yield
    except ops.OpError as exc:
        problems = [dataclasses.replace(p, message=_for_the_browser(p.message, p.hint))
                    for p in exc.problems]
        raise ActionError(_for_the_browser(exc.message, exc.hint), problems) from None


def check(ctx: AppContext, cfg: Config, form_problems: list[Problem] | None = None,
          estimate: bool = True) -> CheckReport:
    """`--stage check` on the form's config; form problems (an empty number) come first."""
    return ops.check(cfg, ctx.workspace, form_problems, estimate)


# ---------------------------------------------------------------- training runs


def launch(ctx: AppContext, cfg: Config, resume: bool = False,
           form_problems: list[Problem] | None = None) -> ops.Launched:
    """Check, prepare the output folder and start `accelerate launch` (as the CLI does),
    or queue it while another run of the workspace is live (`launched.queued`).

    With `resume`, the run in the form's output folder continues with its saved config."""
    with refusals():
        launched = ops.launch(cfg, ctx.workspace, resume="latest" if resume else None,
                              extra_problems=form_problems, queue=True)
    if launched.handle is not None:
        ctx.track(launched.handle)
    return launched


def output_dir(ctx: AppContext, cfg: Config) -> Path:
    return ops.output_dir(cfg, ctx.workspace)


def resume(ctx: AppContext, run_dir: str | Path) -> ops.Launched:
    """Continue a run from its last checkpoint with the config it was started with
    (queued while another run is live)."""
    with refusals():
        launched = ops.resume(Path(run_dir), ctx.workspace, queue=True)
    if launched.handle is not None:
        ctx.track(launched.handle)
    return launched


def extend(ctx: AppContext, run_dir: str | Path, max_steps: int | None,
           form_problems: list[Problem] | None = None) -> ops.Launched:
    """Train a finished run on to `max_steps` (the form's), keeping its final LoRA
    (queued while another run is live)."""
    bad = [p for p in form_problems or [] if p.where == "train.max_steps"]
    if bad or not max_steps:
        raise ActionError("set Max steps to the step to extend the run to", bad)
    with refusals():
        launched = ops.extend(Path(run_dir), ctx.workspace, int(max_steps), queue=True)
    if launched.handle is not None:
        ctx.track(launched.handle)
    return launched


def stop(ctx: AppContext, run_dir: str | Path, grace_s: float = STOP_GRACE_S) -> str:
    """Stop a run (the trainer saves first); returns its final state."""
    run_dir = Path(run_dir)
    with refusals(), ctx.exclusive(run_dir):
        state = ops.stop(run_dir, grace_s, handle=ctx.handle(run_dir),
                         workspace=ctx.workspace)
    ctx.forget(run_dir)
    return state


def reproduce_lines(ctx: AppContext, run_dir: Path) -> str:
    """Copyable commands: the exact command the run used, and the CLI equivalents."""
    folder = RunFolder(run_dir)
    ws = shlex.quote(str(ctx.workspace))
    config = shlex.quote(str(folder.config))
    python = shlex.quote(sys.executable)
    lines = []
    if folder.command.exists():
        lines += [f"# the exact command this run used ({folder.command.name}):",
                  folder.command.read_text(encoding="utf-8").strip()]
    lines += ["# continue it from its last checkpoint:",
              f"{python} app.py --no-ui --config {config} --workspace {ws} --resume",
              "# the same config as a new run (pick a new output folder):",
              f"{python} app.py --no-ui --config {config} --workspace {ws} "
              f"--set output.dir={shlex.quote(ctx.relative(run_dir) + '-new')}"]
    return ctx.redact("\n".join(lines))


# ---------------------------------------------------------------- queue, downloads, delete


def cancel_queued(ctx: AppContext, run_dir: str | Path) -> None:
    with refusals():
        ops.cancel_queued(Path(run_dir), ctx.workspace)


def move_queued(ctx: AppContext, run_dir: str | Path, delta: int) -> list[Path]:
    with refusals():
        return ops.move_queued(Path(run_dir), ctx.workspace, delta)


def run_downloads(ctx: AppContext, run_dir: str | Path) -> list[Path]:
    """The run's files a browser may download (all inside the workspace)."""
    with refusals():
        return ops.run_downloads(Path(run_dir), ctx.workspace)


def merged_archive(ctx: AppContext, run_dir: str | Path) -> Path:
    """The run's merged/ as one .zip inside the workspace (made on demand)."""
    with refusals():
        return ops.merged_archive(Path(run_dir), ctx.workspace)


def delete_run(ctx: AppContext, run_dir: str | Path, confirm: bool) -> Path:
    """Delete a run that is not live, only when `confirm`; our handle on it goes too."""
    with refusals():
        path = ops.delete_run(Path(run_dir), ctx.workspace, confirm=confirm)
    ctx.forget(path)
    ctx.watchers.drop(path)
    return path


# ---------------------------------------------------------------- caches


def start_cache(ctx: AppContext, cfg: Config,
                form_problems: list[Problem] | None = None):
    """Start a cache build in the background (one at a time per app)."""
    with refusals():
        ctx.cache_job = ops.start_cache(cfg, ctx.workspace, running=ctx.cache_job,
                                        extra_problems=form_problems)
    return ctx.cache_job


def stop_cache(ctx: AppContext) -> str:
    job = ctx.cache_job
    if job is None:
        raise ActionError("no cache build to stop")
    return job.stop()


# ---------------------------------------------------------------- auto-captioning


def start_caption(ctx: AppContext, cfg: Config, dataset_ids: list[str] | None = None,
                  form_problems: list[Problem] | None = None):
    """Start captioning (one job at a time per app): `dataset_ids`, or the config's
    captioning.datasets when None. Only the form's problems with the captioning keys or
    the datasets block it."""
    relevant = [p for p in form_problems or [] if p.where.startswith(("captioning",
                                                                      "datasets"))]
    with refusals():
        ctx.caption_job = ops.start_caption(ops.caption_config(cfg, dataset_ids),
                                            ctx.workspace, running=ctx.caption_job,
                                            extra_problems=relevant)
    return ctx.caption_job


def stop_caption(ctx: AppContext) -> str:
    job = ctx.caption_job
    if job is None:
        raise ActionError("no captioning job to stop")
    return job.stop()


def cache_status(ctx: AppContext, cfg: Config):
    return ops.cache_status(resolved(cfg, ctx.workspace), ctx.workspace)


def dataset_by_id(cfg: Config, dataset_id: str) -> int:
    for i, ds in enumerate(cfg.datasets):
        if ds.id == dataset_id:
            return i
    known = ", ".join(ds.id for ds in cfg.datasets) or "none"
    raise ActionError(f"no dataset with id {dataset_id!r} (datasets: {known})")


def cache_files(ctx: AppContext, cfg: Config, dataset_id: str):
    """What clearing would delete, for the confirmation."""
    full = resolved(cfg, ctx.workspace)
    try:
        return ops.cache_files(full.datasets[dataset_by_id(cfg, dataset_id)], full)
    except ops.OpError as exc:
        raise ActionError(exc.message) from None


def read_caption(ctx: AppContext, cfg: Config, image: str) -> str:
    """The caption editor's text for `image`: its caption as its dataset reads it."""
    with refusals():
        return ops.read_caption(cfg, ctx.workspace, image)


def save_caption(ctx: AppContext, cfg: Config, image: str, text: str) -> Path:
    """The caption editor's Save: `image` of any of the form's datasets."""
    with refusals():
        return ops.save_caption(cfg, ctx.workspace, image, text)


def clear_cache(ctx: AppContext, cfg: Config, dataset_id: str):
    job = ctx.cache_job
    if job is not None and job.poll() is None:
        raise ActionError("a cache build is running; stop it before clearing a cache")
    full = resolved(cfg, ctx.workspace)
    try:
        return ops.clear_cache(full.datasets[dataset_by_id(cfg, dataset_id)], full)
    except ops.OpError as exc:
        raise ActionError(exc.message) from None
