"""Each family's declared geometry (core/models/geometry.py) is its real model's: the
VAE config in its full_size/ folder (random:<family>) gives the same latent channels and
spatial and temporal compression, and its sample sides fit the shared buckets. A family
that declares a wrong number fails here, not in a memory estimate or a cache build."""

from __future__ import annotations

import json

import pytest

from core.data.buckets import BUCKET_MULTIPLE
from core.models.full_size import full_size_dir
from core.models.geometry import Geometry, vae_geometry
from core.models.registry import get_family, list_families


def full_size_vae(name: str) -> dict:
    return json.loads((full_size_dir(name) / "vae" / "config.json").read_text())


@pytest.mark.parametrize("name", list_families())
def test_the_declared_geometry_is_the_real_vaes(name: str) -> None:
    geometry = get_family(name).geometry
    channels, spatial, temporal = vae_geometry(full_size_vae(name))
    assert (geometry.latent_channels, geometry.spatial_compression) == (channels, spatial)
    assert geometry.temporal_compression == temporal, name
    assert BUCKET_MULTIPLE % geometry.spatial_multiple == 0, "a bucket side fits the model"
    assert geometry.spatial_multiple % geometry.spatial_compression == 0


def test_a_frame_rule_names_the_nearest_counts_that_work() -> None:
    ltx_like = Geometry(video=True, frame_step=8, temporal_compression=8)
    assert [n for n in range(30) if ltx_like.valid_frames(n)] == [1, 9, 17, 25]
    assert ltx_like.latent_frames(121) == 16
    assert ltx_like.frames_hint(20).startswith("20 frames is not 8k + 1 (1, 9, 17, 25, 33")
    assert ltx_like.frames_hint(20).endswith("use 17 or 25")
    assert Geometry(video=True).valid_frames(6) and Geometry().frame_rule() == "any count"


def test_the_frames_check_reads_the_familys_rule() -> None:
    from core.config import Config, DatasetConfig
    from core.config.checks import validate_config

    cfg = Config(datasets=[DatasetConfig(id="a", images="i", vae_cache="c", frames=16)])
    cfg.model.family = "wan"
    frames = [p for p in validate_config(cfg) if p.where == "datasets.0.frames"]
    assert len(frames) == 1 and "4k + 1" in frames[0].message
    assert frames[0].message.endswith("use 13 or 17")


def test_a_frame_rate_of_0_is_the_familys_own(tmp_path) -> None:
    """Every video family declares the rate its models train and sample at, and the config
    a run reads (`resolved`) takes it where datasets.N.fps or validation.fps is 0, the
    default; a rate the config names stays, and a still-image family has none."""
    from core.config import Config, DatasetConfig, resolved

    rates = {name: get_family(name).geometry.fps for name in list_families()}
    assert {n: r for n, r in rates.items() if r} == {"wan": 16, "ltx2": 24,
                                                     "hunyuan_video15": 24}
    assert all(bool(rates[n]) == get_family(n).geometry.video for n in rates)
    named = DatasetConfig(id="b", images="j", vae_cache="d", fps=8.0)
    cfg = Config(datasets=[DatasetConfig(id="a", images="i", vae_cache="c"), named])
    for family, rate in (("ltx2", 24.0), ("wan", 16.0), ("sd15", 0.0)):
        cfg.model.family = family
        run = resolved(cfg, tmp_path)
        assert [ds.fps for ds in run.datasets] == [rate, 8.0]
        assert run.validation.fps == rate and cfg.validation.fps == 0.0
