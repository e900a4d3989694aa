"""One micro-batch's forward and backward (`micro_step`), and the steps between two reads
of the loss (train.log_every): their losses stay on the device until then, so the loop
never waits for the device in between.

Reading a loss (float(tensor), .item()) makes the host wait until the device has run
every queued kernel; doing that every step leaves a GPU idle while the host prepares the
next step (reads the cache, collates, copies). Without the wait the host prepares step
k+1 while the device still runs step k, which is the prefetch a GPU needs (the batch's
copy is non-blocking from pinned memory: core/train/batches.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.config import Config
from core.config.preserve import preserved_weights
from core.data.collate import collate
from core.train.batches import to_device
from core.train.guidance_target import unconditional_prediction, unguided
from core.train.preserve import base_prediction
from core.train.routing import routed_step

if TYPE_CHECKING:
    from core.train.setup import Setup

GPU_LOG_EVERY = 10


def prior_weight(cfg: Config, batch_plan: Any) -> float:
    """train.prior_loss_weight for a micro-batch of a regularization dataset, else 1. A
    micro-batch holds one dataset on every process, so all processes weigh it alike."""
    return cfg.train.prior_loss_weight if batch_plan.regularization else 1.0


def micro_step(setup: Setup, cfg: Config, batch_plan: Any) -> Any:
    """Forward and backward for one micro-batch; returns the detached loss."""
    acc, family, comps = setup.accelerator, setup.family, setup.components
    dataset = setup.datasets[batch_plan.dataset_index]
    trained = comps.text_encoders if setup.trained_encoders else []
    # Inside accumulate: a trained text encoder's forward is part of the step that
    # DDP synchronises (or not, between accumulation steps).
    # Routing (train.token_routing) is armed through the backward, whose checkpointed
    # blocks run their forwards again with the same draw.
    with acc.accumulate(comps.denoiser, *trained), routed_step(setup.router, comps.denoiser):
        first = setup.texts.process_index * len(batch_plan.item_indices)  # global slot
        loaded = [dataset.load(i, dataset.flips(i, cfg.train.seed, batch_plan.micro_step,
                                                first + j))
                  for j, i in enumerate(batch_plan.item_indices)]
        items = setup.texts.apply(comps, batch_plan.dataset_index, loaded,
                                  batch_plan.micro_step)
        batch = to_device(collate(items), acc.device, setup.weight_dtype)
        sample = family.noise_and_target(comps, batch["latents"],
                                         noise_offset=cfg.train.noise_offset)
        sample.mask = batch.get("loss_mask")  # datasets.N.masks (None: unmasked)
        weight = prior_weight(cfg, batch_plan)
        preserve = preserved_weights(cfg).get(batch_plan.dataset_id)
        if preserve is not None:  # datasets.N.preserve: the base's output is the target
            sample.target, weight = base_prediction(setup, sample, batch), weight * preserve
        scale = cfg.train.guidance_target_scale if preserve is None else 0.0
        if scale > 0:  # read before the trained forward: its route draw stays the same
            unconditional = unconditional_prediction(setup, sample,
                                                     batch_plan.dataset_index, items)
        with acc.autocast():
            prediction = family.predict(comps, sample, batch)
        if scale > 0:
            prediction = unguided(prediction.float(), unconditional, scale)
        loss = family.loss(comps, prediction.float(), sample, cfg.train.min_snr_gamma)
        loss = loss * weight
        acc.backward(loss)
        if acc.sync_gradients and cfg.train.max_grad_norm > 0:
            acc.clip_grad_norm_(setup.params, cfg.train.max_grad_norm)
        setup.optimizer.step()
        setup.optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def log_interval(log_every: int, device: Any) -> int:
    """train.log_every resolved: 0 is every step on the CPU, GPU_LOG_EVERY elsewhere."""
    if log_every:
        return log_every
    import torch

    return 1 if torch.device(device).type == "cpu" else GPU_LOG_EVERY


@dataclass
class PendingSteps:
    """Steps done whose losses are still on the device: (step, loss tensor, lr, epoch)."""

    every: int
    rows: list[tuple[int, Any, float, int]] = field(default_factory=list)

    def add(self, step: int, losses: list[Any], lr: float, epoch: int) -> None:
        import torch

        self.rows.append((step, torch.stack(losses).mean().float(), lr, epoch))

    def due(self, step: int, first: bool, other: bool) -> bool:
        """Read now: every `every` steps, at the launch's first step (the start-up
        report), or when `other` (a round, the last step, a stop) follows this step."""
        return first or other or step % self.every == 0

    def read(self, accelerator: Any, stop: Any) -> tuple[list[tuple[int, float, float, int]],
                                                         bool]:
        """The pending steps with their losses (the mean over every process) and whether
        any process was asked to stop, in one read (one collective when distributed), so
        all processes stop at the same step."""
        import torch

        local = torch.stack([row[1] for row in self.rows])
        wanted = 1.0 if stop.requested() else 0.0
        if accelerator.num_processes == 1:
            losses, stopping = local.tolist(), wanted > 0
        else:
            both = torch.cat([local, torch.tensor([wanted], device=local.device)])
            gathered = accelerator.gather(both.unsqueeze(0))  # [processes, steps + 1]
            losses = gathered[:, :-1].mean(0).tolist()
            stopping = bool(gathered[:, -1].max() > 0)
        rows = [(step, loss, lr, epoch)
                for (step, _, lr, epoch), loss in zip(self.rows, losses, strict=True)]
        self.rows = []
        return rows, stopping
