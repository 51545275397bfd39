"""Fixtures of the CLI tests: a small photo dataset, packed."""

from __future__ import annotations

from pathlib import Path

import pytest

import fastfeed


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 photo-like JPEGs of different sizes in ``train/`` (3 classes), packed into ``ff/`` (one tar shard)."""
    from tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("cli")
    make_image_folder(root / "train", num_images=60, num_classes=3, size=(96, 72), vary_size=True)
    fastfeed.pack(root / "train", root / "ff")
    return root
