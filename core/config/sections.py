"""The config's run-side sections: where the text cache and the run's folder are, how
the run is launched (processes, machines, the card it is planned for), what it logs to,
and the captioning job's settings. One dataclass per TOML section, as in schema.py,
which assembles them into `Config`."""

from __future__ import annotations

from dataclasses import dataclass

from core.fields import _f

DISTRIBUTED_CHOICES = ("ddp", "fsdp", "deepspeed")  # launch.distributed (issue 26 item 7)


@dataclass
class TextCacheConfig:
    dir: str = _f("cache/text", label="Text-embedding cache folder", kind="path")


@dataclass
class LoggingConfig:
    tensorboard: bool = _f(True, label="TensorBoard",
                           help="Write loss, learning rate, eval losses and validation images "
                                "to <output folder>/tensorboard/.")
    wandb_project: str = _f("", label="Weights & Biases project", advanced=True,
                            help="Also log to this W&B project (needs wandb installed and "
                                 "logged in); empty disables.")


@dataclass
class CaptioningConfig:
    model: str = _f("", label="Captioning model",
                    help="A transformers image-to-text model (BLIP, Florence-2, ...): a hub "
                         "id in the local cache or a folder; tiny:blip is a tiny random "
                         "one built offline, to try captioning (random words).")
    datasets: list[str] = _f([], label="Datasets to caption",
                             help="Dataset ids; empty captions every dataset with textfile "
                                  "captions.")
    prefix: str = _f("", label="Caption prefix", help="Put before every caption (a trigger "
                                                      "word, say).")
    suffix: str = _f("", label="Caption suffix")
    batch_size: int = _f(4, label="Captioning batch size", min=1, max=1024)
    max_new_tokens: int = _f(40, label="Caption length (tokens)", min=1, max=1024,
                             advanced=True)
    overwrite: bool = _f(False, label="Overwrite captions",
                         help="Off: only images without a caption get one. On: every image "
                              "is captioned and old captions are kept as .txt.bak.")


@dataclass
class OutputConfig:
    dir: str = _f("runs/run", label="Output folder", kind="path")


@dataclass
class LaunchConfig:
    num_processes: int = _f(1, label="Processes", min=1, max=4096,
                            help="Processes per machine (usually one per GPU).")
    cpu: bool = _f(False, label="Force CPU")
    num_machines: int = _f(1, label="Machines", min=1, max=4096, advanced=True)
    machine_rank: int = _f(0, label="Machine rank", min=0, max=4095, advanced=True)
    main_process_ip: str = _f("", label="Main process IP", advanced=True)
    main_process_port: int = _f(29500, label="Main process port", min=1, max=65535,
                                advanced=True)
    timeout_minutes: int = _f(60, label="Collective timeout (minutes)", min=1, max=10080,
                              advanced=True,
                              help="How long processes wait for each other at a collective "
                                   "(a long validation or full-model save on rank 0).")
    join_timeout_minutes: int = _f(10, label="Join timeout (minutes)", min=1, max=10080,
                                   advanced=True,
                                   help="Multi-machine runs: how long a machine waits for "
                                        "the others to join before it gives up.")
    gpu_memory_gib: float = _f(0.0, label="Plan for a GPU of (GiB)", min=0.0, max=4096.0,
                               advanced=True,
                               help="The memory estimate compares with a card of this size "
                                    "instead of this machine's GPU (0: the GPU found here), "
                                    "to plan a run for another machine.")
    host_memory_gib: float = _f(0.0, label="Plan for host RAM of (GiB)", min=0.0, max=65536.0,
                                advanced=True,
                                help="The check compares the run's host memory peak (the "
                                     "model as loaded, swapped blocks, the processes) with "
                                     "this much RAM per machine instead of this machine's "
                                     "(0: this machine's), to plan a run for another one.")
    distributed: str = _f("ddp", label="Distributed strategy", choices=DISTRIBUTED_CHOICES,
                          advanced=True,
                          help="Several processes: ddp keeps a whole copy of the model on "
                               "every process; fsdp (accelerate's FSDP2) shards the weights, "
                               "gradients and optimizer state across them (full fine-tunes "
                               "only); deepspeed is not available (refused at check).")
