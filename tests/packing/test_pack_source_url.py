"""``pack`` from object storage: one scan over a tree, local folder or prefix, gives the same dataset.

A moto S3 server on 127.0.0.1 holds a copy of a local source; packing the URL and the
local copy must give byte-identical shards and offsets, for a prefix (an ImageFolder) and
for a JSONL manifest given as an object URL (its files named relative to it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from fastfeed.packing.api import pack

pytestmark = pytest.mark.s3


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Source URLs are read with the environment's endpoint and credentials, as on a cluster."""
    s3fs = pytest.importorskip("s3fs")
    for k, v in {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached instance would keep another environment
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def _upload(s3_server: Any, bucket: str, folder: Path, prefix: str) -> str:
    client = s3_server.client()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            client.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(folder).as_posix()}")
    return f"s3://{bucket}/{prefix}"


def _same_dataset(a: Path, b: Path) -> None:
    ia, ib = (json.loads((d / "index.json").read_text()) for d in (a, b))
    assert ia["num_samples"] == ib["num_samples"] and ia["fields"] == ib["fields"]
    assert [s["sha256"] for s in ia["shards"]] == [s["sha256"] for s in ib["shards"]]
    assert np.array_equal(np.load(a / "offsets.npy"), np.load(b / "offsets.npy"))
    assert ia["skipped"] == ib["skipped"]


def test_prefix_packs_like_its_local_copy(
    s3_server: Any, s3_bucket: str, s3_env: None, small_image_folder: Path, tmp_path: Path,
) -> None:
    url = _upload(s3_server, s3_bucket, small_image_folder, "train")
    opts: dict[str, Any] = dict(samples_per_shard=25, seed=3)
    local = pack(small_image_folder, tmp_path / "local", **opts)
    remote = pack(url, tmp_path / "remote", **opts)
    assert remote.classes == local.classes and remote.num_samples == 60
    _same_dataset(tmp_path / "local", tmp_path / "remote")


def test_jsonl_manifest_as_an_object_url(s3_server: Any, s3_bucket: str, s3_env: None, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "audio").mkdir(parents=True)
    lines = []
    for i in range(12):
        (src / "audio" / f"{i:03d}.wav").write_bytes(bytes([i]) * (100 + i))
        lines.append(json.dumps({"__key__": f"s{i:03d}", "audio": f"audio/{i:03d}.wav",
                                 "text": f"utterance {i}", "label": i % 3}))
    lines.append(json.dumps({"__key__": "bad", "audio": "audio/missing.wav"}))
    (src / "train.jsonl").write_text("\n".join(lines) + "\n")
    url = _upload(s3_server, s3_bucket, src, "m") + "/train.jsonl"
    opts: dict[str, Any] = dict(samples_per_shard=5, on_error="skip", length="text")
    local = pack(src / "train.jsonl", tmp_path / "local", **opts)
    remote = pack(url, tmp_path / "remote", **opts)
    assert remote.input == local.input == "jsonl" and remote.num_samples == 12
    assert [s["path"] for s in remote.skipped] == ["train.jsonl:13"]
    _same_dataset(tmp_path / "local", tmp_path / "remote")
    assert np.array_equal(remote.lengths, local.lengths)
