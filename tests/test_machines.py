"""Several machines, simulated on one box: every machine is its own `python app.py --no-ui`
(its own run manager and `accelerate launch`), with launch.num_machines = 2, its own
launch.machine_rank, main_process_ip = 127.0.0.1 and a free port, CPU (gloo), one
process each, one workspace (the shared filesystem)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, free_port, small_config

from core.config import Config, save_config
from core.headless import FOLLOW_GRACE_S
from core.runs.folder import RunFolder
from core.runs.manager import attach, request_stop, stop_run
from core.runs.status import read_status

pytestmark = pytest.mark.slow

MAX_STEPS = 20
# Runs `python <args>` with SIGINT back at its default, so Python installs its Ctrl-C
# handler (it does not when SIGINT is ignored at start).
DEFAULT_SIGINT_EXEC = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                       "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def two_machine_config(tmp: Path) -> Config:
    """Two datasets with different repeats and probabilities: 15 steps an epoch."""
    cfg = small_config(tmp, datasets=2, images=6)
    cfg.datasets[0].repeats = 4
    cfg.datasets[1].probability = 0.5
    cfg.train.batch_size = 1
    cfg.train.max_steps = MAX_STEPS
    cfg.train.checkpoint_every = 5
    cfg.train.keep_checkpoints = 5
    cfg.train.eval_every = 1000
    cfg.train.eval_images = 2
    cfg.validation.every = 1000
    cfg.validation.prompts = []
    cfg.launch.cpu = True
    cfg.launch.num_machines = 2
    cfg.launch.main_process_ip = "127.0.0.1"
    cfg.launch.join_timeout_minutes = 3
    cfg.launch.timeout_minutes = 45
    return cfg


class Machines:
    """Starts `app.py` as machine N; at teardown stops every run it started (by its
    processes' run token) and kills what is left."""

    def __init__(self, workspace: Path, logs: Path) -> None:
        self.workspace, self.logs = workspace, logs
        self.procs: list[subprocess.Popen] = []
        self.folders: list[RunFolder] = []

    def start(self, config: Path, rank: int, port: int, *sets: str,
              resume: bool = False) -> subprocess.Popen:
        # Ctrl-C as a terminal delivers it: a suite started in the background (`make
        # test &` in a script) ignores SIGINT, and the machine's app.py would inherit that.
        args = [PYTHON, "-c", DEFAULT_SIGINT_EXEC, "app.py", "--no-ui",
                "--workspace", str(self.workspace), "--config", str(config),
                *(["--resume"] if resume else []),
                "--set", f"launch.machine_rank={rank}",
                "--set", f"launch.main_process_port={port}"]
        for setting in sets:
            args += ["--set", setting]
        out = (self.logs / f"app-{len(self.procs)}-machine{rank}.txt").open("w")
        proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def output(self, proc: subprocess.Popen) -> str:
        index = self.procs.index(proc)
        return next(self.logs.glob(f"app-{index}-machine*.txt")).read_text()

    def finish(self, *procs: subprocess.Popen, timeout: float = 600) -> list[int]:
        deadline = time.monotonic() + timeout
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]

    def watch(self, run_dir: Path) -> None:
        self.folders += [RunFolder(run_dir), RunFolder(run_dir).machine(1)]

    def close(self) -> None:
        for folder in self.folders:
            if folder.status.exists() and attach(folder) is not None:
                stop_run(folder, grace_s=5, term_grace_s=2)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machines]:
    root = tmp_path_factory.mktemp("machines")
    (root / "logs").mkdir()
    box = Machines(root / "workspace", root / "logs")
    box.workspace.mkdir()
    try:
        yield box
    finally:
        box.close()


@pytest.fixture(scope="module")
def config(machines: Machines) -> Path:
    path = machines.workspace / "run.toml"
    save_config(two_machine_config(machines.workspace), path)
    return path


def events(run_dir: Path) -> list[dict]:
    text = RunFolder(run_dir).events.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def step_losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events(run_dir) if e["type"] == "step"}


def both(machines: Machines, config: Path, port: int, *sets: str, resume: bool = False
         ) -> tuple[subprocess.Popen, subprocess.Popen]:
    return (machines.start(config, 0, port, *sets, resume=resume),
            machines.start(config, 1, port, *sets, resume=resume))


@pytest.fixture(scope="module")
def uninterrupted(machines: Machines, config: Path) -> Path:
    """Machine 0 and machine 1 train one run to the end."""
    run_dir = machines.workspace / "runs/straight"
    machines.watch(run_dir)
    started = time.monotonic()
    procs = both(machines, config, free_port(), f"output.dir={run_dir}")
    codes = machines.finish(*procs)
    print(f"two-machine run: {time.monotonic() - started:.1f} s")
    assert codes == [0, 0], machines.output(procs[0])[-3000:] + machines.output(procs[1])[-3000:]
    return run_dir


@dataclass
class Lonely:
    """Machine 0 alone and machine 1 alone, each on its own port."""

    alone0: subprocess.Popen
    alone1: subprocess.Popen
    dir0: Path
    dir1: Path
    port0: int
    port1: int
    started: float


@pytest.fixture(scope="module")
def lonely(machines: Machines, config: Path) -> Lonely:
    """Started by the module's first test, so machine 0's minute of waiting for its peer
    (launch.join_timeout_minutes has a minimum of 1) passes while the two-machine runs
    train; the module's last test reads its verdict."""
    port0, port1 = free_port(), free_port()
    # Outside runs/: the two-machine run checks that it is the only folder there.
    dir0, dir1 = machines.workspace / "lonely/alone0", machines.workspace / "lonely/alone1"
    machines.watch(dir0)
    machines.watch(dir1)
    started = time.monotonic()
    alone0 = machines.start(config, 0, port0, f"output.dir={dir0}",
                            "launch.join_timeout_minutes=1")
    # Machine 1 is stopped by Ctrl-C, not by its own timeout (that is test_agreement's):
    # a long one keeps a slow start under a loaded machine from giving up first.
    alone1 = machines.start(config, 1, port1, f"output.dir={dir1}",
                            "launch.join_timeout_minutes=5")
    return Lonely(alone0, alone1, dir0, dir1, port0, port1, started)


def test_a_waiting_machine_says_whom_it_waits_for_and_ctrl_c_ends_it(
        machines: Machines, lonely: Lonely):
    """Each lonely machine's log says whom it waits for; Ctrl-C ends a waiting machine
    (within the stop grace), its run stopped."""
    logs = {RunFolder(lonely.dir0).log:
            f"waiting for 1 other machine to join at 127.0.0.1:{lonely.port0}",
            RunFolder(lonely.dir1).machine(1).log:
            f"joining machine 0 at 127.0.0.1:{lonely.port1}"}
    # The module's first test: at the suite's start, beside the other worker's first
    # imports, so a slow start is given time (a passing run does not wait for it).
    deadline = time.monotonic() + 120
    while not all(log.exists() and line in log.read_text() for log, line in logs.items()):
        assert time.monotonic() < deadline, "a waiting machine must say whom it waits for"
        time.sleep(0.2)

    lonely.alone1.send_signal(signal.SIGINT)
    # app.py gives a Ctrl-C'd run up to FOLLOW_GRACE_S to end; a launcher blocked in the
    # rendezvous may use it all (seen in full-suite runs: the stop then kills it, and the
    # kill and the status write take their time), so wait well past that grace. Machine 0
    # is not affected by it: its verdict (the module's last test) is its own join timeout.
    assert machines.finish(lonely.alone1, timeout=FOLLOW_GRACE_S + 90) == [130]
    assert read_status(RunFolder(lonely.dir1).machine(1).root).state == "stopped"


def test_two_machines_train_one_run(machines: Machines, uninterrupted: Path):
    run_dir = uninterrupted
    status = read_status(run_dir)
    assert status.state == "done" and status.step == MAX_STEPS
    assert status.processes == 2, "the world spans both machines"
    assert sorted(step_losses(run_dir)) == list(range(1, MAX_STEPS + 1))
    # one run folder, one set of checkpoints and weights, written by rank 0
    assert [p.name for p in (machines.workspace / "runs").iterdir()] == ["straight"]
    assert [p.name for p in RunFolder(run_dir).checkpoint_folders()] == [
        "step_000005", "step_000010", "step_000015", "step_000020"]
    assert sorted(p.name for p in (run_dir / "checkpoints/step_000005").glob("rng_*.pt")) == [
        "rng_0.pt", "rng_1.pt"]
    assert RunFolder(run_dir).lora_weights.is_file()
    machine1 = RunFolder(run_dir).machine(1)
    assert sorted(p.name for p in machine1.root.iterdir()) == [
        "command.txt", "config.toml", "events.jsonl", "status.json", "train.log"]
    assert read_status(machine1.root).state == "done"
    assert "--machine_rank 1" in machine1.command.read_text()
    # every machine shows the process group and the collective timeout it runs with
    for log in (RunFolder(run_dir).log, machine1.log):
        assert ("process group: 2 process(es) on 2 machine(s), backend gloo, collective "
                "timeout 45 min") in log.read_text()
    token = RunFolder(run_dir).shared_token.read_text().strip()
    cfg = two_machine_config(machines.workspace)
    for folder in (cfg.text_cache.dir, cfg.datasets[0].vae_cache, cfg.datasets[1].vae_cache):
        assert (Path(folder) / "shared.token").read_text().strip() == token


def _wait_for_step(run_dir: Path, step: int, procs: tuple, timeout: float = 300) -> None:
    """Until the step event (status.json is written at most once a second)."""
    deadline = time.monotonic() + timeout
    while not (RunFolder(run_dir).events.exists() and step in step_losses(run_dir)):
        assert all(p.poll() is None for p in procs), "a machine ended early"
        assert time.monotonic() < deadline, f"no step {step}: {read_status(run_dir)}"
        time.sleep(0.02)


def test_two_machines_stop_mid_epoch_and_resume_the_same_curve(
        machines: Machines, config: Path, uninterrupted: Path):
    """Stopped mid-epoch (the Stop button's STOP file: a step or two after it is asked,
    where a Ctrl-C's latency could be most of a 15-step epoch), then resumed on both
    machines, each giving its own launch.machine_rank and a new port: the losses match
    the uninterrupted run step for step (two datasets, two ranks) and the resumed run
    crosses into the next epoch."""
    run_dir = machines.workspace / "runs/resumed"
    machines.watch(run_dir)
    procs = both(machines, config, free_port(), f"output.dir={run_dir}")
    _wait_for_step(run_dir, 3, procs)
    request_stop(run_dir)
    assert machines.finish(*procs) == [130, 130]
    stopped_at = read_status(run_dir).step
    assert read_status(run_dir).state == "stopped" and stopped_at < MAX_STEPS
    assert read_status(RunFolder(run_dir).machine(1).root).state == "stopped"
    sampler = json.loads((RunFolder(run_dir).checkpoint(stopped_at) / "sampler.json")
                         .read_text())
    assert sampler["position"] > 0, "the stop must fall inside an epoch"

    saved = RunFolder(run_dir).config
    procs = both(machines, saved, free_port(), resume=True)
    codes = machines.finish(*procs)
    assert codes == [0, 0], machines.output(procs[0])[-3000:] + machines.output(procs[1])[-3000:]
    assert read_status(run_dir).state == "done" and read_status(run_dir).step == MAX_STEPS
    assert "--machine_rank 1" in RunFolder(run_dir).machine(1).command.read_text()
    resumes = [e for e in events(run_dir) if e["type"] == "resume"]
    assert [(e["step"], e["layout_changes"]) for e in resumes] == [(stopped_at, [])]
    reference, losses = step_losses(uninterrupted), step_losses(run_dir)
    for step in range(1, MAX_STEPS + 1):
        assert losses[step] == pytest.approx(reference[step], rel=1e-3, abs=1e-4), step


def test_machines_that_disagree_stop_naming_the_machine(machines: Machines, config: Path):
    """Machine 1 runs another config: both machines stop at start, each with a message
    naming machine 1 and the key. (A machine that cannot see the run folder is the same
    check at start: test_agreement.py runs it on two ranks in one process.)"""
    other_dir = machines.workspace / "runs/other"
    machines.watch(other_dir)
    port = free_port()
    other = (machines.start(config, 0, port, f"output.dir={other_dir}"),
             machines.start(config, 1, port, f"output.dir={other_dir}",
                            "datasets.1.repeats=3"))
    assert machines.finish(*other) == [1, 1]
    other_reasons = [read_status(other_dir).reason,
                     read_status(RunFolder(other_dir).machine(1).root).reason]
    for reason in other_reasons:
        assert "rank 1 (machine 1): datasets.1.repeats is 3 there but 1 on rank 0" in reason
    assert not RunFolder(other_dir).checkpoints.exists(), "nothing trained"


def test_a_machine_alone_gives_up_after_its_join_timeout(machines: Machines, lonely: Lonely):
    """After launch.join_timeout_minutes machine 0 gives up, its run failed with a message
    saying why (machine 1's message on giving up is tested in test_agreement.py)."""
    assert machines.finish(lonely.alone0, timeout=300) == [1]
    assert time.monotonic() - lonely.started >= 60
    status = read_status(lonely.dir0)
    assert status.state == "failed"
    assert status.reason.startswith("the other machines did not join within 1 minute "
                                    "(launch.join_timeout_minutes): machine 0 waited for 1 "
                                    f"more at 127.0.0.1:{lonely.port0}.")
    printed = machines.output(lonely.alone0)  # the terminal shows the wait and the verdict
    assert f"waiting for 1 other machine to join at 127.0.0.1:{lonely.port0}" in printed
    assert "error: the other machines did not join" in printed
    errors = [e for e in events(lonely.dir0) if e["type"] == "error"]
    assert errors and "did not join" in errors[-1]["message"]
