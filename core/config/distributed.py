"""launch.distributed: which strategy several processes train with, and what each allows.

- ddp (the default): every process holds the whole model; gradients are averaged.
- fsdp: accelerate's FSDP2 plugin shards the denoiser's weights, gradients and optimizer
  state across the processes (core/train/sharding.py). Full fine-tunes only: a LoRA's
  trainable part is small (DDP costs little there), and the LoRA save, the checkpoints
  and EMA here read the trained weights unsharded on the main process.
- deepspeed: refused. DeepSpeed is not installed here (no CUDA toolkit to build its ops
  on these CPU machines), so it cannot be tested; it is not shipped untested.
"""

from __future__ import annotations

from core.config.schema import Config
from core.problems import Problem, error, warning


def distributed_problems(cfg: Config) -> list[Problem]:
    """The rules of launch.distributed, each naming the key and what to do."""
    strategy = cfg.launch.distributed
    if strategy == "deepspeed":
        return [error("launch.distributed", "\"deepspeed\" is not supported: DeepSpeed is not "
                                            "installed or tested with this tool; use \"fsdp\" "
                                            "(accelerate's FSDP2) to shard a full fine-tune, "
                                            "or \"ddp\"")]
    if strategy != "fsdp":
        return []
    out: list[Problem] = []
    if cfg.train.method != "full":
        out.append(error("launch.distributed", "\"fsdp\" shards a full fine-tune only; with "
                                               f"train.method = \"{cfg.train.method}\" use "
                                               "\"ddp\" (a LoRA's trained weights are small, "
                                               "so DDP costs little) or train.method = "
                                               "\"full\""))
    if cfg.train.ema:
        out.append(error("train.ema", "EMA keeps an unsharded copy of the weights, which "
                                      "launch.distributed = \"fsdp\" cannot feed; set "
                                      "train.ema = false or launch.distributed = \"ddp\""))
    if cfg.launch.num_processes * cfg.launch.num_machines == 1:
        out.append(warning("launch.distributed", "\"fsdp\" with one process shards nothing; "
                                                 "it trains as a single process (raise "
                                                 "launch.num_processes to shard)"))
    return out
