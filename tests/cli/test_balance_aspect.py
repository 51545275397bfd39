"""``fastfeed balance DST --resolution R``: the aspect balance report (text(), to_json()) of a packed dataset of
images of various shapes; a dataset packed without sizes is told `fastfeed shapes DST`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fastfeed
from fastfeed.cli import EXIT_OK, EXIT_USAGE, main
from fastfeed.sampling.aspect_report import aspect_balance_report

SHAPES = [(400, 300), (300, 400), (320, 320), (480, 270), (600, 200)]  # (width, height)


def _pack(root: Path, counts: list[int]) -> Path:
    from PIL import Image

    rng = np.random.default_rng(1)
    (root / "src" / "x").mkdir(parents=True)
    n = 0
    for (w, h), c in zip(SHAPES, counts):
        for _ in range(c):
            Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(root / "src" / "x" / f"{n:03d}.jpg")
            n += 1
    fastfeed.pack(root / "src", root / "ds", workers=1)
    return root / "ds"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _pack(tmp_path_factory.mktemp("balance-aspect"), [10, 8, 5, 4, 3])


def test_balance_resolution_prints_the_aspect_report(images: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["balance", str(images), "--resolution", "256", "--batch-size", "3", "--seed", "2"]
    report = aspect_balance_report(images, resolution=256, world_size=8, batch_size=3, seed=2)
    assert main(args) == EXIT_OK
    out = capsys.readouterr().out
    assert out == report.text() + "\n"
    assert out.startswith("30 images, resolution 256 (") and "world size 8" in out.splitlines()[0]
    assert "cropping cuts away" in out and "fastfeed (batch 3)" in out and "naive per-rank buckets (batch 3)" in out
    assert main([*args, "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report.to_json()))


def test_balance_resolution_with_a_pixel_budget_and_buckets(images: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["balance", str(images), "--resolution", "256", "--max-pixels", str(4 * 256 * 256),
                 "--world-size", "2", "--buckets", "256x256,192x320,320x192", "--json"]) == EXIT_OK
    j = json.loads(capsys.readouterr().out)
    assert [(b["height"], b["width"]) for b in j["buckets"]] == [(320, 192), (256, 256), (192, 320)]
    assert sum(b["images"] for b in j["buckets"]) == 30 and j["world_size"] == 2
    assert j["settings"]["max_pixels"] == 4 * 256 * 256 and j["settings"]["baseline_batch_size"] == 4
    assert j["samplers"][0]["steps_equal"] is True


def test_balance_resolution_refuses_length_flags_and_bad_buckets(images: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["balance", str(images), "--resolution", "256", "--max-cost", "100"]) == EXIT_USAGE
    assert "--max-cost: for the length samplers; with --resolution give --batch-size B or --max-pixels P" in \
        capsys.readouterr().err
    assert main(["balance", str(images), "--resolution", "256", "--buckets", "256by256"]) == EXIT_USAGE
    assert "is not HEIGHTxWIDTH" in capsys.readouterr().err
    assert main(["balance", str(images), "--resolution", "256", "--batch-size", "2", "--max-pixels", "9"]) == EXIT_USAGE
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["balance", str(images), "--world-size", "2", "--max-pixels", "99"]) == EXIT_USAGE
    assert "add --resolution R" in capsys.readouterr().err


def test_balance_resolution_on_a_dataset_packed_without_sizes(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    ds = _pack(tmp_path, [2, 2])
    index = json.loads((ds / "index.json").read_text())
    index.pop("sizes")
    index["arrays"].remove("sizes.npy")
    index["checksums"]["sidecars"].pop("sizes.npy")
    (ds / "index.json").write_text(json.dumps(index))
    (ds / "sizes.npy").unlink()
    assert main(["balance", str(ds), "--resolution", "256"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"run `fastfeed shapes {ds}` once to add them without re-packing" in err
    assert main(["shapes", str(ds)]) == EXIT_OK
    capsys.readouterr()
    assert main(["balance", str(ds), "--resolution", "256", "--world-size", "2"]) == EXIT_OK
    assert capsys.readouterr().out.startswith("4 images, resolution 256")


def test_images_left_out_are_said_once_in_the_report_not_again_as_a_warning(
        images: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """At resolution 1024 with no upscaling allowed every image (at most 600 px) fits no bucket well."""
    caplog.set_level("WARNING")
    code = main(["balance", str(images), "--resolution", "1024", "--max-upscale", "1"])
    said = capsys.readouterr()
    assert not [r for r in caplog.records if "leaving them out" in r.getMessage()]
    assert "leaving them out" not in said.err
    assert code != EXIT_OK or "left out" in said.out
