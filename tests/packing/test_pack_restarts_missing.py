"""Pack where a worker cannot load ``fastfeed._jpegroi`` (``FASTFEED_NO_JPEGROI=1`` there).

JPEG restart markers are on by default where the extension is built, and nothing else writes
the same bytes: every shard gets them or none does, decided once by the driver. The Ray test
runs a local 1-CPU Ray whose workers (not this driver) have the extension switched off; the
local tests run the process-pool packer (2 workers) with it switched off.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterator

import pytest

from _pack_data import shard_samples, tree_digest
from fastfeed.decode import roi
from fastfeed.errors import ConfigError
from fastfeed.packing.api import pack, plan_pack
from fastfeed.packing.write import write_shard
from tools.synth import make_image_folder

needs_ext = pytest.mark.skipif(not roi.built(), reason="fastfeed._jpegroi not built")
OFF = {roi.NO_EXTENSION_ENV: "1"}
RESTART = b"\xff\xdd\x00\x04"  # DRI: a restart interval


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("rst") / "train", num_images=8, num_classes=2, size=(64, 48))


def _markers(dst: Path) -> list[bool]:
    return [RESTART in s["jpg"][:2000] for s in shard_samples(dst)]


@pytest.fixture(scope="module")
def ray_without_ext_in_workers() -> Iterator[Any]:
    """A local Ray (1 CPU) whose worker processes have FASTFEED_NO_JPEGROI=1; this driver does not."""
    ray = pytest.importorskip("ray", reason="ray is in the [ray] extra")
    from tools.ray_local import RAY_ENV

    mp = pytest.MonkeyPatch()
    for k, v in RAY_ENV.items():
        mp.setenv(k, v)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.WARNING,
             runtime_env={"env_vars": OFF})
    try:
        yield ray
    finally:
        ray.shutdown()
        mp.undo()


@needs_ext
@pytest.mark.ray
def test_ray_workers_without_the_extension_pack_every_shard_without_markers(
    ray_without_ext_in_workers: Any, src: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="fastfeed.pack.ray"):
        idx = pack(src, tmp_path / "ray", engine="ray", samples_per_shard=3)
    assert idx.num_samples == 8 and len(idx.shards) == 3
    warned = [r.getMessage() for r in caplog.records if "without restart markers" in r.getMessage()]
    assert len(warned) == 1 and "FASTFEED_NO_JPEGROI is set" in warned[0] and "in every shard" in warned[0]
    assert not any(_markers(tmp_path / "ray"))
    assert "jpeg_restarts" not in json.loads((tmp_path / "ray" / "index.json").read_text())["options"]
    pack(src, tmp_path / "local", samples_per_shard=3, jpeg_restarts=False)
    assert tree_digest(tmp_path / "ray") == tree_digest(tmp_path / "local")  # the same bytes
    # asked for explicitly: an error naming the node, before anything is written
    with pytest.raises(ConfigError, match=r"jpeg_restarts=True needs .* on every Ray node.*FASTFEED_NO_JPEGROI"):
        pack(src, tmp_path / "asked", engine="ray", samples_per_shard=3, jpeg_restarts=True)
    assert not (tmp_path / "asked").exists()


def test_local_pool_without_the_extension_packs_without_markers(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(roi.NO_EXTENSION_ENV, "1")  # the driver and its pool's workers
    with caplog.at_level(logging.WARNING, logger="fastfeed.pack"):
        idx = pack(src, tmp_path / "off", samples_per_shard=3, workers=2)
    assert idx.num_samples == 8 and not any(_markers(tmp_path / "off"))
    assert any("without restart markers" in r.getMessage() for r in caplog.records)
    pack(src, tmp_path / "plain", samples_per_shard=3, workers=2, jpeg_restarts=False)
    assert tree_digest(tmp_path / "off") == tree_digest(tmp_path / "plain")
    with pytest.raises(ConfigError, match="jpeg_restarts=True needs"):
        pack(src, tmp_path / "asked", samples_per_shard=3, workers=2, jpeg_restarts=True)


@needs_ext
def test_a_writer_without_the_extension_refuses_a_plan_with_markers(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process that cannot add the markers (a Ray node that joined later) says so; it
    never writes a shard with other bytes than the rest of the pack."""
    plan = plan_pack(src, tmp_path / "o", samples_per_shard=3)  # planned here, with the extension
    assert plan.options.jpeg_restarts
    monkeypatch.setenv(roi.NO_EXTENSION_ENV, "1")
    with pytest.raises(ConfigError, match=r"shard-0+\.tar: this pack adds JPEG restart markers.*"
                                          r"FASTFEED_NO_JPEGROI is set.*--no-jpeg-restarts"):
        write_shard(plan, 0)
    monkeypatch.delenv(roi.NO_EXTENSION_ENV)
    assert write_shard(plan, 0).samples == 3
