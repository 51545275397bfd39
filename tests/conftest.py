"""Shared fixtures: generated data in tmp_path, and the real sample data when present."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (real sample files); skips when it is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not present (real sample data is optional)")
    return SHARED_DATA


@pytest.fixture
def isolated_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tune results of a test never reach the user's cache, nor one test's another's.

    A fresh ``XDG_CACHE_HOME`` per test (returned), no ``FASTFEED_TUNE_DIR``, and no
    launcher's ``LOCAL_WORLD_SIZE`` (no GPU count picked up from the environment). A module
    opts in with ``pytestmark = pytest.mark.usefixtures("isolated_store")``.
    """
    cache = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("FASTFEED_TUNE_DIR", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return cache


@pytest.fixture(scope="session")
def small_image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small ImageFolder of photo-like JPEGs (3 classes, 60 images, mixed sizes)."""
    from tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("imgs") / "train"
    return make_image_folder(root, num_images=60, num_classes=3, size=(96, 72), vary_size=True)


# --------------------------------------------------------------------- S3 (moto on 127.0.0.1)
class S3Server:
    """A running moto S3 server on loopback: its endpoint and ready-made client settings."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        #: fsspec/s3fs options reaching this server (fake credentials, as moto accepts any)
        self.storage_options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }

    def client(self) -> Any:
        """A boto3 S3 client for this server (to create buckets and upload objects)."""
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3-compatible server (moto's ThreadedMotoServer) on 127.0.0.1, one per session."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is a dev dependency")
    pytest.importorskip("s3fs", reason="s3fs is in the [s3] extra")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield S3Server(f"http://{host}:{port}")
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> str:
    """A fresh, empty bucket on the session's moto server; returns its name."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    bucket = f"{name}-{uuid.uuid4().hex[:8]}"
    s3_server.client().create_bucket(Bucket=bucket)
    return bucket
