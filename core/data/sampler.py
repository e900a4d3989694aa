"""Which items each process trains on, micro-batch by micro-batch, over several datasets.

This is the part to read to trust the tool, so here is the whole contract.

The epoch plan (the same on every process; it depends only on the datasets, the seed and
the epoch number, never on process-local state):

1. Each dataset with probability > 0 contributes `repeats` copies of its items; a dataset
   with probability 0 contributes nothing and is never picked. Items are grouped by bucket.
2. In every bucket the items are shuffled (seeded by (seed, epoch, dataset)); each repeat is
   shuffled separately, so a repeat shows every item once before any is seen again.
3. Each bucket is cut into *global* batches of batch_size * num_processes items. A last,
   partial global batch is filled up with items from the start of the same bucket's
   shuffled order (wrapping around if the bucket is tiny). Nothing is dropped: every item is
   seen at least `repeats` times per epoch, and a few are seen once more ("padded"). A
   bucket smaller than one global batch therefore still trains, with repeated items.
4. Each dataset's global batches are shuffled into a queue (buckets interleave).
5. Micro-step by micro-step, one dataset is picked among those whose queue is not empty,
   with chance proportional to `probability`, using the k-th draw of a random stream seeded
   by (seed, epoch): a function of (seed, epoch, micro-step) only. The picked dataset's next
   global batch is the micro-batch. An exhausted dataset drops out; the epoch ends when
   all queues are empty. So `probability` shapes the order (which dataset dominates early),
   while `repeats` decides how much of each dataset an epoch holds.
6. Whole optimizer steps: if the number of micro-batches is not a multiple of grad_accum,
   the last optimizer step is completed with the first micro-batches of a second plan for
   the same epoch (steps 1-5 with a different seed tag, marked `is_fill`). Every optimizer
   step has exactly grad_accum micro-batches and every epoch ends on a step boundary, so
   all processes leave the epoch together and `steps_per_epoch()` is known in advance.

Process k takes items [k*batch_size, (k+1)*batch_size) of each global batch: every process
sees the same dataset and bucket at every micro-step, disjoint items, and the same number of
micro-batches. Nothing here uses the global `random` state.

Regularization datasets (prior preservation) are sampled by the same rules: their batches
interleave with the others' (rule 5), `repeats` sets their share of the epoch, and since a
micro-batch comes from one dataset on every process, every process weighs the same
micro-step's loss by train.prior_loss_weight. The flag does not change the plan.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

STATE_VERSION = 1

# (width, height), or (width, height, frames) for a video family's clips
BucketKey = tuple[int, ...]


@dataclass(frozen=True)
class SourceDataset:
    """One dataset as the sampler sees it: the bucket of each item, in item order."""

    id: str
    item_buckets: Sequence[BucketKey]
    repeats: int = 1
    probability: float = 1.0
    # Class images for prior preservation (datasets.N.regularization): sampled like any
    # dataset (the plan does not depend on it), their loss weighted by the trainer.
    regularization: bool = False


@dataclass(frozen=True)
class SampledBatch:
    """One micro-batch for this process. item_indices index the dataset's item list."""

    dataset_index: int
    dataset_id: str
    bucket: BucketKey
    item_indices: list[int]
    epoch: int
    step: int  # optimizer step (0-based, counted since the start of training)
    micro_step: int  # micro-batch (0-based, counted since the start of training)
    accum_index: int  # 0 .. grad_accum-1 within the optimizer step
    is_fill: bool = False  # completes the epoch's last optimizer step (rule 6)
    regularization: bool = False  # from a regularization dataset (the same on every rank)


@dataclass(frozen=True)
class _GlobalBatch:
    dataset_index: int
    bucket: BucketKey
    items: tuple[int, ...]  # batch_size * num_processes item indices
    is_fill: bool = False


@dataclass(frozen=True)
class DatasetSummary:
    """Per-dataset figures for the check-stage summary (the same every epoch)."""

    id: str
    items: int  # items in the dataset
    items_per_epoch: int  # items * repeats, or 0 when probability is 0
    micro_batches: int  # global batches per epoch drawn from this dataset
    padded: int  # extra item slots used to fill partial batches (rule 3)
    regularization: bool = False


class SamplerStateError(ValueError):
    """A saved sampler state does not fit this sampler (datasets or batch layout changed)."""


def _rng(seed: int, epoch: int, tag: str) -> random.Random:
    # A string seed is hashed with SHA-512 by `random`, independent of PYTHONHASHSEED,
    # so every process builds the same stream.
    return random.Random(f"sampler:{seed}:{epoch}:{tag}")


class MultiDatasetSampler:
    """Yields this process's micro-batches forever, epoch after epoch (see module doc)."""

    def __init__(self, datasets: Sequence[SourceDataset], batch_size: int, grad_accum: int = 1,
                 num_processes: int = 1, process_index: int = 0, seed: int = 0) -> None:
        _check_int("batch_size", batch_size, 1)
        _check_int("grad_accum", grad_accum, 1)
        _check_int("num_processes", num_processes, 1)
        _check_int("process_index", process_index, 0)
        _check_int("seed", seed, 0)
        if process_index >= num_processes:
            raise ValueError(f"process_index {process_index} must be below num_processes "
                             f"{num_processes}")
        self.datasets = list(datasets)
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.num_processes = num_processes
        self.process_index = process_index
        self.seed = seed
        self.global_batch_size = batch_size * num_processes
        self._buckets = [_validate_dataset(i, d) for i, d in enumerate(self.datasets)]
        if not any(d.probability > 0 for d in self.datasets):
            raise ValueError("every dataset has probability 0: there is nothing to train on; "
                             "give at least one dataset a probability above 0")
        self._epoch = 0
        self._position = 0  # micro-batches already yielded in this epoch
        self._micro_step = 0  # micro-batches already yielded since the start of training
        self._plan_cache: tuple[int, list[_GlobalBatch]] | None = None

    # ------------------------------------------------------------------ sizes

    def dataset_summaries(self) -> list[DatasetSummary]:
        """Per-dataset counts for one epoch, computed without building a plan."""
        out = []
        for d, groups in zip(self.datasets, self._buckets, strict=True):
            active = d.probability > 0
            slots = [len(items) * d.repeats for items in groups.values()] if active else []
            batches = [-(-n // self.global_batch_size) for n in slots]
            out.append(DatasetSummary(
                id=d.id, items=len(d.item_buckets),
                items_per_epoch=sum(slots), micro_batches=sum(batches),
                padded=sum(b * self.global_batch_size for b in batches) - sum(slots),
                regularization=d.regularization))
        return out

    def micro_batches_per_epoch(self) -> int:
        """Micro-batches per epoch, fill (rule 6) included: a multiple of grad_accum."""
        return self.steps_per_epoch() * self.grad_accum

    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (every epoch has the same count)."""
        drawn = sum(s.micro_batches for s in self.dataset_summaries())
        return -(-drawn // self.grad_accum)

    # ------------------------------------------------------------------ the plan

    def _draw(self, epoch: int, tag: str) -> list[_GlobalBatch]:
        """Rules 1-5: the epoch's global batches, in order, before filling."""
        queues: list[list[_GlobalBatch]] = []
        for index, (d, groups) in enumerate(zip(self.datasets, self._buckets, strict=True)):
            if d.probability <= 0:
                queues.append([])
                continue
            rng = _rng(self.seed, epoch, f"{tag}:dataset:{index}")
            queue = []
            for bucket in sorted(groups):
                items = _shuffled_repeats(groups[bucket], d.repeats, rng)
                queue += [_GlobalBatch(index, bucket, chunk)
                          for chunk in _chunks(items, self.global_batch_size)]
            rng.shuffle(queue)
            queues.append(queue)
        picks = _rng(self.seed, epoch, f"{tag}:picks")
        heads = [0] * len(queues)
        order: list[_GlobalBatch] = []
        while True:
            open_ = [i for i, q in enumerate(queues) if heads[i] < len(q)]
            if not open_:
                return order
            chosen = _weighted_pick(open_, [self.datasets[i].probability for i in open_],
                                    picks.random())
            order.append(queues[chosen][heads[chosen]])
            heads[chosen] += 1

    def _plan(self, epoch: int) -> list[_GlobalBatch]:
        """The epoch's global batches including the fill (rule 6); cached for one epoch."""
        if self._plan_cache is not None and self._plan_cache[0] == epoch:
            return self._plan_cache[1]
        plan = self._draw(epoch, "main")
        missing = -len(plan) % self.grad_accum
        if missing:
            fill = self._draw(epoch, "fill")
            plan += [_GlobalBatch(b.dataset_index, b.bucket, b.items, is_fill=True)
                     for b in (fill[i % len(fill)] for i in range(missing))]
        self._plan_cache = (epoch, plan)
        return plan

    def _local(self, batch: _GlobalBatch, epoch: int, micro_step: int) -> SampledBatch:
        start = self.process_index * self.batch_size
        return SampledBatch(
            dataset_index=batch.dataset_index,
            dataset_id=self.datasets[batch.dataset_index].id,
            bucket=batch.bucket,
            item_indices=list(batch.items[start:start + self.batch_size]),
            epoch=epoch,
            step=micro_step // self.grad_accum,
            micro_step=micro_step,
            accum_index=micro_step % self.grad_accum,
            is_fill=batch.is_fill,
            regularization=self.datasets[batch.dataset_index].regularization,
        )

    def epoch_batches(self, epoch: int) -> list[SampledBatch]:
        """This process's micro-batches of one epoch, numbered as if training had run
        uninterrupted from epoch 0 with this layout. Does not move the iterator."""
        plan = self._plan(epoch)
        first = epoch * len(plan)
        return [self._local(b, epoch, first + i) for i, b in enumerate(plan)]

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[SampledBatch]:
        """Infinite: the trainer stops at max_steps. State advances as batches are taken,
        so `state_dict()` after k batches resumes at batch k."""
        while True:
            plan = self._plan(self._epoch)
            if self._position >= len(plan):
                self._epoch += 1
                self._position = 0
                continue
            batch = self._local(plan[self._position], self._epoch, self._micro_step)
            self._position += 1
            self._micro_step += 1
            yield batch

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def epoch_complete(self) -> bool:
        """True once the last micro-batch of the current epoch was taken: the step just
        finished ends epoch `epoch` (the counter moves on only when the next batch is
        drawn, so a trainer asks this right after its step)."""
        return self._position >= len(self._plan(self._epoch))

    # ------------------------------------------------------------------ resume

    def _layout(self) -> dict[str, Any]:
        """What the plan depends on; a saved state only fits a sampler with the same one."""
        return {
            "seed": self.seed,
            "batch_size": self.batch_size,
            "grad_accum": self.grad_accum,
            "num_processes": self.num_processes,
            "datasets": [[d.id, len(d.item_buckets), d.repeats, d.probability,
                          _digest(d.item_buckets)] for d in self.datasets],
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly position; the same on every process (any rank's copy will do)."""
        return {"version": STATE_VERSION, "epoch": self._epoch, "position": self._position,
                "micro_step": self._micro_step, "layout": self._layout()}

    def layout_changes(self, state: dict[str, Any]) -> list[str]:
        """What changed between the layout `state` was saved with and this sampler's
        (empty when `state` resumes mid-epoch exactly); raises SamplerStateError for a
        state of another version."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise SamplerStateError(f"not a sampler state of version {STATE_VERSION}")
        return _layout_changes(state.get("layout", {}), self._layout())

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Continue exactly where `state` was taken.

        If the layout changed (datasets, seed, batch size, grad_accum, process count) the
        mid-epoch position has no meaning: strict raises SamplerStateError saying what
        changed; strict=False continues at the start of the next epoch, keeping the count of
        whole optimizer steps done.
        """
        changed = self.layout_changes(state)
        if not changed:
            self._epoch, self._position = int(state["epoch"]), int(state["position"])
            self._micro_step = int(state["micro_step"])
            return
        if strict:
            raise SamplerStateError("the saved sampler state does not match this run ("
                                    + "; ".join(changed) + "); it cannot resume mid-epoch")
        saved_accum = int(state["layout"].get("grad_accum", self.grad_accum))
        steps_done = int(state["micro_step"]) // saved_accum
        self._epoch = int(state["epoch"]) + (1 if int(state["position"]) > 0 else 0)
        self._position = 0
        self._micro_step = steps_done * self.grad_accum


# ---------------------------------------------------------------------- helpers


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _validate_dataset(index: int, d: SourceDataset) -> dict[BucketKey, list[int]]:
    """Check one dataset and group its item indices by bucket."""
    name = f"dataset {index} ({d.id!r})"
    _check_int(f"{name}: repeats", d.repeats, 1)
    p = d.probability
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < math.inf:
        raise ValueError(f"{name}: probability must be a finite number >= 0, got {p!r}")
    if d.probability > 0 and not d.item_buckets:
        raise ValueError(f"{name} has no items; add images or set its probability to 0")
    groups: dict[BucketKey, list[int]] = {}
    for i, b in enumerate(d.item_buckets):
        key = tuple(int(v) for v in b)  # (width, height) or (width, height, frames)
        groups.setdefault(key, []).append(i)
    return groups


def _shuffled_repeats(items: list[int], repeats: int, rng: random.Random) -> list[int]:
    out: list[int] = []
    for _ in range(repeats):
        copy = list(items)
        rng.shuffle(copy)
        out += copy
    return out


def _chunks(items: list[int], size: int) -> list[tuple[int, ...]]:
    """Cut into full chunks; the last is completed from the start (wrapping) - rule 3."""
    padded = items + [items[i % len(items)] for i in range(-len(items) % size)]
    return [tuple(padded[i:i + size]) for i in range(0, len(padded), size)]


def _weighted_pick(candidates: list[int], weights: list[float], u: float) -> int:
    """The candidate whose cumulative-weight slot holds u in [0, 1): one draw per pick."""
    total = sum(weights)
    acc = 0.0
    for candidate, w in zip(candidates, weights, strict=True):
        acc += w / total
        if u < acc:
            return candidate
    return candidates[-1]  # u within rounding of 1.0


def _digest(item_buckets: Sequence[BucketKey]) -> str:
    h = hashlib.sha1()
    for b in item_buckets:
        h.update(f"{int(b[0])}x{int(b[1])};".encode())
    return h.hexdigest()[:16]


def _layout_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    changes = [f"{key} was {saved.get(key)!r}, now {now[key]!r}"
               for key in ("seed", "batch_size", "grad_accum", "num_processes")
               if saved.get(key) != now[key]]
    old = [tuple(x) for x in saved.get("datasets", [])]
    new = [tuple(x) for x in now["datasets"]]
    if old != new:
        changes.append("datasets changed: " + ", ".join(_dataset_changes(old, new)))
    return changes


def _dataset_changes(old: list[tuple], new: list[tuple]) -> list[str]:
    """What differs between two layouts' dataset entries [id, items, repeats,
    probability, bucket digest], in words."""
    before, after = {x[0]: x for x in old}, {x[0]: x for x in new}
    out = [f"'{i}' removed" for i in before if i not in after]
    out += [f"'{i}' added" for i in after if i not in before]
    for i in (i for i in after if i in before):
        was, now = before[i], after[i]
        out += [f"'{i}' {name} {was[k]} -> {now[k]}"
                for k, name in ((1, "items"), (2, "repeats"), (3, "probability"))
                if was[k] != now[k]]
        if was[1] == now[1] and was[4:] != now[4:]:
            out.append(f"'{i}' buckets changed")
    return out or ["their order changed"]
