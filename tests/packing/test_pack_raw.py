"""``pack --store raw|mixed:P``: pixels stored at pack time, in tar and LMDB, deterministic and resumable."""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest

import fastfeed
from fastfeed.cli import main
from fastfeed.decode.image import ImageDecoder
from fastfeed.errors import BadFileError, ConfigError
from fastfeed.packed.index import DatasetIndex
from fastfeed.packing.api import finalize, plan_pack, write_shard
from _pack_data import shard_samples, tree_digest
from _raw_data import write_raw_source


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[int, int]]]:
    root = tmp_path_factory.mktemp("raw") / "src"
    return root, write_raw_source(root)


def _source_bytes(root: Path, key: str) -> bytes:
    (path,) = [p for p in root.rglob("*") if p.is_file() and str(p.relative_to(root)).split(".")[0] == key]
    return path.read_bytes()


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_raw_store_holds_the_pixels_the_loader_decodes(src: tuple[Path, dict], tmp_path: Path, fmt: str) -> None:
    root, sizes = src
    idx = fastfeed.pack(root, tmp_path / "o", format=fmt, store="raw", samples_per_shard=7)
    raw = json.loads((tmp_path / "o" / "index.json").read_text())
    assert raw["fastfeed_index"] == 2 and raw["store"]["mode"] == "raw" and raw["options"]["store"] == "raw"
    assert "shapes.npy" in raw["arrays"] and set(idx.fields) == {"cls", "rgb8"}
    shapes = DatasetIndex.load(tmp_path / "o").shapes
    assert shapes.dtype == np.int32 and shapes.shape == (len(sizes), 2)
    dec = ImageDecoder("auto")
    for i, s in enumerate(shard_samples(tmp_path / "o")):
        want = dec.decode(_source_bytes(root, s["__key__"]))  # upright RGB, as the CPU loader decodes
        w, h = sizes[next(k for k in sizes if k.split(".")[0] == s["__key__"])]
        assert tuple(shapes[i]) == (h, w) == want.shape[:2], s["__key__"]
        assert s["rgb8"] == want.tobytes(), s["__key__"]  # exact: no header, HWC uint8
    assert raw["store"]["raw_samples"] == len(sizes)
    assert raw["store"]["raw_bytes"] == int(3 * shapes.prod(axis=1).sum())


def test_max_side_bounds_the_stored_pixels(src: tuple[Path, dict], tmp_path: Path) -> None:
    root, sizes = src
    fastfeed.pack(root, tmp_path / "o", store="raw", max_side=50, samples_per_shard=100, shuffle=False)
    idx = DatasetIndex.load(tmp_path / "o")
    dec = ImageDecoder("auto")
    for i, s in enumerate(shard_samples(tmp_path / "o")):
        h, w = (int(x) for x in idx.shapes[i])
        full = dec.decode(_source_bytes(root, s["__key__"]))
        H, W = full.shape[:2]
        assert max(h, w) == min(50, max(H, W))
        if max(H, W) > 50:
            assert abs(h / w - H / W) < 0.1 * H / W + 2 / min(h, w)  # aspect kept (sides rounded)
            want = cv2.resize(full, (w, h), interpolation=cv2.INTER_AREA)
            assert s["rgb8"] == want.tobytes()


@pytest.mark.parametrize("share", [0.5, 0.3, 0.05])
def test_mixed_stores_the_smallest_share_raw(src: tuple[Path, dict], tmp_path: Path, share: float) -> None:
    root, sizes = src
    idx = fastfeed.pack(root, tmp_path / "o", store=f"mixed:{share}", format="lmdb", samples_per_shard=6)
    assert idx.store["mode"] == "mixed" and idx.store["share"] == share
    samples = shard_samples(tmp_path / "o")
    shapes = DatasetIndex.load(tmp_path / "o").shapes
    pixels = {k.split(".")[0]: w * h for k, (w, h) in sizes.items()}
    k = math.floor(share * len(pixels) + 0.5)  # round(P x M), halves up
    expect = set(sorted(pixels, key=lambda key: (pixels[key], key))[:k])
    got = {s["__key__"] for s in samples if "rgb8" in s}
    assert got == expect and idx.store["raw_samples"] == k
    for s, hw in zip(samples, shapes):
        assert ("rgb8" in s) == bool(hw[0]) and ("rgb8" in s) != any(f in s for f in ("jpg", "png"))


def test_parallel_pack_is_byte_identical_and_resumes(src: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = src
    opts = dict(store="mixed:0.5", max_side=64, samples_per_shard=5)
    fastfeed.pack(root, tmp_path / "one", workers=1, **opts)
    fastfeed.pack(root, tmp_path / "two", workers=2, **opts)
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "two")
    dst = tmp_path / "resumed"  # an interrupted run: two shards written, one damaged, the rest not
    plan = plan_pack(root, dst, **opts)
    write_shard(plan, 0)
    write_shard(plan, 1)
    with (dst / plan.shards[1].name).open("r+b") as f:
        f.seek(600)
        f.write(b"X")
    fastfeed.pack(root, dst, **opts)
    assert tree_digest(dst) == tree_digest(tmp_path / "one")
    assert finalize  # the public three steps are the ones above


def test_bad_store_values_are_refused_clearly(src: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = src
    for bad, words in [("raws", "choose jpeg"), ("mixed:1.5", "between 0 and 1"), ("mixed:x", "between 0 and 1"),
                       ("mixed:0", "between 0 and 1"), ("png", "choose jpeg")]:
        with pytest.raises(ConfigError, match=words):
            fastfeed.pack(root, tmp_path / "o", store=bad)
    with pytest.raises(ConfigError, match="parquet/HF input"):
        fastfeed.pack(root, tmp_path / "o", store="raw", columns="image=jpg")
    assert main(["pack", str(root), str(tmp_path / "o"), "--store", "mixed:2"]) != 0


def test_undecodable_image_follows_on_error(tmp_path: Path) -> None:
    from _pack_data import messy_images

    good, _ = messy_images()["progressive.jpg"]
    (tmp_path / "src" / "c").mkdir(parents=True)
    (tmp_path / "src" / "c" / "good.jpg").write_bytes(good)
    (tmp_path / "src" / "c" / "cut.jpg").write_bytes(good[: len(good) // 2])
    with pytest.raises(BadFileError, match=r"cut.jpg: truncated JPEG"):
        fastfeed.pack(tmp_path / "src", tmp_path / "o", store="raw")
    idx = fastfeed.pack(tmp_path / "src", tmp_path / "o2", store="raw", on_error="skip")
    assert idx.num_samples == 1 and idx.skipped[0]["key"] == "c/cut"
    assert DatasetIndex.load(tmp_path / "o2").shapes.tolist() == [[120, 160]]


def test_cli_pack_store_raw_and_info(src: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root, sizes = src
    assert main(["pack", str(root), str(tmp_path / "o"), "--store", "raw", "--max-side", "64",
                 "--samples-per-shard", "10"]) == 0
    out = capsys.readouterr().out
    assert f"store      raw pixels (rgb8): {len(sizes)} image(s) as pixels" in out and "as JPEG" in out
    assert main(["info", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "index v2" in out and "raw pixels (rgb8)" in out
    info = fastfeed.info(tmp_path / "o")["store"]
    assert info["mode"] == "raw" and info["bytes_as_jpeg"] < info["bytes"]
    assert info["bytes"] - info["raw_bytes"] + info["encoded_bytes"] == info["bytes_as_jpeg"]
