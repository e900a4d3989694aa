"""How a model's files load, with errors that name the path.

A `model.path` is classified once (core/models/source.py: tiny, random, folder, single
file, hub id); this module loads the kinds read from files. Folders and files are checked
against the configured family before any weights load (a folder's model_index.json, a
file's tensor names read from its JSON header); hub ids fail at once without network
instead of after minutes of retries. `check_model_source` runs the same checks for
`--stage check` without torch. (`fingerprint` and `resolve_dtype`, imported from here by
many, live in weights.py.)

torch and diffusers are imported inside the functions that need them, so importing this
module stays cheap (the registry and `--stage check` import it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.models.source import (  # noqa: F401  (the names loading's callers import)
    HUB_ID,
    ModelLoadError,
    SourceKind,
    classify_source,
    hub_cached,
    hub_error,
    hub_reachable,
    missing_local_path,
    model_source,
    safetensors_header,
)
from core.models.weights import fingerprint, resolve_dtype  # noqa: F401  (re-exported)
from core.problems import Problem, error, warning

# ---------------------------------------------------------------- loading from files


def from_pretrained(cls: Any, path: str, kind: SourceKind, what: str,
                    where: str | None = None, **kwargs: Any) -> Any:
    """`cls.from_pretrained(path, **kwargs)` (a model, tokenizer, scheduler or whole
    pipeline class) with errors that name the folder/id and `what` failed.

    Local folders load with local_files_only. Hub ids come from the HF cache when there,
    else from the hub when it is reachable; without network the error comes at once
    instead of after huggingface_hub's half a minute of retries.
    """
    try:
        return cls.from_pretrained(path, local_files_only=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every loader failure becomes one message
        if kind != "hub":
            raise ModelLoadError(where or path, f"cannot load {what} ({cls.__name__}): "
                                 f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        if not hub_reachable():
            raise hub_error(path, what) from exc
    try:
        return cls.from_pretrained(path, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise hub_error(path, what, exc) from exc


def load_component(cls: Any, path: str, kind: SourceKind, subfolder: str | None,
                   dtype: Any = None, **kwargs: Any) -> Any:
    """One component (`subfolder`: "unet", "vae", ...) through `from_pretrained`."""
    if dtype is not None:
        kwargs["dtype"] = dtype  # transformers 5 and diffusers 0.42 both spell it so
    if subfolder:
        kwargs["subfolder"] = subfolder
    where = str(Path(path) / subfolder) if subfolder and kind == "folder" else path
    return from_pretrained(cls, path, kind, subfolder or cls.__name__, where, **kwargs)


def read_model_index(folder: str) -> dict[str, Any]:
    """The index of a diffusers folder, model_index.json or a modular pipeline's
    (source.INDEX_FILES; classify_source checked that one exists)."""
    from core.models.source import index_file

    path = index_file(folder) or Path(folder) / "model_index.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(str(path), f"cannot be read as JSON: {exc}") from exc


def folder_families(folder: str) -> tuple[str, ...]:
    """Families whose pipeline class the folder's model_index.json names (empty: unknown)."""
    from core.models.registry import families

    name = str(read_model_index(folder).get("_class_name", ""))
    # The longest matching `pipeline_prefix` wins ("StableDiffusionXL" over
    # "StableDiffusion", "Flux2" over "Flux"); families sharing it all match (sd15, sd2).
    matches = [f for f in families() if f.pipeline_prefix and name.startswith(f.pipeline_prefix)]
    longest = max((len(f.pipeline_prefix) for f in matches), default=0)
    return tuple(f.name for f in matches if len(f.pipeline_prefix) == longest)


def check_folder_family(folder: str, family: str) -> None:
    """Raise when a diffusers folder clearly holds another family's pipeline."""
    families = folder_families(folder)
    if families and family not in families:
        cls = read_model_index(folder).get("_class_name")
        raise ModelLoadError(folder, f"holds a {cls} ({' or '.join(families)} model), not "
                             f"{family}: set model.family = \"{families[0]}\" or choose a "
                             f"{family} model")


def safetensors_keys(path: str) -> list[str]:
    """Tensor names of a .safetensors file from its JSON header."""
    return list(safetensors_header(path))


def detect_checkpoint_family(keys: list[str]) -> str | None:
    """The family an original-format checkpoint looks like, from its key names."""
    from core.models.registry import families

    # Each family's telltale key fragments (`single_file.markers`), the most specific
    # families first (`single_file.rank`): SDXL also has the SD UNet keys, FLUX.2 and
    # Chroma have Flux's block names.
    for family in sorted(families(), key=lambda f: f.single_file.rank):
        if any(marker in k for marker in family.single_file.markers for k in keys):
            return family.name
    return None


def check_file_family(path: str, family: str) -> str | None:
    """Raise when a single-file checkpoint looks like another family; return what it is."""
    from core.models import comfy_file
    from core.models.registry import family_or_defaults

    header = safetensors_header(path)
    found = detect_checkpoint_family(list(header))
    if found is not None and found not in (family,
                                           family_or_defaults(family).single_file.layout_of):
        raise ModelLoadError(path, f"looks like a {found} checkpoint, not {family}: set "
                             f"model.family = \"{found}\" or choose a {family} checkpoint")
    problem = (comfy_file.component_problem(list(header)) if found is None else None
               ) or comfy_file.layout_problem(header)
    if problem is None and comfy_file.layout(header) and not getattr(
            family_or_defaults(family), "transformer_class_name", ""):
        problem = (f"holds {comfy_file.layout(header)} weights, which are read only for the "
                   "families whose diffusion model loads from a file of its own "
                   f"(docs/quantization.md); {family} loads a bf16 file")
    if problem is not None:
        raise ModelLoadError(path, problem)
    return found


def checked_source(path: str, family: str) -> SourceKind:
    """`classify_source`, then refuse a folder or file that clearly holds another family,
    before any weights load."""
    kind = classify_source(path)
    if kind == "folder":
        check_folder_family(path, family)
    elif kind == "file":
        check_file_family(path, family)
    return kind


def configs_offline(config: str) -> bool:
    """The one offline rule of single-file loading (`local_files_only`): a local folder
    never needs the hub; a hub id is read from the HF cache when the hub is unreachable,
    so nothing waits on a minute of retries."""
    return (bool(config) and Path(config).is_dir()) or not hub_reachable()


def load_single_file_transformer(model_cls: Any, path: str, config: str, family: str,
                                 dtype: Any = None, state_dict: Any = None) -> Any:
    """A single file holding only the diffusion model (FLUX.2's, Z-Image's ComfyUI
    files): `model_cls.from_single_file` with the transformer/ config of `config`
    (model.config), offline by `configs_offline`; failures name the file and config.
    `state_dict`: the file's tensors already read (a de-scaled fp8 file), else None."""
    kwargs: dict[str, Any] = {"config": config, "subfolder": "transformer",
                              "local_files_only": configs_offline(config)}
    if dtype is not None:
        kwargs["torch_dtype"] = dtype
    try:
        return model_cls.from_single_file(path if state_dict is None else state_dict,
                                          **kwargs)
    except Exception as exc:  # noqa: BLE001 - every loader failure becomes one message
        raise ModelLoadError(path, f"cannot load this {family} single-file transformer with "
                             f"model.config = {config!r}: {type(exc).__name__}: "
                             f"{str(exc)[:300]}. {CONFIG_HINT}") from exc


def load_mapped_transformer(model_cls: Any, state_dict: dict[str, Any], path: str,
                            config: str, family: str, dtype: Any = None) -> Any:
    """A transformer from a single file's tensors already under its own names (a family
    that maps its original layout itself, diffusers having no converter for it): built
    empty from the transformer/ config of `config` (model.config), then given the tensors
    (every one of them, strictly); failures name the file and config."""
    from accelerate import init_empty_weights

    try:
        settings = model_cls.load_config(config, subfolder="transformer",
                                         local_files_only=configs_offline(config))
        with init_empty_weights():  # parameters on meta; buffers (rope tables) built
            model = model_cls.from_config(settings)
        model.load_state_dict(state_dict, strict=True, assign=True)
    except Exception as exc:  # noqa: BLE001 - every loader failure becomes one message
        raise ModelLoadError(path, f"cannot load this {family} single-file transformer with "
                             f"model.config = {config!r}: {type(exc).__name__}: "
                             f"{str(exc)[:300]}. {CONFIG_HINT}") from exc
    return (model.to(dtype) if dtype is not None else model).eval()


def load_single_file(pipeline_cls: Any, path: str, family: str, dtype: Any = None,
                     config: str | None = None, **kwargs: Any) -> Any:
    """`pipeline_cls.from_single_file` with errors that name the file or model.config
    (`checked_source` has checked the family).

    diffusers needs the architecture's diffusers configs (and tokenizers): from `config`
    (model.config: a local diffusers folder, or a hub id) or, without one, from the hub
    repo diffusers picks for the file's keys. Nothing is downloaded when the hub is
    unreachable: the configs must then be local or in the HF cache, else the error says
    what to put in model.config.
    """
    problem = single_file_config_problem(path, config or "", family)
    if problem is not None:
        raise ModelLoadError(problem.where, problem.message)
    if dtype is not None:
        kwargs["dtype"] = dtype
    if config:
        kwargs["config"] = config
    kwargs.setdefault("local_files_only", configs_offline(config or ""))
    source = f"model.config = {config!r}" if config else "diffusers' default configs"
    try:
        pipe = pipeline_cls.from_single_file(path, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(path, f"cannot load this {family} single-file checkpoint with "
                             f"{source}: {type(exc).__name__}: {str(exc)[:300]}. If the "
                             f"configs do not describe this file, {CONFIG_HINT}") from exc
    empty = _empty_modules(pipe)
    if empty:  # diffusers leaves weights it did not find on the meta device, silently
        raise ModelLoadError(path, f"{', '.join(empty)} found no weights in this file under "
                             f"the names {source} lead to: the file and the configs are of "
                             f"different architectures; {CONFIG_HINT}")
    return pipe


def _empty_modules(pipe: Any) -> list[str]:
    """Components of a loaded pipeline with parameters that hold no data (meta)."""
    import torch

    return [name for name, module in pipe.components.items()
            if isinstance(module, torch.nn.Module)
            and any(t.is_meta for t in (*module.parameters(), *module.buffers()))]


# ---------------------------------------------------------------- a single file's configs

CONFIG_HINT = ("set model.config to a diffusers folder (the one holding model_index.json and "
               "the unet, vae, text_encoder, tokenizer and scheduler configs) or a hub id of "
               "the file's architecture, e.g. the base model it was fine-tuned from "
               "(`huggingface-cli download <id> --exclude '*.safetensors' '*.bin'` fetches "
               "only the configs)")


def default_config_repo(path: str) -> str | None:
    """The hub repo whose configs diffusers' `from_single_file` uses for this file when no
    config is given (it guesses the architecture from tensor names and shapes), read from
    the header alone; None when diffusers cannot tell."""
    from types import SimpleNamespace

    from core.notices import quiet_libraries

    # diffusers' guess reads only the shapes of a few tensors: stand-ins carry them.
    shapes = {k: SimpleNamespace(shape=tuple(v.get("shape", ())))
              for k, v in safetensors_header(path).items()}
    try:
        with quiet_libraries():
            from diffusers.loaders.single_file_utils import fetch_diffusers_config

            return str(fetch_diffusers_config(shapes)["pretrained_model_name_or_path"])
    except Exception:  # noqa: BLE001 - an unknown layout: diffusers will say so at load
        return None


def config_source_problem(config: str, family: str) -> Problem | None:
    """What is wrong with a model.config value, without loading anything: it must be a
    diffusers folder of `family`, a tiny:<name> of it, or a hub id that is cached or
    downloadable."""
    where = "model.config"
    source = model_source(config)
    if source.kind == "tiny":  # a tiny model's folder, built at load (the tests')
        found = check_model_source(config, family, where)
        return found[0] if found else None
    if source.kind == "random":
        return error(where, f"{config} has no config files; {CONFIG_HINT}")
    p = Path(config).expanduser()
    if p.is_file():
        return error(where, f"{config} is a file; {CONFIG_HINT}")
    if p.is_dir():
        if not (p / "model_index.json").is_file():
            return error(where, f"{config} has no model_index.json, so it is not a diffusers "
                                f"folder; {CONFIG_HINT}")
        families = folder_families(config)
        if families and family not in families:
            cls = read_model_index(config).get("_class_name")
            return error(where, f"{config} holds a {cls} ({' or '.join(families)}), not a "
                                f"{family} model; point it at a {family} diffusers folder")
        return None
    if not HUB_ID.match(config):
        return error(where, f"{config} does not exist: it is not a folder and not a hub id "
                            f"(owner/name); {CONFIG_HINT}")
    if not hub_cached(config) and not hub_reachable():
        return error(where, f"{config} is neither a folder (relative paths are under the "
                            "workspace) nor a hub id in the HF cache, and there is no network "
                            "to download it: fix the folder's path, or download the hub id's "
                            "configs where there is network")
    return None


def single_file_config_problem(path: str, config: str, family: str) -> Problem | None:
    """Why single file `path` cannot find its configs (an error naming model.config), or
    None: a usable model.config, or none needed because diffusers' default configs for
    the file are in the HF cache or the hub is reachable."""
    if config:
        return config_source_problem(config, family)
    if hub_reachable():
        return None
    repo = default_config_repo(path)
    if repo is not None and hub_cached(repo):
        return None
    why = (f"diffusers would read the configs of {repo} for it, which are not in the HF "
           "cache" if repo else "diffusers cannot tell its architecture from its tensor names")
    return error("model.config", f"is empty, model.path {path} is a single-file checkpoint "
                                 f"and there is no network: {why}; {CONFIG_HINT}")


def check_model_config(path: str, config: str, family: str,
                       prediction_type: str = "auto") -> list[Problem]:
    """model.config and model.prediction_type for `--stage check` (model.path has passed
    `check_model_source`): a single file needs usable configs; a config beside a folder,
    hub id or built model is ignored (a warning); an SD2 file read with diffusers' default
    configs gets SD2-768's v-prediction unless prediction_type says otherwise."""
    if model_source(path).built or classify_source(path) != "file":
        if not config:
            return []
        return [warning("model.config", f"is only read for a single-file model.path; "
                                        f"{path} carries its own configs, so {config} is "
                                        "ignored (clear model.config)")]
    problem = single_file_config_problem(path, config, family)
    if problem is not None:
        return [problem]
    from core.models.registry import get_family

    problems = get_family(family).single_file.problems
    return problems(config, prediction_type) if problems else []


def check_model_source(path: str, family: str, where: str = "model.path",
                       workspace: str | Path | None = None) -> list[Problem]:
    """Problems with model.path for `--stage check`, without torch or loading weights.

    tiny:<family> and random:<family> must match the family (random: reads its shipped
    configs, builds nothing); a folder must be a diffusers folder of this
    family; a file must be a .safetensors that does not look like another family; a hub
    id must be cached or the hub reachable. A value that looks like a local path
    (`missing_local_path`, relative ones against `workspace`) and is absent is a missing
    folder, not a hub model missing from the HF cache.
    """
    source = model_source(path)
    if source.kind == "tiny":
        from core.models.tiny import tiny_family, tiny_names

        tiny = tiny_family(source.name)
        if tiny is None:
            return [error(where, f"unknown tiny model {path}; use one of "
                          + ", ".join(f"tiny:{n}" for n in tiny_names()))]
        if tiny != family:
            return [error(where, f"{path} is a {tiny} model but model.family is {family}; "
                          f"use tiny:{family}")]
        return []
    if source.kind == "random":
        from core.models.full_size.spec import check_random_source

        return check_random_source(path, family, where)
    missing = missing_local_path(path, workspace)
    if missing:
        return [error(where, missing)]
    try:
        kind = checked_source(path, family)
        if kind == "hub" and not hub_reachable() and not hub_cached(path):
            return [error(where, f"hub model {path} is not in the HF cache and there is no "
                          "network to download it: download it where there is network "
                          "(huggingface-cli download) or use a local folder/.safetensors")]
    except ModelLoadError as exc:
        p = exc.problem
        subject = path if p.where in (path, "model.path") else p.where
        return [error(where, f"{subject} {p.message}" if subject else p.message)]
    return []
