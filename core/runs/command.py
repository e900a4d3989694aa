"""Build the `accelerate launch` command that runs the trainer, as an argument list.

The command is always a list (never a shell string) so paths with spaces or quotes
cannot break it; `format_command` renders it with `shlex` for command.txt and the UI's
copy button. Facts behind the flags (checked with accelerate 1.15 on CPU):

- `--num_processes` is the total over all machines; the config's `launch.num_processes`
  is per machine, so the two are multiplied.
- CPU with several processes needs `--multi_gpu` *and* ACCELERATE_USE_CPU=1 (MULTI_CPU
  with gloo); without the variable each process silently thinks it is alone, and
  `--cpu --num_processes 2` starts only one process. One CPU process uses `--cpu`.
- `--module` runs `python -m core.train.main`, so the trainer is found by import (the
  project root goes on PYTHONPATH) rather than by a file path.
- `--quiet` drops the launcher's own CalledProcessError traceback when the trainer exits
  non-zero (the trainer's traceback is in train.log already).
- launch.distributed = "fsdp" swaps `--multi_gpu` for `--use_fsdp` and FSDP2's flags;
  on the CPU ACCELERATE_USE_CPU=1 still gives gloo (accelerate then leaves the state
  MULTI_CPU, and the trainer turns FSDP on itself: core/train/sharding.py).
- Several machines: each machine's launcher meets the others in torch's static rendezvous
  at main_process_ip:main_process_port. Without a timeout it waits there silently (600 s
  by default, then a traceback); `--rdzv_conf timeout=S` makes every launcher give up
  after launch.join_timeout_minutes, and the spec carries the lines that say so.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from core.config import Config
from core.runs.folder import RunFolder

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TRAINER_MODULE = "core.train.main"
# accelerate's launcher, started through core/runs/accelerate_launch.py (a faster start
# and end, the same launcher): `python -m accelerate.commands.launch` takes the same flags.
ACCELERATE_LAUNCH = "core.runs.accelerate_launch"


@dataclass(frozen=True)
class LaunchSpec:
    """What to run: the argument list, environment additions and working folder.

    `workspace` lets `start_run` record the run in `<workspace>/.runs/`; None skips that.
    `notes` go into the log before the child starts (a multi-machine launch says whom it
    waits for); `join` is set for a multi-machine launch.
    """

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = PROJECT_ROOT
    workspace: Path | None = None
    notes: tuple[str, ...] = ()
    join: Join | None = None


@dataclass(frozen=True)
class Join:
    """A multi-machine launch: how long its launcher waits for the others, and what to
    say when it gave up."""

    timeout_s: float
    failure: str


def _minutes(n: int) -> str:
    return f"{n} minute" + ("" if n == 1 else "s")


def join_texts(cfg: Config) -> tuple[str, Join]:
    """The log line saying whom this machine waits for, and the Join it fails with."""
    launch = cfg.launch
    where = f"{launch.main_process_ip}:{launch.main_process_port}"
    others = launch.num_machines - 1
    within = (f"within {_minutes(launch.join_timeout_minutes)} "
              "(launch.join_timeout_minutes)")
    if launch.machine_rank == 0:
        note = (f"waiting for {others} other machine{'s' if others > 1 else ''} to join at "
                f"{where} ({launch.num_machines} machines in all; this is machine 0); "
                f"giving up if they do not join {within}")
        failure = (f"the other machines did not join {within}: machine 0 waited for "
                   f"{others} more at {where}. Start every other machine with the same "
                   "config and --set launch.machine_rank=N (1, 2, ...), and check that "
                   "launch.main_process_ip and launch.main_process_port reach this machine")
    else:
        note = (f"joining machine 0 at {where} ({launch.num_machines} machines in all; this "
                f"is machine {launch.machine_rank}); giving up if the run does not start "
                f"{within}")
        failure = (f"machine {launch.machine_rank} could not join the run at {where} "
                   f"{within}. Start machine 0 (launch.machine_rank=0) and every other "
                   "machine with the same config, and check that launch.main_process_ip "
                   "and launch.main_process_port point at machine 0")
    return note, Join(timeout_s=launch.join_timeout_minutes * 60.0, failure=failure)


def _threads_per_process(cfg: Config) -> int:
    """This machine's cores, shared by its processes, unless OMP_NUM_THREADS says.

    Without the flag accelerate pins OMP_NUM_THREADS=1 whenever it finds no GPU, which
    slows CPU work (the demo, caching, data loading) on every core but one. Machines that
    meet at a loopback address all run on this box (a test, a rehearsal): they share its
    cores, or their OpenMP threads outnumber the cores and every step waits on threads
    that are not running (measured on 2 cores: 2.9 s a step instead of 0.07).

    An OMP_NUM_THREADS already set (a shared box, a batch job's allocation, test
    workers side by side) is kept: the flag would otherwise override it, and threads
    spinning beside other busy processes burn the cores (measured: the test suite's
    trainers ran at 1 step/s instead of 15, on 6 times the CPU time).
    """
    asked = _omp_threads_set()
    if asked:
        return asked
    launch = cfg.launch
    processes = launch.num_processes
    if launch.num_machines > 1 and _is_loopback(launch.main_process_ip):
        processes *= launch.num_machines
    return max(1, (os.cpu_count() or 1) // processes)


def _omp_threads_set() -> int | None:
    """OMP_NUM_THREADS from this environment when it is a positive whole number."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _fsdp_flags() -> list[str]:
    """launch.distributed = "fsdp": accelerate's FSDP2 plugin in place of --multi_gpu
    (the two exclude each other). Each wrap unit is a block the denoiser names in its
    `_no_split_modules` (transformer_based_wrap without class names reads them; the
    size-based policy would shard bare ModuleLists, which fully_shard refuses). The
    trainer builds the same plugin (core/train/sharding.py), so these flags show in
    command.txt what the run does."""
    return ["--use_fsdp", "--fsdp_version", "2",
            "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
            "--fsdp_state_dict_type", "FULL_STATE_DICT",
            "--fsdp_reshard_after_forward", "true",
            "--fsdp_cpu_ram_efficient_loading", "false"]


def _launch_flags(cfg: Config) -> tuple[list[str], dict[str, str]]:
    launch = cfg.launch
    total = launch.num_processes * launch.num_machines
    flags = [
        "--num_processes", str(total),
        "--num_machines", str(launch.num_machines),
        "--mixed_precision", cfg.train.mixed_precision,
        "--dynamo_backend", "no",
    ]
    env: dict[str, str] = {}
    several = _fsdp_flags() if launch.distributed == "fsdp" else ["--multi_gpu"]
    if launch.cpu:
        if total > 1:
            flags += several
            env["ACCELERATE_USE_CPU"] = "1"
        else:
            flags.append("--cpu")
    elif total > 1:
        flags += several
    flags += ["--num_cpu_threads_per_process", str(_threads_per_process(cfg))]
    if launch.num_machines > 1:
        flags += [
            "--machine_rank", str(launch.machine_rank),
            "--main_process_ip", launch.main_process_ip,
            "--main_process_port", str(launch.main_process_port),
            # the static rendezvous's wait for the other machines (600 s by default)
            "--rdzv_conf", f"timeout={launch.join_timeout_minutes * 60}",
        ]
    elif total > 1:
        # Single machine: accelerate falls back to a free port when this one is taken.
        flags += ["--main_process_port", str(launch.main_process_port)]
    return flags, env


def build_accelerate_command(
    cfg: Config,
    run_dir: Path,
    workspace: Path,
    *,
    resume: str | None,
    python: str = sys.executable,
    script: list[str] | None = None,
    config: Path | None = None,
) -> LaunchSpec:
    """The launch spec for training `cfg` into `run_dir` (its config.toml is read, or
    `config`: machine N > 0 of a multi-machine run reads its own).

    `resume` is passed on as `--resume` ("latest" or a checkpoint path). `script`
    replaces `--module core.train.main` with a program and its own leading arguments
    (the cache builder; tests run a stand-in trainer this way).
    """
    flags, env = _launch_flags(cfg)
    target = list(script) if script else ["--module", TRAINER_MODULE]
    trainer_args = [
        "--config", str(config or RunFolder(Path(run_dir)).config),
        "--workspace", str(workspace),
    ]
    if resume:
        trainer_args += ["--resume", resume]
    argv = [python, "-m", ACCELERATE_LAUNCH, *flags, "--quiet", *target,
            *trainer_args]
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    notes: tuple[str, ...] = ()
    join = None
    if cfg.launch.num_machines > 1:
        note, join = join_texts(cfg)
        notes = (note,)
    return LaunchSpec(argv=argv, env=env, cwd=PROJECT_ROOT, workspace=Path(workspace),
                      notes=notes, join=join)


def format_command(spec: LaunchSpec) -> str:
    """A copyable shell line: `VAR=value ... python -m core.runs.accelerate_launch ...`.

    The trainer is found through the absolute PYTHONPATH, so it runs from any folder.
    """
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())]
    return " ".join([*env, shlex.join(spec.argv)])
