"""Shared fixtures: generated data in tmp_path, and the real sample data when present."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (real sample files); skips when it is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not present (real sample data is optional)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def small_image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small ImageFolder of photo-like JPEGs (3 classes, 60 images, mixed sizes)."""
    from fastfeed.synth import make_image_folder

    root = tmp_path_factory.mktemp("imgs") / "train"
    return make_image_folder(root, num_images=60, num_classes=3, size=(96, 72), vary_size=True)
