"""Benchmark: GPU memory of each family's LoRA preset, measured against the goals and
the estimate `--stage check` prints.

    python bench/gpu_memory.py [--families sd15,sdxl,sd3,flux,...] [--steps 10]
                               [--quantize int8|fp8|none] [--out results.json]
                               [--estimate-only] [--workspace DIR] [--keep]

Per family: the preset on `model.path = "random:<family>"` (full-size architecture, random
weights: no download), 8 generated images, and the real path, `python app.py --no-ui
--preset <p> --set ...` (check, caches, `accelerate launch`, validation images at the
end). The trainer's `memory` events (docs/run-folder.md) give allocated device bytes: per
phase the most held since the previous event, and the launch's peak. Seconds per step:
the trainer's own (the last step event's it_s: recent steps, eval, validation and
checkpoints left out); bench/peers.py times steady state against diffusers' examples.

Goals (peak of the whole run): Flux LoRA 512 px, batch 1, int8, gradient checkpointing
<= 20 GiB; SDXL LoRA 1024 px, batch 1, bf16 <= 14 GiB; SD1.5 LoRA 512 px, batch 4
<= 8 GiB; SD3 at its preset's resolution, batch 1: reported only. FLUX.2, Chroma, Z-Image
and Qwen-Image at their presets' 1024 px, batch 1 (Qwen-Image int8, the others
unquantized): <= 23 GiB of tensors, what their tests' estimates promise ("fits a 24 GB
card": an RTX 4090's 24 GiB less the CUDA context and the allocator's slack). Without a
CUDA GPU only the estimates are printed.

On a GPU machine install requirements-gpu.txt first (`make bench-gpu` does): bitsandbytes,
for model.quantize = "nf4" and train.optimizer = "adamw8bit".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import REPO, workspace, write_images

from core.runs.memory import GIB, host_peak, memory_phases  # noqa: E402  (common put the repo on sys.path)

PHASES = ("loaded", "cached", "first_step", "eval", "validation", "checkpoint", "peak")
IMAGES = 8
VALIDATION_STEPS = 4  # memory does not grow with steps; time does
STOP_GRACE_S = 150  # after a timeout: Ctrl-C to the app, which stops its run and saves
CARD_CAP = {24: 23.5, 16: 15.5}  # GiB the allocator may hold on a 24 or 16 GB card (less context)


@dataclass(frozen=True)
class Case:
    family: str
    preset: str
    resolution: int | None  # None: the preset's
    batch: int
    goal_gib: float | None  # None: reported only
    quantized: bool = False  # the preset quantizes its base: --quantize picks the scheme
    name: str = ""  # the case's name when not the family's (the card presets)
    path: str = ""  # model.path when not random:<family> (random:wan:14b)
    extra: tuple[str, ...] = ()  # more --set items (the same preset without swapping)
    cap_gib: float | None = None  # the allocator held to this (DT_GPU_MEMORY_CAP_GIB): the card
    data: str = ""  # another case's images (and so its caches) when not its own

    @property
    def key(self) -> str:
        return self.name or self.family


CASES = {
    "sd15": Case("sd15", "sd15-lora", 512, 4, 8.0),
    "sdxl": Case("sdxl", "sdxl-lora", 1024, 1, 14.0),
    "sd3": Case("sd3", "sd3-lora", None, 1, None),
    "flux": Case("flux", "flux-lora", 512, 1, 20.0, quantized=True),
    "flux2": Case("flux2", "flux2-lora", None, 1, 23.0),
    "chroma": Case("chroma", "chroma-lora", None, 1, 23.0),
    "z_image": Case("z_image", "z-image-lora", None, 1, 23.0),
    "qwen_image": Case("qwen_image", "qwen-image-lora", None, 1, 23.0, quantized=True),
    # model.blocks_to_swap (docs/memory.md): the card presets at their settings under an
    # allocator cap of their card less the CUDA context (CARD_CAP), goal their card less
    # 1 GiB; the same without swapping and uncapped, for the s/step ratio.
    "qwen_image_24gb": Case("qwen_image", "qwen-image-lora-24gb", None, 1, 23.0,
                            name="qwen_image_24gb", cap_gib=CARD_CAP[24]),
    "qwen_image_noswap": Case("qwen_image", "qwen-image-lora-24gb", None, 1, None,
                              name="qwen_image_noswap", extra=("model.blocks_to_swap=0",),
                              data="qwen_image_24gb"),
    "qwen_image_16gb": Case("qwen_image", "qwen-image-lora-16gb", None, 1, 15.0,
                            name="qwen_image_16gb", cap_gib=CARD_CAP[16]),
    "wan14b_24gb": Case("wan", "wan21-14b-lora-24gb", None, 1, 23.0, name="wan14b_24gb",
                        path="random:wan:14b", cap_gib=CARD_CAP[24]),
    "wan14b_16gb": Case("wan", "wan21-14b-lora-16gb", None, 1, 15.0, name="wan14b_16gb",
                        path="random:wan:14b", cap_gib=CARD_CAP[16]),
    "wan22_a14b_24gb": Case("wan", "wan22-a14b-lora-24gb", None, 1, 23.0,
                            name="wan22_a14b_24gb", path="random:wan:a14b",
                            cap_gib=CARD_CAP[24]),
    "flux2_dev_24gb": Case("flux2", "flux2-dev-lora-24gb", None, 1, 23.0,
                           name="flux2_dev_24gb", path="random:flux2:dev",
                           cap_gib=CARD_CAP[24]),
}


def overrides(case: Case, steps: int, quantize: str) -> list[str]:
    """The --set items for this case (the preset keeps everything else)."""
    items = [f"model.path={case.path or 'random:' + case.family}", f"train.max_steps={steps}",
             f"train.batch_size={case.batch}", f"validation.steps={VALIDATION_STEPS}",
             f"validation.every={steps}", f"train.eval_every={steps}",
             f"train.checkpoint_every={steps + 1}", "train.lr_warmup_steps=0",
             f"datasets.0.images=data/{case.data or case.key}",
             f"output.dir=runs/gpu-memory-{case.key}", *case.extra]
    if case.resolution:  # validation at the training resolution, as a user would
        items += [f"datasets.0.resolution={case.resolution}",
                  f"validation.resolution={case.resolution}"]
    if case.quantized:
        items.append(f"model.quantize={quantize}")
    return items


def estimate(cfg: Any, ws: Path) -> dict[str, Any]:
    """The check's estimate: total and activation part in GiB, or why there is none."""
    from core.cache.status import caches_complete
    from core.config import resolved
    from core.memory.estimate import estimate_memory

    try:
        full = resolved(cfg, ws)
        est = estimate_memory(full, ws, caches_built=caches_complete(full, ws))
    except Exception as exc:  # an estimate that fails is a figure missing, not a crash
        return {"error": f"{type(exc).__name__}: {exc}"}
    if est is None:
        return {"error": "no estimate (the model's configs could not be read)"}
    act = sum(p.bytes for p in est.parts if p.name == "activations")
    return {"total_gib": est.total_bytes / GIB, "activations_gib": act / GIB,
            "caching_gib": est.caching_bytes / GIB if est.caching else None,
            "validation_gib": est.validation_bytes / GIB if est.validation else None,
            "parts": {p.name: p.bytes for p in est.parts},
            "caching_parts": {p.name: p.bytes for p in est.caching}}


def child_env(cap_gib: float | None = None) -> dict[str, str]:
    """This environment (PYTHONPATH included: the GPU machine finds its wheels there), with
    the repository first on the path, and the card's allocator cap when the case has one."""
    from core.models.modules import GPU_MEMORY_CAP_ENV

    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "DT_MEMORY_TRACE": "1"}
    if cap_gib is not None:
        env[GPU_MEMORY_CAP_ENV] = str(cap_gib)
    return env


def run_app(argv: list[str], log_path: Path, timeout: float,
            cap_gib: float | None = None) -> int | str:
    """app.py's exit code, or "timed out" (it was stopped through Ctrl-C, then killed)."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, str(REPO / "app.py"), *argv], cwd=REPO,
                                env=child_env(cap_gib), stdout=log, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # the app stops its trainer's process group
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return "timed out"


def seconds_per_step(events: list[dict[str, Any]]) -> float | None:
    """The trainer's own figure, 1 / it_s of the last step event: the median of its
    recent step times, rounds (eval, validation, checkpoints) left out. On a GPU the
    step events come in bursts of train.log_every, so their intervals time no step;
    steady-state figures against diffusers' examples come from bench/peers.py."""
    rates = [e.get("it_s") for e in events if e.get("type") == "step"]
    rates = [r for r in rates if isinstance(r, (int, float)) and r > 0]
    return 1.0 / rates[-1] if rates else None


def measured(events: list[dict[str, Any]]) -> dict[str, float | None]:
    """GiB per phase: the most held during it (at "peak": during the whole launch)."""
    phases = memory_phases(events)
    out: dict[str, float | None] = {}
    for phase in PHASES:
        event = phases.get(phase, {})
        key = "device_bytes" if phase == "peak" else "device_peak_bytes"
        value = event.get(key)
        out[phase] = value / GIB if isinstance(value, (int, float)) else None
    return out


def host_gib(events: list[dict[str, Any]]) -> float | None:
    """The trainer's peak resident host memory, GiB (core.runs.memory.host_peak)."""
    peak = host_peak(memory_phases(events))
    return None if peak is None else peak / GIB


def run_case(case: Case, items: list[str], ws: Path, timeout: float) -> dict[str, Any]:
    import shutil

    from core.runs.folder import RunFolder
    from core.runs.tail import EventTail, last_lines

    run_dir = ws / "runs" / f"gpu-memory-{case.key}"
    shutil.rmtree(run_dir, ignore_errors=True)  # this bench's own folder from a past run
    log_path = ws / f"gpu-memory-{case.key}.log"
    argv = ["--no-ui", "--preset", case.preset, "--workspace", str(ws)]
    for item in items:
        argv += ["--set", item]
    start = time.monotonic()
    code = run_app(argv, log_path, timeout, case.cap_gib)
    events = EventTail(RunFolder(run_dir).events).read()
    result = {"exit": code, "wall_s": round(time.monotonic() - start, 1),
              "measured_gib": measured(events), "s_per_step": seconds_per_step(events),
              "host_rss_gib": host_gib(events), "cap_gib": case.cap_gib}
    if code != 0 or result["measured_gib"]["peak"] is None:
        why = f"exit {code}" if code != 0 else "no memory events with device figures"
        result["error"] = why
        print(f"!! {case.key}: the run failed ({why}); the end of {log_path}:", flush=True)
        for line in last_lines(log_path, n=40):
            print(f"   | {line}", flush=True)
    return result


def gpu_line() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:  # requirements-gpu.txt: nf4 and adamw8bit need it
        bnb = f"bitsandbytes {version('bitsandbytes')}"
    except PackageNotFoundError:
        bnb = "no bitsandbytes (pip install -r requirements-gpu.txt)"
    props = torch.cuda.get_device_properties(0)
    return f"{props.name}, {props.total_memory / GIB:.1f} GiB; torch {torch.__version__}; {bnb}"


def verdict(case: Case, row: dict[str, Any]) -> str:
    peak = row.get("measured_gib", {}).get("peak")
    if case.goal_gib is None:
        return "report only"
    if peak is None:
        return f"<= {case.goal_gib:g} GiB: not measured"
    return f"<= {case.goal_gib:g} GiB: {'MET' if peak <= case.goal_gib else 'MISSED'}"


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'family':<6} {'settings':<30} {'loaded':>7} {'cached':>7} {'1st stp':>7} "
            f"{'eval':>7} {'valid.':>7} {'ckpt':>7} {'peak':>7} {'est.':>7} {'est.act':>7} "
            f"{'est.cch':>7} {'est.val':>7} {'s/step':>7}  goal")
    print("\n" + head + "\n" + "-" * (len(head) + 14))
    for row in rows:
        s, m, e = row["settings"], row.get("measured_gib", {}), row["estimate"]
        text = (f"{s['resolution']}px b{s['batch']} {s['mixed_precision']} q={s['quantize']}"
                f"{' gc' if s['gradient_checkpointing'] else ''}") if s else "?"
        cells = [fmt(m.get(p)) for p in PHASES]
        print(f"{row['family']:<6} {text:<30} " + " ".join(f"{c:>7}" for c in cells)
              + f" {fmt(e.get('total_gib')):>7} {fmt(e.get('activations_gib')):>7} "
              f"{fmt(e.get('caching_gib')):>7} {fmt(e.get('validation_gib')):>7} "
              f"{fmt(row.get('s_per_step'), '.3f'):>7}  "
              f"{row['goal']}")
    print("GiB of allocated tensors (torch.cuda.memory_allocated); per phase the most held "
          "during it, peak over the whole run; est. = the check's estimate, est.act its "
          "activation part, est.cch and est.val its caching and validation phases (the "
          "CUDA context included in each)")
    for row in rows:
        for why in filter(None, [row.get("error"), row["estimate"].get("error")]):
            print(f"  {row['family']}: {why}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(CASES),
                        help=f"comma-separated, from {', '.join(CASES)}")
    parser.add_argument("--steps", type=int, default=10, help="training steps per run")
    parser.add_argument("--quantize", choices=("int8", "fp8", "none"), default="int8",
                        help="model.quantize for the presets that quantize (flux, qwen_image; "
                             "the goals are set for int8 or fp8)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table as JSON")
    parser.add_argument("--estimate-only", action="store_true",
                        help="no training: the estimates only (runs without a GPU)")
    parser.add_argument("--timeout", type=float, default=1800, help="per run, seconds")
    parser.add_argument("--workspace", type=Path, default=None, help="default: a temp dir")
    parser.add_argument("--keep", action="store_true", help="keep the temp workspace")
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(CASES))
    if unknown:
        parser.error(f"unknown famil(ies) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    gpu = None if args.estimate_only else gpu_line()
    if not args.estimate_only and gpu is None:
        print("no CUDA GPU here: measured figures need one; printing the estimates only")
    print(f"GPU: {gpu or 'none'}; python {sys.version.split()[0]}; {args.steps} steps per run")
    with workspace(args.workspace, "bench-gpu-memory-", keep=args.keep) as ws:
        rows = [bench_family(CASES[f], args, ws, gpu is not None) for f in families]
    print_table(rows)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"gpu": gpu, "steps": args.steps, "rows": rows},
                                       indent=2), encoding="utf-8")
        print(f"wrote {args.out}")
    return 1 if any(r.get("error") for r in rows) else 0


def bench_family(case: Case, args: argparse.Namespace, ws: Path, measure: bool
                 ) -> dict[str, Any]:
    """One family's row; a failure is reported in it and the next family still runs."""
    from core import ops

    items = overrides(case, args.steps, args.quantize)
    row: dict[str, Any] = {"family": case.key, "preset": case.preset, "settings": {},
                           "estimate": {}, "goal_gib": case.goal_gib}
    try:
        cfg = ops.load_run_config(None, case.preset, items)
        write_images(ws / cfg.datasets[0].images, IMAGES, cfg.datasets[0].resolution)
    except Exception as exc:
        row.update(error=f"{type(exc).__name__}: {exc}", goal=verdict(case, row))
        print(f"!! {case.key}: {row['error']}", flush=True)
        return row
    t = cfg.train
    row["settings"] = {"resolution": cfg.datasets[0].resolution, "batch": t.batch_size,
                       "quantize": cfg.model.quantize, "mixed_precision": t.mixed_precision,
                       "gradient_checkpointing": t.gradient_checkpointing}
    row["estimate"] = estimate(cfg, ws)
    if measure:
        print(f"== {case.key}: python app.py --no-ui --preset {case.preset} "
              + " ".join(f"--set {i}" for i in items), flush=True)
        row.update(run_case(case, items, ws, args.timeout))
        print(f"   {case.key}: {json.dumps(row['measured_gib'])}, "
              f"{fmt(row['s_per_step'], '.3f')} s/step, host RSS {fmt(row['host_rss_gib'])} GiB, "
              f"cap {row['cap_gib'] or 'none'}, {row['wall_s']} s", flush=True)
    peak = row.get("measured_gib", {}).get("peak")
    row["met"] = None if case.goal_gib is None or peak is None else peak <= case.goal_gib
    row["goal"] = verdict(case, row)
    return row


if __name__ == "__main__":
    sys.exit(main())
