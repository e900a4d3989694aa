"""Multi-machine pieces that need no accelerate launch: what the ranks compare at start
(two ranks as two threads gathering through a barrier), the launch command and log
lines, the machine folder a joining machine prepares, the join timeout's verdict."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.cache.dataset import CachedDataset, CachedItem
from core.cache.plan import TextJob, VaeJob
from core.config import Config, DatasetConfig, load_config
from core.data.sampler import MultiDatasetSampler
from core.runs.command import Join, LaunchSpec, build_accelerate_command
from core.runs.folder import RunFolder
from core.runs.manager import start_run
from core.runs.prepare import RunDirError, prepare_machine_dir, prepare_run_dir
from core.runs.status import read_status
from core.train.agreement import (
    Ranks,
    RanksDisagree,
    check_same_config,
    check_same_data,
    check_same_start,
    check_shared_folders,
)


def two_ranks() -> list[Ranks]:
    """Rank 0 on machine 0 and rank 1 on machine 1, gathering like a process group."""
    barrier, slots = threading.Barrier(2, timeout=30), [None, None]

    def gather_of(index: int) -> Callable[[Any], list[Any]]:
        def gather(obj: Any) -> list[Any]:
            slots[index] = obj
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out
        return gather

    return [Ranks(0, 0, gather_of(0)), Ranks(1, 1, gather_of(1))]


def on_both(work: Callable[[Ranks, int], None]) -> list[BaseException | None]:
    """Run `work(ranks, index)` as rank 0 and rank 1 at once; each rank's exception."""
    ranks, raised = two_ranks(), [None, None]

    def body(i: int) -> None:
        try:
            work(ranks[i], i)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised[i] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return raised


def config(tmp: Path, **launch: Any) -> Config:
    cfg = Config(datasets=[DatasetConfig(id="a", images=str(tmp / "data/a"),
                                         vae_cache=str(tmp / "cache/a"))])
    cfg.text_cache.dir = str(tmp / "cache/text")
    cfg.output.dir = str(tmp / "runs/r")
    for key, value in {"num_machines": 2, "main_process_ip": "10.0.0.1", **launch}.items():
        setattr(cfg.launch, key, value)
    return cfg


# ---------------------------------------------------------------- the checks at start


def test_a_rank_that_cannot_see_the_shared_folders_stops_every_rank(tmp_path: Path):
    seen, blind = config(tmp_path), config(tmp_path)
    blind.output.dir = str(tmp_path / "other-disk/r")
    raised = on_both(lambda r, i: check_shared_folders([seen, blind][i], r, wait_s=0))
    assert all(isinstance(e, RanksDisagree) for e in raised)
    assert str(raised[0]) == str(raised[1])
    message = str(raised[0])
    assert message.startswith(f"rank 1 (machine 1) cannot see output.dir {blind.output.dir}")
    assert "text_cache.dir" not in message, "the caches are shared: only output.dir is named"
    token = (Path(seen.output.dir) / "shared.token").read_text().strip()
    assert (Path(seen.datasets[0].vae_cache) / "shared.token").read_text().strip() == token
    assert on_both(lambda r, i: check_shared_folders(seen, r, wait_s=0)) == [None, None]


def test_configs_that_differ_name_the_key_but_not_where_a_machine_is(tmp_path: Path):
    mine = config(tmp_path)
    theirs = config(tmp_path, machine_rank=1, main_process_ip="10.0.0.2",
                    main_process_port=29999)
    assert on_both(lambda r, i: check_same_config([mine, theirs][i], r)) == [None, None]
    theirs.train.learning_rate = 2e-4
    raised = on_both(lambda r, i: check_same_config([mine, theirs][i], r))
    assert all(isinstance(e, RanksDisagree) for e in raised)
    assert ("rank 1 (machine 1): train.learning_rate is 0.0002 there but 0.0001 on rank 0"
            in str(raised[1]))
    assert "machine_rank" not in str(raised[1]).split(". Start")[0]


def cached(tmp: Path, names: list[str], meta: str = "m") -> CachedDataset:
    items = []
    for name in names:
        image = tmp / "data/a" / name
        vae = VaeJob("a", image, tmp / "cache/a" / f"{name}.safetensors", (64, 64),
                     (64, 64, 0, 0), (64, 64), (0, 0), {"model": meta})
        items.append(CachedItem(vae, TextJob(name, tmp / "cache/text" / name, {"model": meta})))
    return CachedDataset("a", items)


def test_ranks_with_different_cached_items_stop_naming_the_items(tmp_path: Path):
    cfg = config(tmp_path)
    full = cached(tmp_path, ["0.png", "1.png", "2.png", "3.png"])
    short = cached(tmp_path, ["0.png", "1.png", "2.png"])
    rebuilt = cached(tmp_path, ["0.png", "1.png", "2.png", "3.png"], meta="other weights")

    def check(datasets: list[CachedDataset]) -> Callable[[Ranks, int], None]:
        def work(ranks: Ranks, i: int) -> None:
            sampler = MultiDatasetSampler([datasets[i].source()], batch_size=1,
                                          num_processes=2, process_index=i)
            check_same_data(cfg, [datasets[i]], sampler, "fp", ranks)
        return work

    assert on_both(check([full, full])) == [None, None]
    raised = on_both(check([full, short]))
    assert all(isinstance(e, RanksDisagree) for e in raised)
    assert ("rank 1 (machine 1): dataset 'a' (datasets.0): 3 cached item(s) there, 4 on "
            "rank 0, only on rank 0: 3.png") in str(raised[0])
    raised = on_both(check([full, rebuilt]))
    assert "cache entries differ for 4 item(s), e.g. 0.png" in str(raised[1])


def test_ranks_that_start_from_different_steps_stop(tmp_path: Path):
    assert on_both(lambda r, i: check_same_start(6, r)) == [None, None]
    raised = on_both(lambda r, i: check_same_start([6, 0][i], r))
    assert all(isinstance(e, RanksDisagree) for e in raised)
    assert str(raised[1]).startswith("the ranks start from different steps: rank 0 (machine "
                                     "0) from step 6, rank 1 (machine 1) from step 0.")


# ---------------------------------------------------------------- launching a machine


def test_a_multi_machine_command_gives_up_after_the_join_timeout(tmp_path: Path):
    cfg = config(tmp_path, join_timeout_minutes=7, main_process_port=29501)
    spec = build_accelerate_command(cfg, tmp_path / "run", tmp_path, resume=None)
    argv = spec.argv
    assert argv[argv.index("--rdzv_conf") + 1] == "timeout=420"
    assert spec.notes == ("waiting for 1 other machine to join at 10.0.0.1:29501 (2 "
                          "machines in all; this is machine 0); giving up if they do not "
                          "join within 7 minutes (launch.join_timeout_minutes)",)
    assert spec.join is not None and spec.join.timeout_s == 420
    cfg.launch.machine_rank = 1
    own = RunFolder(tmp_path / "run").machine(1).config
    spec = build_accelerate_command(cfg, tmp_path / "run", tmp_path, resume=None, config=own)
    assert spec.notes[0].startswith("joining machine 0 at 10.0.0.1:29501")
    assert spec.argv[spec.argv.index("--config") + 1] == str(own)
    single = build_accelerate_command(Config(), tmp_path / "run", tmp_path, resume=None)
    assert "--rdzv_conf" not in single.argv and single.join is None and not single.notes


def test_machines_rehearsed_on_one_box_share_its_cores(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    cores = os.cpu_count() or 1
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def threads(ip: str) -> int:
        cfg = config(tmp_path, main_process_ip=ip)
        argv = build_accelerate_command(cfg, tmp_path / "run", tmp_path, resume=None).argv
        return int(argv[argv.index("--num_cpu_threads_per_process") + 1])

    assert threads("10.0.0.1") == cores, "a real machine has its cores to itself"
    assert threads("127.0.0.1") == threads("localhost") == max(1, cores // 2)
    # A thread count set where the app runs (a batch job, test workers side by side) is
    # each process's, as OpenMP reads it: accelerate's flag would otherwise override it.
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads("10.0.0.1") == threads("127.0.0.1") == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")
    assert threads("10.0.0.1") == cores, "a value that is not a count is ignored"


def test_a_joining_machine_gets_its_own_folder_beside_machine_0s_run(tmp_path: Path):
    first = config(tmp_path)
    run_dir = Path(first.output.dir)
    prepare_run_dir(first, run_dir, resume=False)  # machine 0 started the run
    with pytest.raises(RunDirError, match="it is not overwritten"):
        prepare_run_dir(config(tmp_path, machine_rank=1), run_dir, resume=False)
    joining = config(tmp_path, machine_rank=1)
    launch_cfg, folder, notes = prepare_machine_dir(joining, run_dir, resume=False)
    assert folder.root == run_dir / "machines/1" and notes == []
    assert load_config(folder.config).launch.machine_rank == 1
    assert load_config(RunFolder(run_dir).config).launch.machine_rank == 0, "untouched"

    # A resume runs the saved config, with this machine's rank, address and port.
    again = load_config(RunFolder(run_dir).config)
    again.launch.machine_rank, again.launch.main_process_ip = 1, "10.0.0.9"
    again.launch.main_process_port = 29777
    again.train.learning_rate = 5e-4
    launch_cfg, folder, notes = prepare_machine_dir(again, run_dir, resume=True)
    assert (launch_cfg.launch.machine_rank, launch_cfg.launch.main_process_ip,
            launch_cfg.launch.main_process_port) == (1, "10.0.0.9", 29777)
    assert launch_cfg.train.learning_rate == first.train.learning_rate
    assert [p.where for p in notes] == ["train.learning_rate"]
    assert load_config(folder.config).launch.machine_rank == 1


def test_a_joining_machine_that_cannot_see_the_saved_config_says_so(tmp_path: Path):
    joining = config(tmp_path, machine_rank=1)
    with pytest.raises(RunDirError) as caught:
        prepare_machine_dir(joining, Path(joining.output.dir), resume=True)
    message = caught.value.problems[0].message
    assert "machine 1 cannot see config.toml, which machine 0 wrote" in message
    assert "on a filesystem every machine sees" in message


def _launcher(run_dir: Path, seconds: float, join_s: float) -> LaunchSpec:
    """A stand-in launcher that waits `seconds` and fails, like one whose peers never came."""
    code = f"import time; time.sleep({seconds}); print('DistStoreError: timed out'); exit(1)"
    return LaunchSpec(argv=[sys.executable, "-c", code], notes=("waiting for someone",),
                      join=Join(timeout_s=join_s, failure="nobody joined; start them"))


def test_a_launcher_that_gave_up_waiting_fails_with_the_join_message(tmp_path: Path):
    run_dir = tmp_path / "run"
    handle = start_run(_launcher(run_dir, 1.0, join_s=0.5), run_dir)
    assert handle.wait(timeout=60) == "failed"
    status = read_status(run_dir)
    assert status.reason.startswith("nobody joined; start them (last line: ")
    log = RunFolder(run_dir).log.read_text()
    assert "waiting for someone" in log.splitlines()[2]
    assert log.rstrip().endswith("error: nobody joined; start them")

    # failing before the join timeout is some other failure: the usual reason
    early = tmp_path / "early"
    handle = start_run(_launcher(early, 0.0, join_s=600), early)
    assert handle.wait(timeout=60) == "failed"
    assert read_status(early).reason.startswith("the training process exited with code 1")
