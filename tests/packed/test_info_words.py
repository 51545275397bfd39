"""``fastfeed info`` and ``verify`` describe what the dataset holds: no JPEG where there is none, no
"images decoded" that were not, no empty version, no "8-8" ranges."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastfeed
from fastfeed.packed.checks import info

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A text dataset (JSONL), a PNG ImageFolder, a raw-pixel dataset and a JPEG one, each packed with
    restart markers asked for where the extension is built (what a default pack records)."""
    from fastfeed.decode import roi
    from tools.synth import make_image_folder, make_text_jsonl

    base = tmp_path_factory.mktemp("words")
    restarts = roi.built() or None
    out = {"text": fastfeed.pack(make_text_jsonl(base / "t.jsonl", num_samples=20, seed=1), base / "text",
                                 workers=1, jpeg_restarts=restarts)}
    for c in range(2):
        folder = base / "png" / f"c{c}"
        folder.mkdir(parents=True)
        for i in range(3 + c):
            pixels = np.random.default_rng([c, i]).integers(0, 255, (24, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.png")
    out["png"] = fastfeed.pack(base / "png", base / "png-ff", workers=1, jpeg_restarts=restarts)
    make_image_folder(base / "jpg", num_images=8, num_classes=2, size=(40, 30))
    out["raw"] = fastfeed.pack(base / "jpg", base / "raw", store="raw", workers=1)
    out["jpeg"] = fastfeed.pack(base / "jpg", base / "jpeg", workers=1, jpeg_restarts=restarts)
    return {k: Path(v.root) for k, v in out.items()}


@pytest.mark.parametrize("kind", ["text", "png", "raw"])
def test_info_says_no_jpeg_where_there_is_none(packs: dict[str, Path], kind: str) -> None:
    text = info(packs[kind]).text()
    assert "store      jpeg" not in text and "restart markers" not in text and "JPEGs" not in text, text
    store = next(line for line in text.splitlines() if line.startswith("  store"))
    assert store == {
        "text": "  store      no images (each field's bytes as packed)",
        "png": "  store      png (images as encoded files; `fastfeed pack --store raw` trades disk for CPU)",
    }.get(kind, store)
    if kind == "raw":
        assert store.startswith("  store      raw pixels (rgb8): 8 image(s) as pixels")


def test_info_of_jpegs_still_names_them(packs: dict[str, Path]) -> None:
    text = info(packs["jpeg"]).text()
    assert "  store      jpeg (images as encoded files; `fastfeed pack --store raw` trades disk for CPU)" in text
    from fastfeed.decode import roi

    assert ("JPEGs with restart markers" in text) is roi.built()


def test_info_ranges_and_an_index_without_a_version(packs: dict[str, Path]) -> None:
    report = info(packs["png"])  # one shard of 7; classes of 3 and 4
    lines = report.text().splitlines()
    assert lines[2].startswith("  samples    7 in 1 shard(s) of 7, ")
    assert lines[5].endswith("; 3-4 samples per class")
    assert info(packs["raw"]).text().splitlines()[5].endswith("; 4 samples per class")
    old = dataclasses.replace(report, fastfeed_version="")
    assert old.text().splitlines()[1] == f"  format     tar, DALI index files (packed from imagefolder, index " \
                                         f"v{report.index_version})"
    assert "by fastfeed ," not in old.text()


def test_verify_says_what_it_checked(packs: dict[str, Path]) -> None:
    assert fastfeed.verify(packs["png"]).text() == "ok: 1 shard(s), 7 samples, 7 images decoded"
    assert fastfeed.verify(packs["png"], decode=False).text() == \
        "ok: 1 shard(s), 7 samples, 7 images not decoded (--no-decode)"
    raw = fastfeed.verify(packs["raw"])
    assert (raw.images, raw.pixels) == (0, 8)
    assert raw.text() == "ok: 1 shard(s), 8 samples, 8 images as pixels (sizes checked against shapes.npy)"
    assert fastfeed.verify(packs["text"]).text() == "ok: 1 shard(s), 20 samples"
    assert fastfeed.verify(packs["png"], decode=False).to_json()["decoded"] is False
