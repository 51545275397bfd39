"""Remote shards through fsspec against a real S3 server (moto on 127.0.0.1).

Covers: reading by offset with and without cache_dir, ranged multi-part downloads,
spilling to a temporary file, verification (size, sha256), retries with backoff on
injected transient failures (the real server stays behind the failing layer), LRU
eviction bounds, and several processes sharing one cache.
"""

from __future__ import annotations

import errno
import functools
import gzip
import hashlib
import http.server
import io
import multiprocessing as mp
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from fastfeed.storage import remote
from fastfeed.storage import retry as retry_mod
from fastfeed.storage.cache import ShardCache
from fastfeed.errors import ConfigError, RemoteError, ShardError
from fastfeed.formats.tar import TarShardReader, TarShardWriter
from fastfeed.storage.remote import RetryPolicy, is_transient, open_shard, read_bytes

pytestmark = pytest.mark.s3

FAST_RETRY = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.004)


def make_shard(path: Path, n: int, *, seed: int = 0, size: int = 3000) -> list[tuple[str, int, int, dict]]:
    """A real tar shard of ``n`` samples; returns (key, offset, span, fields) per sample."""
    rng = random.Random(seed)
    w = TarShardWriter(path)
    out = []
    for i in range(n):
        fields = {"bin": rng.randbytes(rng.randint(1, size)), "cls": str(i % 7).encode()}
        off, span = w.add(f"s{seed}/{i:05d}", fields)
        out.append((f"s{seed}/{i:05d}", off, span, fields))
    w.close()
    return out


def upload(s3_server: Any, bucket: str, key: str, data: bytes) -> str:
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/{key}"


def read_all(src: Any, samples: list[tuple[str, int, int, dict]], name: str = "x") -> list[dict]:
    reader = TarShardReader(src, name=name)
    return [reader.read(off, span) for _, off, span, _ in samples]


def expected(samples: list[tuple[str, int, int, dict]]) -> list[dict]:
    return [{"__key__": k, **f} for k, _, _, f in samples]


# --------------------------------------------------------------------- basics
def test_read_bytes_exists_and_missing(s3_server: Any, s3_bucket: str) -> None:
    url = upload(s3_server, s3_bucket, "a/index.json", b'{"x": 1}')
    so = s3_server.storage_options
    assert read_bytes(url, storage_options=so) == b'{"x": 1}'
    assert remote.exists(url, storage_options=so)
    assert not remote.exists(url + ".nope", storage_options=so)
    with pytest.raises(FileNotFoundError):  # DatasetIndex.load relies on this
        read_bytes(url + ".nope", storage_options=so)


def test_endpoint_and_credentials_from_environment(
    s3_server: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = upload(s3_server, s3_bucket, "env.bin", b"from env")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # a fresh filesystem instance, so the environment is read now
    assert read_bytes(url, storage_options={"skip_instance_cache": True}) == b"from env"


# --------------------------------------------------------------------- without cache
def test_open_shard_in_memory_reads_by_offset(tmp_path: Path, s3_server: Any, s3_bucket: str) -> None:
    samples = make_shard(tmp_path / "s.tar", 40)
    data = (tmp_path / "s.tar").read_bytes()
    url = upload(s3_server, s3_bucket, "ds/s.tar", data)
    src = open_shard(url, storage_options=s3_server.storage_options, size=len(data),
                     sha256=hashlib.sha256(data).hexdigest())
    assert isinstance(src, io.BytesIO) and src.path == url
    assert read_all(src, samples) == expected(samples)
    src.close()


def test_ranged_parts_and_spill_to_temp_file(
    tmp_path: Path, s3_server: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = make_shard(tmp_path / "big.tar", 120, size=6000)
    data = (tmp_path / "big.tar").read_bytes()
    url = upload(s3_server, s3_bucket, "big.tar", data)
    monkeypatch.setattr(remote, "PART_BYTES", 32 * 1024)  # many waves of parallel ranged GETs
    assert len(data) > 8 * remote.PART_BYTES * remote.PARALLEL_PARTS / 4
    mem = open_shard(url, storage_options=s3_server.storage_options)  # size looked up
    assert mem.getvalue() == data
    spilled = open_shard(url, storage_options=s3_server.storage_options, max_memory=len(data) - 1)
    assert not isinstance(spilled, io.BytesIO) and spilled.path == url
    assert read_all(spilled, samples) == expected(samples)
    spilled.close()


def test_verification_and_missing_shards(tmp_path: Path, s3_server: Any, s3_bucket: str) -> None:
    make_shard(tmp_path / "s.tar", 5)
    data = (tmp_path / "s.tar").read_bytes()
    url = upload(s3_server, s3_bucket, "v/s.tar", data)
    so = s3_server.storage_options
    with pytest.raises(ShardError, match=r"got \d+ bytes, the index says"):
        open_shard(url, storage_options=so, size=len(data) + 512, retry=FAST_RETRY)
    with pytest.raises(ShardError, match="sha256 is .* the index says .*re-run `fastfeed pack`"):
        open_shard(url, storage_options=so, cache_dir=tmp_path / "c", sha256="0" * 64)
    assert not list((tmp_path / "c").glob("*.tar")) and not list((tmp_path / "c" / ".tmp").iterdir())
    with pytest.raises(ShardError, match=f"s3://{s3_bucket}/v/gone.tar: shard is missing"):
        open_shard(f"s3://{s3_bucket}/v/gone.tar", storage_options=so, size=10, retry=FAST_RETRY)
    with pytest.raises(ShardError, match="shard is missing"):
        open_shard(f"s3://{s3_bucket}/v/gone.tar", storage_options=so, cache_dir=tmp_path / "c")
    with pytest.raises(ShardError, match="shard is missing"):
        open_shard(str(tmp_path / "nope.tar"))


def test_object_shorter_than_the_index_is_a_shard_error(
    tmp_path: Path, s3_server: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_shard(tmp_path / "s.tar", 40, size=5000)
    data = (tmp_path / "s.tar").read_bytes()
    url = upload(s3_server, s3_bucket, "short/s.tar", data)
    monkeypatch.setattr(remote, "PART_BYTES", 16 * 1024)
    sleeps: list[float] = []
    monkeypatch.setattr(retry_mod, "_sleep", sleeps.append)
    for claimed in (len(data) + 1000, len(data) + 100 * 1024):  # a short last part; parts past the end
        with pytest.raises(ShardError, match="the object is shorter|past the end of the object"):
            open_shard(url, storage_options=s3_server.storage_options, size=claimed)
    assert sleeps == []  # not mistaken for a network error


def test_one_is_url_for_storage_and_the_index() -> None:
    """The index joins and loads with storage's is_url: file:// and plain paths are local."""
    from fastfeed.packed import index
    from fastfeed.storage.remote import is_url

    assert is_url("s3://b/k") and not is_url("/data/x") and not is_url("file:///data/x")
    assert not hasattr(index, "_is_url")
    assert index.join("s3://b/ds/", "index.json") == "s3://b/ds/index.json"
    assert index.join("/data/ds", "index.json") == "/data/ds/index.json"


def test_local_paths_pass_through(tmp_path: Path) -> None:
    make_shard(tmp_path / "s.tar", 2)
    assert open_shard(str(tmp_path / "s.tar"), cache_dir=tmp_path / "c") == str(tmp_path / "s.tar")
    assert open_shard(f"file://{tmp_path}/s.tar") == str(tmp_path / "s.tar")


# --------------------------------------------------------------------- gzip
@pytest.mark.parametrize("cached", [False, True])
def test_gzipped_tar_is_decompressed_once(tmp_path: Path, s3_server: Any, s3_bucket: str, cached: bool) -> None:
    samples = make_shard(tmp_path / "s.tar", 30)
    gz = gzip.compress((tmp_path / "s.tar").read_bytes())
    url = upload(s3_server, s3_bucket, "g/s.tar.gz", gz)
    cache = tmp_path / "cache" if cached else None
    src = open_shard(url, storage_options=s3_server.storage_options, cache_dir=cache, size=len(gz))
    assert read_all(src, samples) == expected(samples)
    if cached:
        assert isinstance(src, str) and src.endswith("-s.tar")
        assert Path(src).read_bytes() == (tmp_path / "s.tar").read_bytes()
    else:
        src.close()
    with pytest.raises(ShardError, match="gzip stream is truncated"):
        bad = upload(s3_server, s3_bucket, "g/bad.tgz", gz[: len(gz) // 2])
        open_shard(bad, storage_options=s3_server.storage_options, cache_dir=cache)


# --------------------------------------------------------------------- cache
def test_cache_hits_after_first_download(tmp_path: Path, s3_server: Any, s3_bucket: str) -> None:
    samples = make_shard(tmp_path / "s.tar", 20)
    data = (tmp_path / "s.tar").read_bytes()
    url = upload(s3_server, s3_bucket, "c/s.tar", data)
    kw = dict(storage_options=s3_server.storage_options, cache_dir=tmp_path / "cache", size=len(data),
              sha256=hashlib.sha256(data).hexdigest())
    p1 = open_shard(url, **kw)
    cache = remote.shard_cache(tmp_path / "cache")
    before = (cache.stats.hits, cache.stats.misses)
    s3_server.client().delete_object(Bucket=s3_bucket, Key="c/s.tar")  # a hit needs no request
    p2 = open_shard(url, **kw)
    assert p1 == p2 and Path(p1).read_bytes() == data
    assert (cache.stats.hits, cache.stats.misses) == (before[0] + 1, before[1])
    assert read_all(p2, samples) == expected(samples)
    # a re-packed shard (new size/sha256) is a new entry, not the stale one
    upload(s3_server, s3_bucket, "c/s.tar", data + b"\0" * 512)
    p3 = open_shard(url, **{**kw, "size": len(data) + 512, "sha256": None})
    assert p3 != p1 and Path(p3).stat().st_size == len(data) + 512


def test_lru_eviction_keeps_cache_within_bound(tmp_path: Path, s3_server: Any, s3_bucket: str) -> None:
    urls, sizes = [], []
    for i in range(5):
        make_shard(tmp_path / f"{i}.tar", 10, seed=i)
        data = (tmp_path / f"{i}.tar").read_bytes()
        urls.append(upload(s3_server, s3_bucket, f"lru/{i}.tar", data))
        sizes.append(len(data))
    capacity = sizes[0] + sizes[1] + sizes[2] + 100  # room for about three shards
    root = tmp_path / "cache"
    cache = ShardCache(root, capacity)
    got: dict[int, str] = {}

    def use(i: int) -> None:
        got[i] = open_shard(urls[i], storage_options=s3_server.storage_options, cache_dir=root,
                            cache_size=capacity, size=sizes[i])
        assert cache.total_bytes() <= capacity

    for i in (0, 1, 2):
        use(i)
    use(0)  # 0 is now the most recently used, 1 the least
    use(3)
    assert not Path(got[1]).exists()
    assert all(Path(got[i]).exists() for i in (0, 2, 3))
    use(4)
    assert not Path(got[2]).exists() and all(Path(got[i]).exists() for i in (0, 3, 4))
    assert [n for n, _, _ in cache.entries()] == [Path(got[i]).name for i in (0, 3, 4)]
    with pytest.raises(ConfigError, match="does not fit cache_size"):
        open_shard(urls[0], storage_options=s3_server.storage_options, cache_dir=tmp_path / "tiny",
                   cache_size=100, size=sizes[0])


def test_stale_part_files_of_dead_processes_are_removed(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, "1MB")
    proc = mp.get_context("spawn").Process(target=int)
    proc.start()
    proc.join()
    part = tmp_path / ".tmp" / f"x.tar.{cache._host}.{proc.pid}.abcd1234.part"
    part.write_bytes(b"x" * 1000)
    os.utime(part, (1, 1))
    assert cache.total_bytes() == 0 and not part.exists()


def _child_reads(args: tuple[list[str], dict, str, int]) -> tuple[list[str], list[str], int]:
    urls, so, cache_dir, size = args
    paths = [open_shard(u, storage_options=so, cache_dir=cache_dir, size=size) for u in urls]
    digests = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]
    return paths, digests, remote.shard_cache(cache_dir).stats.misses


def test_processes_share_one_cache(tmp_path: Path, s3_server: Any, s3_bucket: str) -> None:
    make_shard(tmp_path / "s.tar", 300, size=4000)
    data = (tmp_path / "s.tar").read_bytes()
    urls = [upload(s3_server, s3_bucket, f"p/{i}.tar", data) for i in range(3)]
    cache_dir = str(tmp_path / "shared-cache")
    jobs = [(urls if k % 2 else urls[::-1], s3_server.storage_options, cache_dir, len(data)) for k in range(4)]
    with mp.get_context("spawn").Pool(4) as pool:
        results = pool.map(_child_reads, jobs)
    assert sum(misses for _, _, misses in results) == len(urls)  # each shard fetched once
    want = hashlib.sha256(data).hexdigest()
    assert all(d == want for _, digests, _ in results for d in digests)
    assert {tuple(sorted(p)) for p, _, _ in results} == {tuple(sorted(results[0][0]))}
    assert not os.listdir(Path(cache_dir) / ".tmp")


# --------------------------------------------------------------------- retries
def _flaky_class() -> type:
    """An s3fs filesystem whose reads fail with injected network errors before reaching moto."""
    import s3fs

    class FlakyS3(s3fs.S3FileSystem):
        protocol = ("flakys3",)
        failures = {"left": 0, "calls": 0, "error": ConnectionResetError}

        async def _cat_file(self, path: str, version_id: Any = None, start: Any = None,
                            end: Any = None) -> bytes:
            FlakyS3.failures["calls"] += 1
            if FlakyS3.failures["left"] != 0:
                FlakyS3.failures["left"] -= 1
                raise FlakyS3.failures["error"](errno.ECONNRESET, "injected: connection reset by peer")
            return await super()._cat_file(path, version_id=version_id, start=start, end=end)

    return FlakyS3


@pytest.fixture
def flaky(s3_server: Any) -> Any:
    import fsspec

    cls = _flaky_class()
    fsspec.register_implementation("flakys3", cls, clobber=True)
    return cls


def test_transient_failures_are_retried(
    tmp_path: Path, s3_server: Any, s3_bucket: str, flaky: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = make_shard(tmp_path / "s.tar", 50, size=5000)
    data = (tmp_path / "s.tar").read_bytes()
    upload(s3_server, s3_bucket, "f/s.tar", data)
    url = f"flakys3://{s3_bucket}/f/s.tar"
    so = s3_server.storage_options
    sleeps: list[float] = []
    monkeypatch.setattr(retry_mod, "_sleep", sleeps.append)
    flaky.failures.update(left=2, calls=0)
    src = open_shard(url, storage_options=so, size=len(data))
    assert read_all(src, samples) == expected(samples)
    assert flaky.failures["calls"] == 3 and len(sleeps) == 2 and sleeps[1] > 0
    # multi-part download: a failed part retries its wave, the rest is not re-read
    monkeypatch.setattr(remote, "PART_BYTES", 16 * 1024)
    flaky.failures.update(left=1, calls=0)
    path = open_shard(url, storage_options=so, size=len(data), cache_dir=tmp_path / "c")
    assert Path(path).read_bytes() == data
    parts = -(-len(data) // remote.PART_BYTES)
    assert parts < flaky.failures["calls"] <= parts + remote.PARALLEL_PARTS


def test_remote_error_after_last_attempt_names_url_and_fix(
    s3_server: Any, s3_bucket: str, flaky: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload(s3_server, s3_bucket, "f/s.tar", b"x" * 2048)
    url = f"flakys3://{s3_bucket}/f/s.tar"
    sleeps: list[float] = []
    monkeypatch.setattr(retry_mod, "_sleep", sleeps.append)
    flaky.failures.update(left=-1, calls=0)  # fail forever
    with pytest.raises(RemoteError) as e:
        open_shard(url, storage_options=s3_server.storage_options, size=2048,
                   retry=RetryPolicy(attempts=5, base_delay=0.1, max_delay=0.3))
    msg = str(e.value)
    assert msg.startswith(url) and "failed 5 times" in msg and "ConnectionResetError" in msg
    assert "endpoint_url" in msg and "RetryPolicy(attempts=" in msg
    assert flaky.failures["calls"] == 5 and len(sleeps) == 4
    assert 0.05 <= sleeps[0] <= 0.1 and all(0.15 <= s <= 0.3 for s in sleeps[2:])
    # not transient: no retries
    flaky.failures.update(left=-1, calls=0, error=functools.partial(OSError, errno.EINVAL))
    with pytest.raises(OSError, match="injected"):
        open_shard(url, storage_options=s3_server.storage_options, size=2048)
    assert flaky.failures["calls"] == 1


def test_transient_classification() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    def client_error(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    assert is_transient(EndpointConnectionError(endpoint_url="http://x"))
    assert is_transient(client_error("SlowDown", 503)) and is_transient(client_error("InternalError", 500))
    assert not is_transient(client_error("InvalidRange", 416))
    assert is_transient(OSError(errno.EIO, "s3 said 500")) and not is_transient(OSError(errno.EINVAL, "bad"))
    assert is_transient(TimeoutError()) and not is_transient(FileNotFoundError("k"))
    assert not is_transient(NoCredentialsError()) and not is_transient(ValueError("x"))
    err = retry_mod._permanent_error(NoCredentialsError(), "s3://b/k")
    assert isinstance(err, RemoteError) and "AWS_ACCESS_KEY_ID" in str(err)


def test_backoff_grows_with_jitter() -> None:
    p = RetryPolicy(attempts=8, base_delay=0.5, max_delay=10.0)
    a, b = p.delays(random.Random(1)), p.delays(random.Random(2))
    assert len(a) == 7 and a != b
    for i, d in enumerate(a):
        cap = min(10.0, 0.5 * 2**i)
        assert cap / 2 <= d <= cap
    with pytest.raises(ConfigError):
        RetryPolicy(attempts=0)


# --------------------------------------------------------------------- http
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def test_http_server_without_range_support(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's http.server ignores Range: the download falls back to one whole GET."""
    pytest.importorskip("aiohttp")
    samples = make_shard(tmp_path / "s.tar", 60, size=4000)
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/s.tar"
        monkeypatch.setattr(remote, "PART_BYTES", 16 * 1024)
        src = open_shard(url, cache_dir=tmp_path / "cache")
        assert read_all(src, samples) == expected(samples)
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------- end to end: fastfeed.loader
def _upload_folder(s3_server: Any, bucket: str, folder: Path, prefix: str) -> str:
    client = s3_server.client()
    for p in sorted(folder.iterdir()):
        client.upload_file(str(p), bucket, f"{prefix}/{p.name}")
    return f"s3://{bucket}/{prefix}"


def _stream(dl: Any, epochs: int = 2) -> list[list[tuple[str, bytes]]]:
    """Per batch, (key, txt bytes) of each sample, over ``epochs`` epochs."""
    out = []
    for epoch in range(epochs):
        dl.set_epoch(epoch)
        out += [list(zip(b["__key__"], b["txt"])) for b in dl]
    return out


@pytest.mark.parametrize("cached", [False, True])
def test_loader_from_s3_equals_local(tmp_path: Path, s3_server: Any, s3_bucket: str, cached: bool) -> None:
    import fastfeed
    from _loader_data import write_dataset

    write_dataset(tmp_path / "ds", shard_counts=(9, 9, 9, 5))
    url = _upload_folder(s3_server, s3_bucket, tmp_path / "ds", "packed")
    kw = dict(batch_size=4, seed=3, num_workers=2, rank=1, world_size=2, decode=None)
    local = _stream(fastfeed.loader(str(tmp_path / "ds"), **kw))
    cache = tmp_path / "cache" if cached else None
    remote_dl = fastfeed.loader(url, cache_dir=cache, **kw, storage=fastfeed.Storage(options=s3_server.storage_options))
    assert _stream(remote_dl) == local and len(local) > 0
    if cached:  # rank 1 of 2 reads some of the 4 shards, each downloaded once into the cache
        assert 1 <= len(list(cache.glob("*-shard-*.tar"))) <= 4
        assert not list((cache / ".tmp").iterdir())


def test_loader_over_index_less_tars_on_s3(tmp_path: Path, s3_server: Any, s3_bucket: str) -> None:
    import fastfeed

    folder = tmp_path / "wds"
    folder.mkdir()
    for s in range(3):
        w = TarShardWriter(folder / f"part-{s:04d}.tar")
        for j in range(7 + s):
            w.add(f"p{s}/{j:03d}", {"txt": f"{s}-{j}".encode(), "cls": str(j % 3).encode()})
        w.close()
    url = _upload_folder(s3_server, s3_bucket, folder, "wds")
    kw = dict(batch_size=5, seed=0, num_workers=1, decode=None, world_size=1, rank=0)
    local = _stream(fastfeed.loader(str(folder / "part-{0000..0002}.tar"), **kw))
    remote_dl = fastfeed.loader(url + "/part-{0000..0002}.tar", cache_dir=tmp_path / "cache", **kw,
                                storage=fastfeed.Storage(options=s3_server.storage_options))
    assert _stream(remote_dl) == local
    first_epoch = [sample for batch in local[:len(local) // 2] for sample in batch]
    assert sorted(first_epoch) == sorted(
        (f"p{s}/{j:03d}", f"{s}-{j}".encode()) for s in range(3) for j in range(7 + s)
    )


def test_missing_optional_dependencies_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from fastfeed.decode.fields import decode_field
    from fastfeed.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'fastfeed\[s3\]'"):
        open_shard("s3://bucket/shard.tar", size=10)
    monkeypatch.setitem(sys.modules, "msgpack", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'fastfeed\[wds\]'"):
        decode_field("mp", b"\x80")


def test_index_load_with_storage_options(tmp_path: Path, s3_server: Any, s3_bucket: str) -> None:
    """DatasetIndex.load(url, storage_options=...) reads index.json and its sidecars from S3."""
    from _loader_data import write_dataset

    from fastfeed.packed.index import DatasetIndex

    write_dataset(tmp_path / "ds", shard_counts=(5, 4))
    url = _upload_folder(s3_server, s3_bucket, tmp_path / "ds", "idx")
    local = DatasetIndex.load(tmp_path / "ds")
    remote = DatasetIndex.load(url, storage_options=s3_server.storage_options)
    assert DatasetIndex.exists(url, storage_options=s3_server.storage_options)
    assert remote.fingerprint == local.fingerprint
    assert (remote.offsets == local.offsets).all()
