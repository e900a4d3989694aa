"""Benchmark: this tool's trainer against diffusers' own LoRA trainers, side by side.

    python bench/peers.py [--families sd15,flux] [--models tiny|random] [--steps 25]
                          [--warmup 5] [--resolution 64] [--batch 1] [--rank 8]
                          [--precision no|bf16|fp16] [--gradient-checkpointing]
                          [--compile off,blocks] [--peers-python PY] [--timeout 600]
                          [--out results.json] [--workspace DIR] [--omp-passive]

Per family, one after the other on this machine: the diffusers example that trains that
family (../shared/peers/diffusers-examples/, unchanged; PEERS below) and this tool's
trainer (`python -m core.train.main`, once per --compile value), on the same model
folder (`tiny:<family>` materialized, or `random:<family>` written as a diffusers
folder), the same generated images, and matched settings: resolution, batch, LoRA rank
and alpha, LoRA targets (both use the attention projections diffusers' examples target),
learning rate and constant schedule, precision, gradient checkpointing, steps, seed; no
validation, eval or checkpoint inside the timed steps.

Both run under bench/steptimer.py, one clock on their optimizer steps, and the table has
for each: steady-state steps/s (steps WARMUP+1..STEPS), peak memory (CUDA allocated and
reserved, or the process's peak RSS on the CPU) and wall time from launch to the first
step, with this tool's ratios to the example. What differs by design: this tool encodes
latents and captions once into its caches (the first run of a family builds them, inside
its time to the first step; later runs reuse them), the dreambooth examples with
--cache_latents do the same in memory, and the text-to-image examples (sd15, sdxl)
encode every batch's images with the VAE at every step.

The examples need torchvision and `datasets`, which this tool does not: they come from a
venv of the benchmark's own, bench/.peers-venv (created on first use: this tool's venv's
packages plus PEER_PACKAGES from the registry), or from --peers-python.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from common import REPO, load_line, median, parse_run_options, workspace, write_images
from step import run_trainer

# A GPU machine gets no ../shared: bench/gpu_session.sh carries a copy and names it here.
PEERS_DIR = Path(os.environ.get("PEERS_DIR")
                 or REPO.parent / "shared" / "peers" / "diffusers-examples")
VENV = REPO / "bench" / ".peers-venv"
# The torchvision release made for requirements.txt's torch (2.13), and a datasets the
# examples' imagefolder loading works with.
PEER_PACKAGES = ("torchvision==0.28.0", "datasets==5.2.0")
PROMPT = "a shape"
IMAGES = 8
LEARNING_RATE = 1e-4
WEIGHT_DECAY = 1e-2
SEED = 42


@dataclasses.dataclass(frozen=True)
class Peer:
    script: str
    dreambooth: bool  # --instance_data_dir and one prompt, else --train_data_dir + metadata
    extra: tuple[str, ...] = ()


PEERS = {
    "sd15": Peer("train_text_to_image_lora.py", False),
    "sdxl": Peer("train_text_to_image_lora_sdxl.py", False),
    "sd3": Peer("train_dreambooth_lora_sd3.py", True, ("--cache_latents",)),
    "flux": Peer("train_dreambooth_lora_flux.py", True, ("--cache_latents",)),
    "flux2": Peer("train_dreambooth_lora_flux2_klein.py", True, ("--cache_latents",)),
    "qwen_image": Peer("train_dreambooth_lora_qwen_image.py", True, ("--cache_latents",)),
    "z_image": Peer("train_dreambooth_lora_z_image.py", True, ("--cache_latents",)),
    "krea2": Peer("train_dreambooth_lora_krea2.py", True, ("--cache_latents",)),
    "ideogram4": Peer("train_dreambooth_lora_ideogram4.py", True, ("--cache_latents",)),
}


# ---------------------------------------------------------------- the examples' venv


def peers_python(given: str | None) -> str:
    """--peers-python, or bench/.peers-venv's python (created on first use): a venv that
    sees this tool's venv's packages (a .pth file) and adds PEER_PACKAGES. torchvision
    comes without its dependencies, so torch stays the tool's."""
    if given:
        return given
    python = VENV / "bin" / "python"
    marker = VENV / "peer-packages.txt"
    if python.exists() and marker.exists() and marker.read_text() == "\n".join(PEER_PACKAGES):
        return str(python)
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "zz-tool-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", PEER_PACKAGES[0]], check=True)
    subprocess.run([*pip, *PEER_PACKAGES[1:]], check=True)
    marker.write_text("\n".join(PEER_PACKAGES))
    return str(python)


# ---------------------------------------------------------------- model and images


def model_folder(family: str, models: str, ws: Path, precision: str) -> Path:
    """The diffusers folder both trainers load: tiny:<family>, or random:<family> saved
    (in the run's precision) through the family's pipeline."""
    if models == "tiny":
        from core.models.tiny import materialize_tiny

        return materialize_tiny(family, ws)
    folder = ws / "models" / f"random-{family}-{precision}"
    if not (folder / "model_index.json").exists():
        from core.models.full_size.build import build_random
        from core.models.registry import get_family

        started = time.perf_counter()
        components = build_random(family, dtype=precision)
        get_family(family).validation_pipeline(components).save_pretrained(
            str(folder), safe_serialization=True)
        print(f"random:{family} written to {folder} in {time.perf_counter() - started:.0f} s")
    return folder


def image_folders(ws: Path, resolution: int) -> dict[str, Path]:
    """The same PNGs three ways: with .txt captions (this tool), with a metadata.jsonl
    (text-to-image examples, datasets' imagefolder) and alone (dreambooth examples,
    which open every file in their folder as an image)."""
    root = ws / f"images-{resolution}"
    folders = {kind: root / kind for kind in ("tool", "meta", "plain")}
    if (root / "done").exists():
        return folders
    paths = write_images(folders["tool"], IMAGES, resolution)
    for kind in ("meta", "plain"):
        folders[kind].mkdir(parents=True, exist_ok=True)
        for path in paths:
            shutil.copy(path, folders[kind] / path.name)
    lines = [json.dumps({"file_name": p.name, "text": p.with_suffix(".txt").read_text()})
             for p in paths]
    (folders["meta"] / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    (root / "done").touch()
    return folders


# ---------------------------------------------------------------- the two trainers


def peer_command(family: str, model: Path, images: dict[str, Path], out: Path,
                 args: argparse.Namespace) -> list[str]:
    from core.models.registry import get_family

    peer = PEERS[family]
    command = [
        str(PEERS_DIR / peer.script), "--pretrained_model_name_or_path", str(model),
        "--output_dir", str(out), "--resolution", str(args.resolution),
        "--train_batch_size", str(args.batch), "--max_train_steps", str(args.steps),
        "--checkpointing_steps", str(args.steps + 1), "--rank", str(args.rank),
        "--learning_rate", str(LEARNING_RATE), "--lr_scheduler", "constant",
        "--lr_warmup_steps", "0", "--adam_weight_decay", str(WEIGHT_DECAY),
        "--mixed_precision", args.precision, "--seed", str(SEED),
        "--dataloader_num_workers", "0", "--report_to", "tensorboard", *peer.extra]
    if args.gradient_checkpointing:
        command.append("--gradient_checkpointing")
    if not peer.dreambooth:  # their LoRA alpha is the rank, as this tool's default
        return [*command, "--train_data_dir", str(images["meta"]), "--caption_column", "text"]
    fam = get_family(family)
    # Options only some of the dreambooth scripts have (SD3's alpha is always its rank).
    optional = {"--lora_alpha": str(args.rank),
                "--max_sequence_length": str(fam.max_sequence_length),
                "--lora_layers": ",".join(fam.lora_target_modules("attention"))}
    source = (PEERS_DIR / peer.script).read_text(encoding="utf-8")
    for flag, value in optional.items():
        if f'"{flag}"' in source:
            command += [flag, value]
    return [*command, "--instance_data_dir", str(images["plain"]), "--instance_prompt",
            PROMPT]


def tool_config(family: str, model: Path, images: dict[str, Path], ws: Path,
                args: argparse.Namespace, compile_mode: str) -> Any:
    from common import demo_like_config

    cfg = demo_like_config(ws / family, images["tool"], args.resolution, args.batch,
                           args.steps)
    cfg.model.family, cfg.model.path = family, str(model)
    t = cfg.train
    t.lora_rank, t.learning_rate, t.lr_warmup_steps = args.rank, LEARNING_RATE, 0
    t.weight_decay, t.seed, t.mixed_precision = WEIGHT_DECAY, SEED, args.precision
    t.gradient_checkpointing, t.compile = args.gradient_checkpointing, compile_mode
    cfg.validation.prompts = []
    return cfg


def timer(out: Path, args: argparse.Namespace) -> list[str]:
    return [str(REPO / "bench" / "steptimer.py"), str(out), str(args.steps),
            str(args.warmup), "--"]


def child_env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}


def run_peer(family: str, model: Path, images: dict[str, Path], ws: Path, python: str,
             args: argparse.Namespace) -> dict[str, Any]:
    out = ws / "peers" / family
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    stamps = out / "steps.json"
    command = [python, *timer(stamps, args),
               *peer_command(family, model, images, out / "lora", args)]
    launched = time.time()
    with open(out / "train.log", "wb") as log:
        proc = subprocess.run(command, cwd=out, env=child_env(), stdout=log,
                              stderr=subprocess.STDOUT, timeout=args.timeout, check=False)
    if not stamps.exists():
        tail = (out / "train.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"{PEERS[family].script} ended {proc.returncode} before step "
                         f"{args.steps}; the end of {out}/train.log:\n{tail}")
    return figures(stamps, launched, args.warmup, f"diffusers {PEERS[family].script}")


def run_tool(family: str, model: Path, images: dict[str, Path], ws: Path,
             args: argparse.Namespace, compile_mode: str) -> dict[str, Any]:
    cfg = tool_config(family, model, images, ws, args, compile_mode)
    run_ws = ws / "tool" / f"{family}-{compile_mode}"
    stamps = run_ws / "steps.json"
    stamps.unlink(missing_ok=True)
    run_ws.mkdir(parents=True, exist_ok=True)
    result = run_trainer("direct", cfg, run_ws, args.timeout, args.warmup,
                         wrapper=timer(stamps, args))
    return figures(stamps, result["launched"], args.warmup,
                   f"this tool, train.compile={compile_mode}")


def figures(stamps_file: Path, launched: float, warmup: int, name: str) -> dict[str, Any]:
    data = json.loads(stamps_file.read_text(encoding="utf-8"))
    stamps = data["stamps"]
    steady = (len(stamps) - warmup) / (stamps[-1] - stamps[warmup - 1])
    # The median step too: on a shared machine a few steps stall behind other work and
    # pull the mean down on one side only; on a GPU the two agree.
    steps = [b - a for a, b in zip(stamps[warmup - 1:], stamps[warmup:], strict=False)]
    return {"trainer": name, "steps_per_s": steady, "median_steps_per_s": 1 / median(steps),
            "first_step_s": stamps[0] - launched,
            **{k: data[k] for k in ("device_allocated", "device_reserved", "host_rss")}}


# ---------------------------------------------------------------- the table


def memory_of(row: dict[str, Any]) -> float | None:
    return row["device_allocated"] if row["device_allocated"] is not None else row["host_rss"]


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 1024 ** 3:.2f}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'family':<11}{'trainer':<48}{'steps/s':>8}{'median':>8}{'alloc':>7}"
          f"{'reserv.':>8}{'RSS':>6}{'1st step':>9}{'x steps/s':>10}{'x median':>9}"
          f"{'x memory':>9}")
    peer: dict[str, Any] = {}
    for row in rows:
        if row["trainer"].startswith("diffusers"):
            peer = row
        elif peer.get("family") != row["family"]:
            peer = {}
        speed, typical = (row[k] / peer[k] if peer else float("nan")
                          for k in ("steps_per_s", "median_steps_per_s"))
        mine, theirs = memory_of(row), (memory_of(peer) if peer else None)
        memory = f"{mine / theirs:.2f}" if mine and theirs else "-"
        print(f"{row['family']:<11}{row['trainer'][:47]:<48}{row['steps_per_s']:>8.3f}"
              f"{row['median_steps_per_s']:>8.3f}{gib(row['device_allocated']):>7}"
              f"{gib(row['device_reserved']):>8}{gib(row['host_rss']):>6}"
              f"{row['first_step_s']:>8.1f}s{speed:>10.2f}{typical:>9.2f}{memory:>9}")
    print("steps/s: steady state (steps over their time); median: 1 / the median step; "
          "alloc/reserv.: peak CUDA memory, GiB; RSS: the process's peak resident memory "
          "(CPU runs), GiB; x: this tool / the diffusers example")


def bench_family(family: str, ws: Path, python: str, args: argparse.Namespace) -> list[dict]:
    model = model_folder(family, args.models, ws, args.precision)
    images = image_folders(ws, args.resolution)
    rows = []
    try:
        rows.append(run_peer(family, model, images, ws, python, args))
        print(f"{family}: {rows[-1]['trainer']}: {rows[-1]['steps_per_s']:.3f} steps/s  "
              f"[{load_line()}]", flush=True)
    except SystemExit as failed:  # still time this tool: its own figures stand alone
        print(f"{family}: the diffusers example failed, no ratios: {failed}", flush=True)
    for mode in args.compile.split(","):
        if mode == "blocks" and not family_has_blocks(family):
            print(f"{family}: train.compile=blocks skipped: the family declares no "
                  "repeated blocks (a UNet)")
            continue
        rows.append(run_tool(family, model, images, ws, args, mode))
        print(f"{family}: {rows[-1]['trainer']}: {rows[-1]['steps_per_s']:.3f} steps/s  "
              f"[{load_line()}]", flush=True)
    return [{"family": family, **row} for row in rows]


def family_has_blocks(family: str) -> bool:
    from core.models.registry import family_or_defaults

    return bool(family_or_defaults(family).block_lists)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="sd15,flux",
                        help=f"from {', '.join(PEERS)}")
    parser.add_argument("--models", choices=("tiny", "random"), default="tiny")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of steps/s")
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--precision", choices=("no", "fp16", "bf16"), default="no")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--compile", default="off",
                        help="this tool's train.compile values to run, comma-separated")
    parser.add_argument("--peers-python", default=None,
                        help="a python with torchvision and datasets (default: "
                             "bench/.peers-venv, created on first use)")
    parser.add_argument("--out", type=Path, default=None, help="the rows as JSON")
    args = parse_run_options(parser, argv, "per run, seconds")
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(PEERS))
    if unknown or args.warmup < 1 or args.steps <= args.warmup:
        parser.error(f"families from {', '.join(PEERS)}; 1 <= --warmup < --steps")
    python = peers_python(args.peers_python)
    print(load_line())
    rows: list[dict[str, Any]] = []
    with workspace(args.workspace, "bench-peers-") as ws:
        for family in families:
            rows += bench_family(family, ws, python, args)
    print(f"\n{args.models} models, {args.resolution} px, batch {args.batch}, rank "
          f"{args.rank}, precision {args.precision}, gradient checkpointing "
          f"{'on' if args.gradient_checkpointing else 'off'}, {args.steps} steps "
          f"(steps/s over steps {args.warmup + 1}..{args.steps})")
    print_table(rows)
    print(load_line())
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
