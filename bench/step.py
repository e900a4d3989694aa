"""Benchmark: the trainer's step time versus a bare training step of the same model.

    python bench/step.py [--steps 40] [--batch 4] [--resolution 128] [--workspace DIR]
                         [--bare-steps 30] [--warmup 3] [--omp-passive]
                         [--modes direct,accelerate,accelerate-cpu]

On a tiny sd15 LoRA and the demo shapes dataset (caches built first, in this process):

- bare: in this process, the same model and LoRA (`add_trainable`), random latents and
  text embeddings of the cached shapes, and per step only noise_and_target + predict +
  loss, backward, gradient clipping (the config's max_grad_norm), AdamW step, zero_grad.
  Median over --bare-steps after --warmup, on each thread count a trainer mode gets (a
  trainer on 1 thread is compared with a bare step on 1 thread: the ratio is the loop's
  overhead, not a thread setting). Measured before and after the trainer runs, so
  outside load shows as a spread rather than silently skewing the ratio.
- trainer: the real program in a subprocess, per mode:
    direct          python -m core.train.main --config ... --workspace ...
    accelerate      core.runs.command.build_accelerate_command + core.runs.manager.start_run
                    with the config's launch.cpu = false (the demo preset's value)
    accelerate-cpu  the same with launch.cpu = true (adds --cpu and the thread count)
  Median step time from the step events' timestamps (eval, validation and checkpoints
  are pushed past max_steps; any interval holding another event is dropped anyway, as
  are the first --warmup intervals), and launch-to-first-step: wall time from starting
  the subprocess to the first step event, split at the trainer's "starting" and
  "running" status events.

Also, in this process, the median cost of each piece of per-step work the loop adds
around the bare step (cache reads, collate, the step event and log line, the stop
check), to say where any gap goes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    REPO,
    demo_like_config,
    load_line,
    median,
    parse_run_options,
    workspace,
)

from core.runs.folder import RunFolder  # noqa: E402  (common put the repo on sys.path)

MODES = ("direct", "accelerate", "accelerate-cpu")


# ---------------------------------------------------------------- bare step


def bare_step_times(cfg: Any, model_dir: Path, shapes: dict[str, tuple[int, ...]],
                    steps: int, warmup: int, threads: int) -> list[float]:
    """Seconds per bare step (see the module doc) on `threads` CPU threads, after
    `warmup` untimed steps."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _bare_steps(cfg, model_dir, shapes, steps, warmup)
    finally:
        torch.set_num_threads(before)


def _bare_steps(cfg: Any, model_dir: Path, shapes: dict[str, tuple[int, ...]],
                steps: int, warmup: int) -> list[float]:
    import torch

    from core.models.registry import get_family
    from core.train.setup import add_trainable, make_optimizer

    torch.manual_seed(cfg.train.seed)
    family = get_family("sd15")
    comps = family.load(str(model_dir))
    params = add_trainable(family, comps.denoiser, cfg)
    optimizer = make_optimizer(params, cfg)
    batch = cfg.train.batch_size
    latents = torch.randn(batch, *shapes["latents"])
    conditioning = {"prompt_embeds": torch.randn(batch, *shapes["prompt_embeds"]),
                    "prompt_mask": torch.ones(batch, shapes["prompt_embeds"][0],
                                              dtype=torch.bool)}
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        sample = family.noise_and_target(comps, latents)
        prediction = family.predict(comps, sample, conditioning)
        loss = family.loss(comps, prediction.float(), sample, cfg.train.min_snr_gamma)
        loss.backward()
        if cfg.train.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.train.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())  # the loop reads the loss every step
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


# ---------------------------------------------------------------- loop overhead pieces


def _median_ms(fn: Any, reps: int = 30) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * median(times)


def overhead_pieces(cfg: Any, plan: Any, run_dir: Path) -> dict[str, float]:
    """Median ms of each piece of work micro_step/Loop.run/Reporter.step add per step."""
    import torch

    from core.cache.dataset import cached_datasets
    from core.data.collate import collate
    from core.runs.status import append_event, stop_requested, write_status
    from core.train.batches import to_device
    from core.train.report import Reporter

    dataset = cached_datasets(cfg, plan)[0]
    indices = list(range(cfg.train.batch_size))
    items = [dataset.load(i) for i in indices]
    reporter = Reporter(run_dir, True, cfg.train.max_steps)
    devnull = open(os.devnull, "w")  # noqa: SIM115 - the log line's cost, not the terminal's
    real_stdout = sys.stdout
    step = [0]

    def report_step() -> None:
        sys.stdout = devnull
        try:
            step[0] += 1
            reporter.step(step[0], 0.1, 1e-3, 0)
        finally:
            sys.stdout = real_stdout

    pieces = {
        "read cache entries (batch)": lambda: [dataset.load(i) for i in indices],
        "collate + to_device": lambda: to_device(collate(items), "cpu", torch.float32),
        "append_event (one line)": lambda: append_event(run_dir, {"type": "step", "step": 1}),
        "write_status (json, rename)": lambda: write_status(run_dir, state="running", step=1),
        "Reporter.step (event+print, status<=1/s)": report_step,
        "stop check (STOP file exists)": lambda: stop_requested(run_dir),
    }
    try:
        return {name: _median_ms(fn) for name, fn in pieces.items()}
    finally:
        devnull.close()


# ---------------------------------------------------------------- the trainer


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = RunFolder(run_dir).events
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a partial last line
    return out


def step_intervals(events: list[dict[str, Any]], warmup: int) -> list[float]:
    """Seconds between consecutive step events with nothing else between them."""
    intervals, last, clean = [], None, True
    for event in events:
        if event.get("type") != "step":
            clean = False
            continue
        if last is not None and clean:
            intervals.append(event["time"] - last)
        last, clean = event["time"], True
    return intervals[warmup:]


def _first(events: list[dict[str, Any]], **match: Any) -> float | None:
    for event in events:
        if all(event.get(k) == v for k, v in match.items()):
            return event["time"]
    return None


def run_trainer(mode: str, cfg: Any, ws: Path, timeout: float, warmup: int,
                wrapper: list[str] | None = None) -> dict[str, Any]:
    """Start one run, wait for it, and read its timings from events.jsonl. `wrapper`
    (direct mode): a script and its arguments that run `-m core.train.main ...` in turn
    (bench/steptimer.py, which bench/peers.py times both trainers with)."""
    import dataclasses
    import shutil

    from core.runs.command import build_accelerate_command, format_command
    from core.runs.manager import start_run
    from core.runs.prepare import prepare_run_dir

    run_cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output,
                                                                   dir=str(ws / "runs" / mode)))
    run_cfg.launch = dataclasses.replace(cfg.launch, cpu=mode == "accelerate-cpu")
    run_dir = Path(run_cfg.output.dir)
    shutil.rmtree(run_dir, ignore_errors=True)  # this benchmark's own folder from a past run
    prepare_run_dir(run_cfg, run_dir, resume=False)
    launched = time.time()
    if mode == "direct":
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                           os.environ.get("PYTHONPATH")]))}
        with open(RunFolder(run_dir).log, "ab") as log:
            proc = subprocess.run(
                [sys.executable, *(wrapper or []), "-m", "core.train.main", "--config",
                 str(RunFolder(run_dir).config), "--workspace", str(ws)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                check=False)
        state = {0: "done"}.get(proc.returncode, f"exit {proc.returncode}")
        command = "python -m core.train.main --config RUN/config.toml --workspace WS"
    else:
        spec = build_accelerate_command(run_cfg, run_dir, ws, resume=None)
        handle = start_run(spec, run_dir)
        state = handle.wait(timeout=timeout)
        if state is None:
            handle.stop()  # SIGINT, grace, then the whole process group
            state = "timed out"
        command = format_command(spec)
    total = time.time() - launched
    events = _events(run_dir)
    first_step = _first(events, type="step", step=1)
    if state != "done" or first_step is None:
        tail = RunFolder(run_dir).log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{mode} run ended {state}; the end of {run_dir}/train.log:\n{tail}")
    starting = _first(events, type="status", state="starting")
    running = _first(events, type="status", state="running")
    return {
        "mode": mode, "command": command, "total_s": total, "launched": launched,
        "intervals": step_intervals(events, warmup),
        "first_step_s": first_step - launched,
        "to_starting_s": (starting or launched) - launched,
        "to_running_s": (running or launched) - launched,
        "threads": trainer_threads(mode, command),
    }


def trainer_threads(mode: str, command: str) -> int:
    """The trainer's CPU threads. accelerate exports OMP_NUM_THREADS to the trainer from
    --num_cpu_threads_per_process or, without that flag, from this environment or 1;
    a direct start gets torch's default (this process's count, same environment)."""
    import torch

    if "--num_cpu_threads_per_process" in command:
        return int(command.split("--num_cpu_threads_per_process")[1].split()[0])
    if mode != "direct":
        return int(os.environ.get("OMP_NUM_THREADS", "1"))
    return torch.get_num_threads()


def expected_threads(mode: str, cfg: Any, ws: Path) -> int:
    """What trainer_threads will find, known before the run (to time the bare step)."""
    import dataclasses

    from core.runs.command import build_accelerate_command, format_command

    if mode == "direct":
        return trainer_threads(mode, "")
    run_cfg = dataclasses.replace(cfg, launch=dataclasses.replace(
        cfg.launch, cpu=mode == "accelerate-cpu"))
    spec = build_accelerate_command(run_cfg, ws / "runs" / mode, ws, resume=None)
    return trainer_threads(mode, format_command(spec))


# ---------------------------------------------------------------- main


def prepare(ws: Path, args: argparse.Namespace) -> tuple[Any, Path, Any, dict[str, tuple]]:
    """Tiny model, demo images, a demo-like config and complete caches."""
    from core.cache.stage import build_caches
    from core.cache.store import load_entry
    from core.data.synthetic import generate_demo_dataset
    from core.models.registry import get_family
    from core.models.tiny import materialize_tiny

    start = time.perf_counter()
    model_dir = materialize_tiny("sd15", ws)
    images = ws / "demo" / "shapes"
    count = generate_demo_dataset(images, size=args.resolution)
    cfg = demo_like_config(ws, images, args.resolution, args.batch, args.steps)
    family = get_family("sd15")
    report = build_caches(cfg, family, family.load(str(model_dir)))
    job = report.plan.vae_jobs[0]
    text_entry = report.plan.datasets[0].text_entries[0]
    shapes = {"latents": tuple(load_entry(job.entry)[0]["latents"].shape),
              "prompt_embeds": tuple(load_entry(text_entry)[0]["prompt_embeds"].shape)}
    print(f"prepared in {time.perf_counter() - start:.1f} s: {count} demo images at "
          f"{args.resolution} px, caches complete; cached shapes {shapes}")
    return cfg, model_dir, report.plan, shapes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="trainer max_steps")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--bare-steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out on both sides")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"trainer launches to time, from {', '.join(MODES)}")
    args = parse_run_options(parser, argv, "per trainer run, seconds")
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    with workspace(args.workspace, "bench-step-") as ws:
        run(ws, args, modes)


def run(ws: Path, args: argparse.Namespace, modes: list[str]) -> None:
    import torch

    print(load_line())
    print(f"torch {torch.__version__}; this process: {torch.get_num_threads()} threads")
    cfg, model_dir, plan, shapes = prepare(ws, args)
    thread_counts = sorted({expected_threads(m, cfg, ws) for m in modes}, reverse=True)
    bare: dict[int, list[list[float]]] = {n: [] for n in thread_counts}

    def measure_bare(when: str) -> None:
        for n in thread_counts:
            bare[n].append(bare_step_times(cfg, model_dir, shapes, args.bare_steps,
                                           args.warmup, n))
            print(f"bare step, {n} thread(s) ({when}): median {median(bare[n][-1]):.3f} s "
                  f"over {args.bare_steps} steps  [{load_line()}]", flush=True)

    measure_bare("before")
    results = []
    for mode in modes:
        result = run_trainer(mode, cfg, ws, args.timeout, args.warmup)
        results.append(result)
        print(f"trainer {mode} ({result['threads']} thread(s)): median step "
              f"{median(result['intervals']):.3f} s over {len(result['intervals'])} "
              f"intervals, first step at {result['first_step_s']:.1f} s  [{load_line()}]",
              flush=True)
    measure_bare("after")
    pieces = overhead_pieces(cfg, plan, ws / "runs" / "pieces")
    summary(args, bare, results, pieces)


def summary(args: argparse.Namespace, bare: dict[int, list[list[float]]],
            results: list[dict[str, Any]], pieces: dict[str, float]) -> None:
    print(f"\nbatch {args.batch}, {args.resolution} px, LoRA rank 8, tiny sd15; trainer "
          f"max_steps {args.steps}, first {args.warmup} intervals dropped on both sides")
    for n, runs in bare.items():
        print(f"bare step, {n} thread(s): median {median(runs[0] + runs[1]):.3f} s (before "
              f"{median(runs[0]):.3f}, after {median(runs[1]):.3f})")
    for r in results:
        step, runs = median(r["intervals"]), bare[r["threads"]]
        base = median(runs[0] + runs[1])
        p90 = sorted(r["intervals"])[int(0.9 * (len(r["intervals"]) - 1))]
        print(f"[{r['mode']}] median step {step:.3f} s on {r['threads']} thread(s)  "
              f"RATIO trainer/bare {step / base:.3f} (aim <= 1.10); p90 {p90:.3f} s")
        print(f"[{r['mode']}] launch to first step {r['first_step_s']:.1f} s (to 'starting' "
              f"{r['to_starting_s']:.1f} s, to 'running' {r['to_running_s']:.1f} s); whole "
              f"run {r['total_s']:.1f} s")
        print(f"[{r['mode']}] command: {r['command']}")
    print("per-step pieces the loop adds around the bare step (median, this process):")
    for name, ms in pieces.items():
        print(f"  {name:<42} {ms:7.2f} ms")
    print(load_line())


if __name__ == "__main__":
    main()
