"""Bounded waits against a real S3 server (moto) behind a fault-injecting proxy (tools/faultproxy.py).

The store "freezes" as a stopped server does (connections accepted and held open, nothing
answered), crawls, or drops connections; every remote read, listing and upload of the
storage layer and of ``pack`` (into and from object storage) then ends within its bound
(timeout x attempts + backoff) in a RemoteError that names the URL, what timed out and how
to wait longer. Timeouts are small here (0.5 s, one retry: ~2.5 s a call at most).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from fastfeed.errors import RemoteError
from fastfeed.storage import bounded
from fastfeed.storage import retry as retry_mod
from fastfeed.storage.bounded import open_remote
from fastfeed.storage.remote import open_shard, read_bytes
from fastfeed.storage.retry import RetryPolicy, policy_of
from fastfeed.storage.shardlist import expand_shards
from tools.faultproxy import FaultProxy

pytestmark = pytest.mark.s3

TIMEOUT, RETRIES = 0.5, 1
#: the most a call may take: its attempts, each one timeout, the backoff between them (at most
#: 1 s), s3fs's 0.1 s pause after a failed request, and room for a busy 2-core machine
BOUND = RetryPolicy(attempts=RETRIES + 1, timeout=TIMEOUT).bound() + 0.5 + 3.0


@pytest.fixture(autouse=True)
def short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The waits between attempts (1 s, doubling) cut to 50 ms: the timeouts stay real, the test short."""
    monkeypatch.setattr(retry_mod, "_sleep", lambda s: time.sleep(min(s, 0.05)))


@pytest.fixture
def proxy(s3_server: Any) -> Iterator[FaultProxy]:
    host, port = s3_server.endpoint.removeprefix("http://").rsplit(":", 1)
    with FaultProxy((host, int(port))) as p:
        yield p


def through(proxy: FaultProxy, s3_server: Any, **policy: Any) -> dict[str, Any]:
    """The fsspec options of ``s3_server`` reached through ``proxy``, with fastfeed's timeout/retries."""
    so = dict(s3_server.storage_options)
    so["client_kwargs"] = {**so["client_kwargs"], "endpoint_url": proxy.endpoint}
    return {**so, "timeout": TIMEOUT, "retries": RETRIES, **policy}


def upload(s3_server: Any, bucket: str, key: str, data: bytes) -> str:
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


class Timer:
    def __enter__(self) -> "Timer":
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.s = time.monotonic() - self.t0


def test_the_policy_comes_from_the_argument_the_options_the_environment_the_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert (policy_of(None).timeout, policy_of(None).attempts) == (60.0, 6)
    assert 6 * 60 < policy_of(None).bound() < 7 * 60  # a frozen store costs ~6.5 minutes per read
    monkeypatch.setenv("FASTFEED_STORAGE_TIMEOUT", "2m")
    monkeypatch.setenv("FASTFEED_STORAGE_RETRIES", "3")
    assert (policy_of(None).timeout, policy_of(None).attempts) == (120.0, 4)
    assert (policy_of({"timeout": 5, "retries": 0}).timeout, policy_of({"timeout": 5, "retries": 0}).attempts) \
        == (5.0, 1)  # an explicit option wins over the environment
    fs, _ = bounded.filesystem("s3://bucket/x", {"timeout": 7, "config_kwargs": {"read_timeout": 99}})
    assert fs.retries == 1 and fs.config_kwargs["connect_timeout"] == 7
    assert fs.config_kwargs["read_timeout"] == 99  # what the caller set stays
    monkeypatch.setenv("FASTFEED_STORAGE_RETRIES", "many")
    with pytest.raises(Exception, match="FASTFEED_STORAGE_RETRIES='many' must be an integer"):
        policy_of(None)


def test_a_frozen_store_is_a_remote_error_naming_the_url_within_the_bound(
        proxy: FaultProxy, s3_server: Any, s3_bucket: str, tmp_path: Path) -> None:
    url = upload(s3_server, s3_bucket, "ds/shard-000000.tar", b"x" * 5000)
    so = through(proxy, s3_server)
    assert read_bytes(url, storage_options=so) == b"x" * 5000
    proxy.hold()
    calls = {
        "read": lambda: read_bytes(url, storage_options=so),
        "download": lambda: open_shard(url, storage_options=so, size=5000),
        "listing": lambda: expand_shards(f"s3://{s3_bucket}/ds", storage_options=so),
    }
    for what, call in calls.items():
        with Timer() as t, pytest.raises(RemoteError) as e:
            call()
        msg = str(e.value)
        assert t.s < BOUND, (what, t.s)
        assert msg.startswith(f"s3://{s3_bucket}/ds"), msg
        assert f"{what} timed out 2 times" in msg and "no answer for 0.5 s" in msg, msg
        assert "storage=fastfeed.Storage(timeout=1, retries=3)" in msg and "'timeout': 1" in msg, msg
        assert "ReadTimeoutError" in msg


def test_a_slow_store_that_keeps_answering_is_waited_for_one_that_stops_midway_is_not(
        proxy: FaultProxy, s3_server: Any, s3_bucket: str) -> None:
    data = bytes(range(256)) * 1600  # 400 KB
    url = upload(s3_server, s3_bucket, "slow.bin", data)
    so = through(proxy, s3_server)
    proxy.slow(delay=0.15, chunk=64 * 1024)  # ~1 s in all, never 0.5 s without a byte
    with Timer() as t:
        assert read_bytes(url, storage_options=so) == data
    assert t.s > TIMEOUT
    proxy.passthrough()
    proxy.hold_after(to_client=100_000)  # the answer stops in its middle
    with pytest.raises(RemoteError, match=r"slow.bin: read timed out 2 times"):
        read_bytes(url, storage_options=so)


def test_a_dropped_connection_is_retried_until_the_store_is_back(
        proxy: FaultProxy, s3_server: Any, s3_bucket: str) -> None:
    url = upload(s3_server, s3_bucket, "back.bin", b"back")
    so = through(proxy, s3_server, retries=4)
    proxy.cut()
    threading.Timer(0.3, proxy.passthrough).start()
    assert read_bytes(url, storage_options=so) == b"back"
    proxy.cut()
    with pytest.raises(RemoteError, match=r"back.bin: read failed 2 times .*EndpointConnectionError"):
        read_bytes(url, storage_options={**so, "retries": 1})


def test_a_stream_from_a_frozen_store_ends_too(proxy: FaultProxy, s3_server: Any, s3_bucket: str) -> None:
    data = b"line\n" * 40_000
    url = upload(s3_server, s3_bucket, "m.jsonl", data)
    so = through(proxy, s3_server)
    with open_remote(url, storage_options=so, block=64 * 1024) as f:
        assert f.readline() == b"line\n"
        proxy.hold()
        with pytest.raises(RemoteError, match=r"m.jsonl: read of bytes 65536-131072 timed out 2 times"):
            f.read()


# ---------------------------------------------------------------- pack into and from a frozen store
@pytest.fixture
def images(small_image_folder: Path) -> Path:
    return small_image_folder


def test_pack_into_a_store_that_freezes_during_an_upload(
        proxy: FaultProxy, s3_server: Any, s3_bucket: str, images: Path) -> None:
    """aiohttp bounds no body write (its read timeout starts once the body is sent): the upload's
    own deadline (timeout + its bytes at 1 MB/s) ends it."""
    from fastfeed.packing.api import pack

    dst = f"s3://{s3_bucket}/midway"
    proxy.hold_after(to_server=40_000)  # the listing and job record pass; the first shard stops midway
    with Timer() as t, pytest.raises(RemoteError) as e:
        pack(images, dst, samples_per_shard=25, storage_options=through(proxy, s3_server))
    msg = str(e.value)
    assert msg.startswith(f"{dst}/shard-0000") and "upload timed out 2 times" in msg, msg
    assert "put_file not done within" in msg
    assert t.s < BOUND + 2 * 0.2  # each attempt: the timeout plus ~0.1 s for the shard's bytes


def test_pack_from_a_frozen_store_stops_with_a_remote_error(
        proxy: FaultProxy, s3_server: Any, s3_bucket: str, images: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """pack's sources take no fsspec options: the environment gives the endpoint and the bound."""
    s3fs = pytest.importorskip("s3fs")
    from fastfeed.packing.api import pack

    client = s3_server.client()
    for p in sorted(images.rglob("*.jpg"))[:6]:
        client.upload_file(str(p), s3_bucket, f"src/{p.relative_to(images).as_posix()}")
    for k, v in {"AWS_ENDPOINT_URL": proxy.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "FASTFEED_STORAGE_TIMEOUT": str(TIMEOUT), "FASTFEED_STORAGE_RETRIES": str(RETRIES)}.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached instance would keep another environment
    try:
        proxy.hold()
        # the listing of the prefix, or of the bucket to tell a prefix from an object
        with Timer() as t, pytest.raises(RemoteError, match=rf"^s3://{s3_bucket}(/src)?: list timed out 2 times"):
            pack(f"s3://{s3_bucket}/src", tmp_path / "out")
        assert t.s < BOUND
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
