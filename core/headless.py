"""`python app.py --no-ui`: parse the arguments, call `core.ops`, print what happens.

Exit codes are the CLI contract (core/exits.py): 0 done, 2 invalid config or datasets,
1 run failed, 130 stopped by the user.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from core import ops
from core.config import Config, LaunchConfig
from core.config.optimizers import optimizer_package
from core.exits import EXIT_INVALID, EXIT_OK, EXIT_STOPPED
from core.libraries import leave_out_unused_libraries

FOLLOW_GRACE_S = 120.0  # a Ctrl-C gives the trainer this long to save


def say(line: str) -> None:
    print(line, flush=True)


def complain(exc: ops.OpError) -> int:
    """Every problem on stderr, one a line (or the message when there are none)."""
    for line in [str(p) for p in exc.problems] or [f"error: {exc.message}"]:
        print(line, file=sys.stderr, flush=True)
    return exc.exit_code


def summarize_run(run_dir: Path, state: str, workspace: Path,
                  launch: LaunchConfig | None = None) -> None:
    """Where the results are, and how to resume; `launch`: this machine's place."""
    for line in ops.run_summary(run_dir, state, workspace, launch):
        say(line)


def stage_cache(cfg: Config, workspace: Path, checked: ops.CheckReport) -> int:
    """Build the caches under the run manager, echoing the builder's log."""
    with deferred_interrupt() as asked:  # once started, a Ctrl-C stops it: no orphan
        job = ops.start_cache(cfg, workspace, checked=checked)
        say(f"== cache (log: {job.log_path})")
    state, code = ops.follow_in_terminal(job.handle, sys.stdout, FOLLOW_GRACE_S,
                                         stopping=bool(asked))
    if state == "stopped":
        say("cache build stopped; entries written so far are kept")
    return EXIT_INVALID if job.handle.returncode == EXIT_INVALID else code


def stage_caption(cfg: Config, workspace: Path) -> int:
    """Check `[captioning]`, then write captions in a job, echoing its log."""
    from core.problems import errors, errors_first

    say("== check (captioning)")
    problems = ops.check_captioning(cfg, workspace)
    for problem in errors_first(problems):
        say(str(problem))
    if errors(problems):
        say(f"summary: {len(errors(problems))} error(s); nothing was captioned")
        return EXIT_INVALID
    with deferred_interrupt() as asked:
        job = ops.start_caption(cfg, workspace)
        say(f"== caption (log: {job.log_path})")
    _, code = ops.follow_in_terminal(job.handle, sys.stdout, FOLLOW_GRACE_S,
                                     stopping=bool(asked))
    return EXIT_INVALID if job.handle.returncode == EXIT_INVALID else code


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[list[bool]]:
    """A Ctrl-C while a run starts is noted, not raised: raised there, it would leave
    the launcher (in its own session) running with nobody following it."""
    asked: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield asked
        return
    previous = signal.signal(signal.SIGINT, lambda *_: asked.append(True))
    try:
        yield asked
    finally:
        signal.signal(signal.SIGINT, previous)


def stage_train(cfg: Config, workspace: Path, resume: str | None,
                checked: ops.CheckReport) -> int:
    """Start the trainer under accelerate launch (it builds missing cache entries first)."""
    with deferred_interrupt() as asked:  # once started, a Ctrl-C stops it: no orphan
        launched = ops.launch(cfg, workspace, resume=resume, checked=checked)
        for problem in launched.folder_notes:  # the check's warnings are printed already
            say(str(problem))
        say(f"== train: {launched.run_dir} (log: {launched.handle.folder.log})")
    state, code = ops.follow_in_terminal(launched.handle, sys.stdout, FOLLOW_GRACE_S,
                                         stopping=bool(asked))
    # Machine N > 0 follows its own folder; the results are in the run folder.
    summarize_run(ops.output_dir(cfg, workspace), state, workspace, cfg.launch)
    return code


def stage_merge(cfg: Config, workspace: Path) -> int:
    """Fuse the final LoRA of the run in output.dir into its base (no dataset check: the
    merge reads only the run folder and the base model)."""
    say(f"== merge: {ops.output_dir(cfg, workspace)}")
    merged = ops.merge(cfg, workspace)
    say(f"merged model (base + LoRA at scale {cfg.merge.lora_scale:g}): {merged}")
    checkpoint = ops.RunFolder(merged.parent).merged_checkpoint
    if checkpoint.is_file():
        say(f"as one checkpoint file (A1111, ComfyUI's Load Checkpoint): {checkpoint}")
    return EXIT_OK


def demo_notes(args: argparse.Namespace, cfg: Config, workspace: Path) -> list[str]:
    """The demo presets' set-up, which may change cfg.output.dir: a new run moves on to a
    free `-N` folder; a merge or a resume acts on the demo run trained last."""
    if not ops.is_demo(args.preset) or args.stage == "check":
        return []
    if args.stage == "merge":  # reads only the run and its base: no images needed
        return ops.latest_demo_run(cfg, workspace)
    notes = ops.prepare_demo(cfg, workspace, new_output=not args.resume)
    return notes + (ops.latest_demo_run(cfg, workspace) if args.resume else [])


def run_headless(args: argparse.Namespace, own_process: bool = False) -> int:
    """`own_process`: the process is app.py's alone (see core/libraries.py)."""
    workspace = Path(args.workspace).expanduser().absolute()
    try:
        ops.require_workspace(workspace)
        cfg = ops.load_run_config(args.config, args.preset, args.overrides)
        if own_process:  # it checks (or merges) this one config, then follows the run
            # The check's memory estimate builds the model's modules and adds its adapter
            # with peft, which imports bitsandbytes and torchao whenever they are
            # installed: 1.4 s of a 6.4 s check on 2 cores, for libraries the run skips.
            leave_out_unused_libraries(optimizer_package(cfg.train.optimizer),
                                       cfg.model.quantize)
        for note in demo_notes(args, cfg, workspace):
            say(note)
        if args.stage == "caption":  # its own check: the diffusion model is not needed
            return stage_caption(cfg, workspace)
        if args.stage == "merge":
            return stage_merge(cfg, workspace)
        say("== check")
        report = ops.check(cfg, workspace)
        for line in report.lines():
            say(line)
        if not report.ok or args.stage == "check":
            return EXIT_OK if report.ok else EXIT_INVALID
        if args.stage == "cache":
            return stage_cache(cfg, workspace, report)
        return stage_train(cfg, workspace, args.resume, report)
    except ops.OpError as exc:
        return complain(exc)
    except KeyboardInterrupt:  # before a run started: nothing to save
        say("stopped before a run started")
        return EXIT_STOPPED
