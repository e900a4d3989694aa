"""What every rank must agree on before it trains, checked once at start.

Several processes only train one model when they see the same folders, run the same
config and draw from the same data; any difference makes DDP average gradients of
different batches (or hang in a collective), silently. So at start:

- several machines: rank 0 writes a fresh token into the output folder and every cache
  folder (`shared.token`), every rank reads it back; a machine that cannot see it stops
  (every rank stops, with a message naming the machine and the folder);
- several processes: every rank gathers its config (all but where it is:
  core.runs.prepare.PER_MACHINE_KEYS) and, once the caches are built, a digest of what it
  will train on (the cached items of each dataset, the sampler's layout, the cache
  entries' fingerprints, the model's), and after a resume the step it goes on from; a
  difference stops every rank with a message naming the rank, its machine and what
  differs.

The checks take a `Ranks`: this process's place and a `gather` that returns every rank's
object in rank order (accelerate's gather_object; a plain function in a unit test).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import Config, config_to_dict
from core.files import write_text
from core.runs.folder import SHARED_TOKEN_NAME
from core.runs.prepare import PER_MACHINE_KEYS, flatten
from core.train.errors import TrainingError

if TYPE_CHECKING:
    from core.cache.dataset import CachedDataset
    from core.data.sampler import MultiDatasetSampler

TOKEN_WAIT_S = 10.0  # a network filesystem may show a new file to another machine late


class RanksDisagree(TrainingError):
    """Raised on every rank with the same message: every machine stops."""


@dataclass(frozen=True)
class Ranks:
    index: int
    machine: int
    gather: Callable[[Any], list[Any]]


def ranks_of(accelerator: Any, cfg: Config) -> Ranks:
    def gather(obj: Any) -> list[Any]:
        from accelerate.utils import gather_object

        return list(gather_object([obj]))

    machine = cfg.launch.machine_rank if cfg.launch.num_machines > 1 else 0
    return Ranks(accelerator.process_index, machine, gather)


def _who(index: int, machine: int) -> str:
    return f"rank {index} (machine {machine})"


# ---------------------------------------------------------------- the process group


def collective_timeout() -> float | None:
    """Minutes a collective waits before it fails, as the default process group has it
    (None without one, or when this torch does not tell)."""
    try:
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        device = torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")
        group = dist.distributed_c10d._get_default_group()
        return group._get_backend(device).options._timeout.total_seconds() / 60
    except (AttributeError, RuntimeError, ValueError):
        return None


def describe_group(accelerator: Any, cfg: Config) -> str:
    """One log line: how many processes on how many machines, and the timeout in effect."""
    minutes = collective_timeout()
    shown = f"{minutes:g} min" if minutes is not None else "unknown"
    backend = getattr(accelerator.state, "backend", None) or "none"
    return (f"process group: {accelerator.num_processes} process(es) on "
            f"{cfg.launch.num_machines} machine(s), backend {backend}, collective timeout "
            f"{shown} (launch.timeout_minutes = {cfg.launch.timeout_minutes})")


# ---------------------------------------------------------------- shared folders


def shared_folders(cfg: Config) -> list[tuple[str, Path]]:
    """(key, folder) of every folder all machines write to: output and caches."""
    out = [("output.dir", Path(cfg.output.dir)), ("text_cache.dir", Path(cfg.text_cache.dir))]
    out += [(f"datasets.{i}.vae_cache", Path(ds.vae_cache)) for i, ds in enumerate(cfg.datasets)]
    return out


def _write_token(folder: Path, token: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / SHARED_TOKEN_NAME, token + "\n")


def _reads_token(folder: Path, token: str) -> bool:
    try:
        return (folder / SHARED_TOKEN_NAME).read_text(encoding="utf-8").strip() == token
    except OSError:
        return False


def _unseen(folders: list[tuple[str, Path]], token: str, wait_s: float) -> list[str]:
    """The folders whose token this rank does not read, after up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        missing = [f"{key} {folder}" for key, folder in folders
                   if not _reads_token(folder, token)]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.5)


def check_shared_folders(cfg: Config, ranks: Ranks, wait_s: float = TOKEN_WAIT_S) -> None:
    """Rank 0 writes a fresh token into every shared folder; every rank must read it."""
    folders = shared_folders(cfg)
    token = uuid.uuid4().hex if ranks.index == 0 else ""
    if ranks.index == 0:
        for _key, folder in folders:
            _write_token(folder, token)
    token = ranks.gather(token)[0]  # also the barrier: rank 0 wrote before it gathered
    missing = [] if ranks.index == 0 else _unseen(folders, token, wait_s)
    blind = [(i, m, miss) for i, m, miss in ranks.gather((ranks.index, ranks.machine, missing))
             if miss]
    if blind:
        lines = [f"{_who(i, m)} cannot see {', '.join(miss)}" for i, m, miss in blind]
        raise RanksDisagree(
            "; ".join(lines) + f" (no {SHARED_TOKEN_NAME} from machine 0 there). The output "
            "folder and every cache folder must be on a filesystem every machine sees "
            "(NFS or similar), mounted at the same path on every machine; every machine "
            "stops")


# ---------------------------------------------------------------- the config


def comparable_config(cfg: Config) -> dict[str, Any]:
    """The config as key -> value, without the keys that differ between machines."""
    return {k: v for k, v in flatten(config_to_dict(cfg)).items() if k not in PER_MACHINE_KEYS}


def check_same_config(cfg: Config, ranks: Ranks) -> None:
    """Every rank runs rank 0's config, but for where it is."""
    everyone = ranks.gather((ranks.index, ranks.machine, comparable_config(cfg)))
    _, first_machine, reference = everyone[0]
    lines = []
    for index, machine, theirs in everyone[1:]:
        keys = [k for k in sorted(set(reference) | set(theirs))
                if reference.get(k) != theirs.get(k)]
        if keys:
            shown = "; ".join(f"{k} is {theirs.get(k)!r} there but {reference.get(k)!r} on "
                              f"rank 0" for k in keys[:5])
            lines.append(f"{_who(index, machine)}: {shown}")
    if lines:
        raise RanksDisagree(
            f"the configs differ from rank 0's (machine {first_machine}): " + " | ".join(lines)
            + ". Start every machine with the same config (only launch.machine_rank, "
            "launch.main_process_ip and launch.main_process_port may differ); every "
            "machine stops")


# ---------------------------------------------------------------- the data


def _sha(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _items(cfg: Config, index: int, ds: CachedDataset) -> list[tuple[str, str]]:
    """(image relative to the dataset's folder, fingerprint of its cache entries)."""
    root = Path(cfg.datasets[index].images)
    out = []
    for item in ds.items:
        name = item.vae.image.relative_to(root).as_posix()
        text = item.text  # None: encoded at train time, from the caption
        key = [item.vae.bucket, str(item.vae.entry), item.vae.meta,
               str(text.entry) if text else item.caption, text.meta if text else None]
        out.append((name, _sha(key)))
    return out


def data_digest(cfg: Config, datasets: list[CachedDataset], sampler: MultiDatasetSampler,
                model_fingerprint: str) -> dict[str, Any]:
    """Small enough to gather from every rank: hashes and counts."""
    return {
        "model": model_fingerprint,
        "sampler": _sha(sampler.state_dict()["layout"]),
        "datasets": [(len(ds), _sha(_items(cfg, i, ds))) for i, ds in enumerate(datasets)],
    }


def _dataset_difference(cfg: Config, i: int, mine: list[tuple[str, str]],
                        reference: list[tuple[str, str]]) -> str:
    name = f"dataset '{cfg.datasets[i].id}' (datasets.{i})"
    ours, theirs = dict(mine), dict(reference)
    only_here = sorted(set(ours) - set(theirs))
    only_there = sorted(set(theirs) - set(ours))
    parts = [f"{len(ours)} cached item(s) there, {len(theirs)} on rank 0"]
    if only_here:
        parts.append(f"only there: {', '.join(only_here[:3])}")
    if only_there:
        parts.append(f"only on rank 0: {', '.join(only_there[:3])}")
    changed = sorted(k for k in set(ours) & set(theirs) if ours[k] != theirs[k])
    if changed:
        parts.append(f"cache entries differ for {len(changed)} item(s), e.g. {changed[0]}")
    return f"{name}: " + ", ".join(parts)


def check_same_data(cfg: Config, datasets: list[CachedDataset],
                    sampler: MultiDatasetSampler, model_fingerprint: str,
                    ranks: Ranks) -> None:
    """Every rank trains on the same items, in the same layout, from the same cache.

    The digests are gathered first; only when they differ are the item lists gathered,
    to name what differs."""
    digest = data_digest(cfg, datasets, sampler, model_fingerprint)
    everyone = ranks.gather((ranks.index, ranks.machine, digest))
    reference = everyone[0][2]
    if all(d == reference for _, _, d in everyone):
        return
    wrong = {i for _, _, d in everyone for i, (a, b) in
             enumerate(zip(d["datasets"], reference["datasets"], strict=False)) if a != b}
    items = {i: _items(cfg, i, datasets[i]) for i in sorted(wrong)}
    all_items = ranks.gather(items)
    lines = []
    for (index, machine, d), their_items in zip(everyone, all_items, strict=True):
        if d == reference:
            continue
        parts = [_dataset_difference(cfg, i, their_items[i], all_items[0][i])
                 for i in sorted(wrong) if their_items[i] != all_items[0][i]]
        if d["model"] != reference["model"]:
            parts.append("the model's weights differ")
        if d["sampler"] != reference["sampler"]:
            parts.append("the sampler's layout differs")
        lines.append(f"{_who(index, machine)}: " + "; ".join(parts))
    raise RanksDisagree(
        "the ranks would train on different data: " + " | ".join(lines) + ". Every machine "
        "must see the same images and the same caches (cache folders on a shared "
        "filesystem); every machine stops")


def check_same_start(step: int, ranks: Ranks) -> None:
    """Every rank goes on from the same step: a machine started without --resume (or
    from another checkpoint) would train other weights than rank 0 from here on."""
    everyone = ranks.gather((ranks.index, ranks.machine, step))
    first = everyone[0][2]
    others = [f"{_who(i, m)} from step {s}" for i, m, s in everyone[1:] if s != first]
    if others:
        raise RanksDisagree(
            f"the ranks start from different steps: rank 0 (machine {everyone[0][1]}) from "
            f"step {first}, " + ", ".join(others) + ". Resume every machine the same way "
            "(all with --resume and the same checkpoint, or none); every machine stops")
