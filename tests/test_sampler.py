"""The multi-dataset sampler: what each process trains on, step by step, and resume."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from core.data.sampler import (
    MultiDatasetSampler,
    SampledBatch,
    SamplerStateError,
    SourceDataset,
)

SQ, WIDE, TALL = (512, 512), (640, 384), (384, 640)


def ds(id: str, *groups: tuple[tuple[int, int], int], repeats: int = 1,
       probability: float = 1.0) -> SourceDataset:
    """A dataset with `n` items in each listed bucket, interleaved like a real folder."""
    buckets = [b for b, n in groups for _ in range(n)]
    random.Random(id).shuffle(buckets)
    return SourceDataset(id, buckets, repeats=repeats, probability=probability)


def take(sampler: MultiDatasetSampler, n: int) -> list[SampledBatch]:
    return list(itertools.islice(iter(sampler), n))


def test_one_dataset_epoch_covers_every_item_in_one_bucket_batches() -> None:
    d = ds("a", (SQ, 8), (WIDE, 4))
    s = MultiDatasetSampler([d], batch_size=2, seed=1)
    assert s.steps_per_epoch() == 6
    batches = s.epoch_batches(0)
    assert len(batches) == 6
    seen = Counter(i for b in batches for i in b.item_indices)
    assert seen == Counter(range(12))  # each item exactly once
    for b in batches:
        assert len(b.item_indices) == 2
        assert {d.item_buckets[i] for i in b.item_indices} == {b.bucket}  # never mixed
    assert [b.step for b in batches] == list(range(6))
    # the infinite iterator yields the same epoch, then goes on with epoch 1
    got = take(s, 8)
    assert got[:6] == batches and got[6].epoch == 1 and got[6].step == 6


def test_each_epoch_is_reshuffled_and_the_seed_reproduces_it() -> None:
    d = ds("a", (SQ, 20))
    s = MultiDatasetSampler([d], batch_size=2, seed=7)
    e0 = [b.item_indices for b in s.epoch_batches(0)]
    e1 = [b.item_indices for b in s.epoch_batches(1)]
    assert e0 != e1
    again = MultiDatasetSampler([d], batch_size=2, seed=7)
    assert [b.item_indices for b in again.epoch_batches(0)] == e0
    other = MultiDatasetSampler([d], batch_size=2, seed=8)
    assert [b.item_indices for b in other.epoch_batches(0)] != e0


def test_global_random_state_is_neither_used_nor_touched() -> None:
    d = ds("a", (SQ, 12), (WIDE, 6))
    random.seed(1)
    before = random.getstate()
    first = MultiDatasetSampler([d], batch_size=2, seed=3).epoch_batches(0)
    assert random.getstate() == before
    random.seed(999)
    assert MultiDatasetSampler([d], batch_size=2, seed=3).epoch_batches(0) == first


def test_several_datasets_are_all_exhausted_and_probability_shapes_the_order() -> None:
    big = ds("big", (SQ, 40), probability=4.0)
    small = ds("small", (SQ, 40), probability=1.0)
    s = MultiDatasetSampler([big, small], batch_size=1, seed=0)
    batches = s.epoch_batches(0)
    assert len(batches) == 80 == s.steps_per_epoch()
    ids = [b.dataset_id for b in batches]
    assert Counter(ids) == {"big": 40, "small": 40}  # the epoch ends when all are exhausted
    assert ids[:40].count("big") > 28  # 4:1 weight dominates until "big" runs out
    assert ids[-10:] == ["small"] * 10  # afterwards only the dataset left is picked
    for b in batches:
        assert b.dataset_id == ("big", "small")[b.dataset_index]


def test_probability_help_says_it_orders_the_epoch_and_repeats_mix_it() -> None:
    """What the form, docs/config.md and the README tell users matches the test above:
    every dataset is used up each epoch whatever its weight."""
    from dataclasses import fields

    from core.config.schema import DatasetConfig

    help_of = {f.name: f.metadata["help"] for f in fields(DatasetConfig)}
    assert help_of["probability"].startswith("Order within an epoch, not the mix")
    assert "used up each epoch" in help_of["probability"]
    assert "Change the mix with repeats" in help_of["probability"]
    assert "the mix" in help_of["repeats"]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert "`probability` only changes the order within the epoch" in readme


def test_zero_probability_dataset_is_never_picked_nor_counted() -> None:
    used = ds("used", (SQ, 6))
    off = ds("off", (SQ, 100), probability=0.0)
    s = MultiDatasetSampler([used, off], batch_size=2, seed=0)
    assert s.steps_per_epoch() == 3
    assert [x.items_per_epoch for x in s.dataset_summaries()] == [6, 0]
    assert {b.dataset_id for b in take(s, 30)} == {"used"}
    with pytest.raises(ValueError, match="every dataset has probability 0"):
        MultiDatasetSampler([off], batch_size=1)


def test_repeats_multiply_the_items_per_epoch() -> None:
    d = ds("a", (SQ, 5), (TALL, 3), repeats=3)
    s = MultiDatasetSampler([d], batch_size=1, seed=2)
    assert s.steps_per_epoch() == 24
    seen = Counter(i for b in s.epoch_batches(0) for i in b.item_indices)
    assert seen == {i: 3 for i in range(8)}


def test_partial_bucket_batches_are_padded_not_dropped() -> None:
    # 5 square items and a single wide one, batch 2: nobody is left out of the epoch.
    d = ds("a", (SQ, 5), (WIDE, 1))
    s = MultiDatasetSampler([d], batch_size=2, seed=4)
    [summary] = s.dataset_summaries()
    assert summary.micro_batches == 4 and summary.padded == 2
    batches = s.epoch_batches(0)
    assert len(batches) == 4
    seen = Counter(i for b in batches for i in b.item_indices)
    assert set(seen) == set(range(6))
    assert sum(seen.values()) == 8  # two slots re-use an item of the same bucket
    wide = [b for b in batches if b.bucket == WIDE]
    assert len(wide) == 1 and len(set(wide[0].item_indices)) == 1


def test_exhaustion_mid_accumulation_completes_the_optimizer_step() -> None:
    # 5 micro-batches of real data with grad_accum 2: the third step needs one more.
    a = ds("a", (SQ, 3))
    b = ds("b", (WIDE, 2))
    s = MultiDatasetSampler([a, b], batch_size=1, grad_accum=2, seed=5)
    assert s.steps_per_epoch() == 3 and s.micro_batches_per_epoch() == 6
    got = take(s, 12)  # two epochs
    assert [g.epoch for g in got] == [0] * 6 + [1] * 6
    assert [g.step for g in got] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert [g.accum_index for g in got] == [0, 1] * 6
    assert [g.is_fill for g in got[:6]] == [False] * 5 + [True]
    fill = got[5]
    assert len(fill.item_indices) == 1
    source = (a, b)[fill.dataset_index]
    assert source.item_buckets[fill.item_indices[0]] == fill.bucket
    real = Counter((g.dataset_id, g.item_indices[0]) for g in got[:5])
    assert real == {("a", 0): 1, ("a", 1): 1, ("a", 2): 1, ("b", 0): 1, ("b", 1): 1}


def _run_ranks(n: int, datasets: list[SourceDataset], **kw: int) -> list[list[SampledBatch]]:
    samplers = [MultiDatasetSampler(datasets, num_processes=n, process_index=k, **kw)
                for k in range(n)]
    return [take(s, 2 * s.micro_batches_per_epoch() + 3) for s in samplers]


@pytest.mark.parametrize("n", [2, 3])
def test_ranks_stay_in_sync_and_slice_one_global_batch(n: int) -> None:
    datasets = [ds("a", (SQ, 13), (WIDE, 7)), ds("b", (TALL, 9), repeats=2, probability=0.5),
                ds("c", (SQ, 4), probability=0.0)]
    runs = _run_ranks(n, datasets, batch_size=2, grad_accum=3, seed=11)
    assert len({len(r) for r in runs}) == 1
    # what one process with the whole global batch would train on, step by step
    whole = take(MultiDatasetSampler(datasets, batch_size=2 * n, grad_accum=3, seed=11),
                 len(runs[0]))
    for step, ref in zip(zip(*runs, strict=True), whole, strict=True):
        shared = {(b.dataset_index, b.bucket, b.epoch, b.step, b.micro_step, b.is_fill)
                  for b in step}
        assert shared == {(ref.dataset_index, ref.bucket, ref.epoch, ref.step, ref.micro_step,
                           ref.is_fill)}  # same dataset, bucket and step on every rank
        assert all(len(b.item_indices) == 2 for b in step)
        assert [i for b in step for i in b.item_indices] == ref.item_indices  # rank k: slice k
    # every rank leaves the epoch at the same step
    epoch_ends = [[b.step for b in r if b.accum_index == 2 and b.epoch == 0][-1] for r in runs]
    assert len(set(epoch_ends)) == 1


def test_ranks_split_each_global_batch_without_overlap() -> None:
    d = ds("a", (SQ, 24))
    runs = _run_ranks(3, [d], batch_size=2, seed=0)
    for step in zip(*runs, strict=True):
        slots = [i for b in step for i in b.item_indices]
        assert len(set(slots)) == 6
    first_epoch = [i for r in runs for b in r[:4] for i in b.item_indices]
    assert sorted(first_epoch) == list(range(24))  # together the ranks see every item once


def _resume_case() -> tuple[list[SourceDataset], dict[str, int]]:
    datasets = [ds("a", (SQ, 7), (WIDE, 5)), ds("b", (TALL, 4), repeats=2, probability=2.0)]
    return datasets, {"batch_size": 2, "grad_accum": 2, "seed": 3}


@pytest.mark.parametrize("k", [0, 1, 5, 11, 12, 13, 19, 24])
def test_resume_mid_epoch_and_across_the_epoch_boundary(k: int) -> None:
    datasets, kw = _resume_case()
    uninterrupted = take(MultiDatasetSampler(datasets, **kw), 30)
    assert MultiDatasetSampler(datasets, **kw).micro_batches_per_epoch() == 12  # 11 real + 1 fill
    first = MultiDatasetSampler(datasets, **kw)
    assert take(first, k) == uninterrupted[:k]
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    resumed = MultiDatasetSampler(datasets, **kw)
    resumed.load_state_dict(state)
    assert take(resumed, 30 - k) == uninterrupted[k:]


def test_resume_with_a_changed_layout_is_refused_or_restarts_the_next_epoch() -> None:
    datasets, kw = _resume_case()
    first = MultiDatasetSampler(datasets, **kw)
    take(first, 4)  # two optimizer steps into epoch 0
    state = first.state_dict()
    two_gpus = MultiDatasetSampler(datasets, num_processes=2, **kw)
    with pytest.raises(SamplerStateError, match="num_processes was 1, now 2"):
        two_gpus.load_state_dict(state)
    two_gpus.load_state_dict(state, strict=False)
    nxt = take(two_gpus, 1)[0]
    assert nxt.epoch == 1 and nxt.step == 2  # two whole steps were done before
    grown = [datasets[0], ds("b", (TALL, 5), repeats=2, probability=2.0)]
    with pytest.raises(SamplerStateError, match="datasets changed: 'b' items 4 -> 5"):
        MultiDatasetSampler(grown, **kw).load_state_dict(state)
    assert MultiDatasetSampler(datasets, **kw).layout_changes(state) == []
    renamed = [datasets[0], ds("c", (TALL, 4), repeats=3, probability=2.0)]
    assert MultiDatasetSampler(renamed, **kw).layout_changes(state) == [
        "datasets changed: 'b' removed, 'c' added"]
    more = [datasets[0], ds("b", (TALL, 4), repeats=3, probability=1.0)]
    assert MultiDatasetSampler(more, **kw).layout_changes(state) == [
        "datasets changed: 'b' repeats 2 -> 3, 'b' probability 2.0 -> 1.0"]


def test_bad_settings_are_named() -> None:
    d = ds("a", (SQ, 4))
    with pytest.raises(ValueError, match="process_index 2 must be below num_processes 2"):
        MultiDatasetSampler([d], batch_size=1, num_processes=2, process_index=2)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        MultiDatasetSampler([d], batch_size=0)
    with pytest.raises(ValueError, match=r"dataset 1 \('empty'\) has no items"):
        MultiDatasetSampler([d, SourceDataset("empty", [])], batch_size=1)
    with pytest.raises(ValueError, match=r"dataset 0 \('a'\): repeats"):
        MultiDatasetSampler([SourceDataset("a", [SQ], repeats=0)], batch_size=1)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_regularization_batches_interleave_and_every_rank_weighs_the_same_step(n: int
                                                                              ) -> None:
    import dataclasses

    instance = ds("subject", (SQ, 6), (WIDE, 4), repeats=3)
    prior = dataclasses.replace(ds("class", (SQ, 20), (TALL, 10)), regularization=True)
    runs = _run_ranks(n, [instance, prior], batch_size=2, grad_accum=2, seed=5)
    for step in zip(*runs, strict=True):
        # one dataset per micro-step on every rank, so every rank applies the same weight
        assert len({(b.dataset_index, b.regularization) for b in step}) == 1
        assert step[0].regularization == (step[0].dataset_id == "class")
    flags = [b.regularization for b in runs[0][:20]]
    assert True in flags and False in flags  # both kinds within the first steps
    # the flag does not change the plan: a run without it draws the very same batches
    plain = _run_ranks(n, [instance, dataclasses.replace(prior, regularization=False)],
                       batch_size=2, grad_accum=2, seed=5)
    assert [[(b.dataset_index, b.item_indices) for b in r] for r in runs] == \
        [[(b.dataset_index, b.item_indices) for b in r] for r in plain]
    summary = MultiDatasetSampler([instance, prior], batch_size=2).dataset_summaries()
    assert [s.regularization for s in summary] == [False, True]
