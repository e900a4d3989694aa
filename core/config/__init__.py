"""The one typed config: a TOML file with `version = 1` (keys in docs/config.md).

- schema.py: the dataclasses, one per section; their field metadata drives the rest.
- values.py: `convert_value`, the one conversion of TOML values, `--set` text and form
  values to a field's type, with messages that name the key.
- files.py: TOML in and out (`load_config`, `save_config`); presets round-trip exactly.
- overrides.py: `--set key=value` (`apply_overrides`).
- prompts.py: a validation prompt's own settings (kohya-style flags: `prompt_settings`,
  `prompt_text` for labels).
- checks.py: `validate_config` (ranges, choices, cross-key rules); paths.py: `resolved`
  (paths joined to the workspace).
"""

from core.config.checks import validate_config
from core.config.dataset import CAPTION_STRATEGIES
from core.config.files import (
    config_from_dict,
    config_to_dict,
    dumps_config,
    load_config,
    loads_config,
    save_config,
)
from core.config.overrides import apply_override, apply_overrides
from core.config.paths import resolve_path, resolved
from core.config.prompts import prompt_text
from core.config.schema import (
    CONFIG_VERSION,
    FAMILIES,
    SECTION_TYPES,
    SECTIONS,
    Config,
    DatasetConfig,
    LaunchConfig,
    ModelConfig,
    OutputConfig,
    TextCacheConfig,
    TrainConfig,
    ValidationConfig,
)
from core.config.values import convert_value, type_name
from core.fields import meta

__all__ = [
    "CAPTION_STRATEGIES", "CONFIG_VERSION", "FAMILIES", "SECTIONS", "SECTION_TYPES", "Config",
    "DatasetConfig", "LaunchConfig", "ModelConfig", "OutputConfig", "TextCacheConfig",
    "TrainConfig", "ValidationConfig", "apply_override", "apply_overrides", "config_from_dict",
    "config_to_dict", "convert_value", "dumps_config", "load_config", "loads_config", "meta",
    "prompt_text", "resolve_path", "resolved", "save_config", "type_name", "validate_config",
]
