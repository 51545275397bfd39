"""``fastfeed pack --engine ray`` on a real two-node Ray cluster of this machine.

One cluster (two ``ray start`` nodes of one CPU each talking over loopback addresses,
authentication and usage statistics off, no dashboard) serves the whole module and is
stopped by its fixture whatever happens (by process group, never ``ray stop``, which
would also stop other Ray clusters of the machine). Every test compares the Ray engine's output byte for byte
with the local packer's; the node-loss test kills the second node's raylet while it
writes a shard and must still produce identical output; the S3 test packs into a
moto server on 127.0.0.1, fails on a bad file, and resumes after the fix.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import fastfeed
from _pack_data import messy_images, tree_digest
from fastfeed.cli import main
from fastfeed.errors import BadFileError, ConfigError, DestinationError, MissingDependencyError
from fastfeed.packing.api import pack, plan_pack
from tools.synth import make_image_folder, make_text_jsonl

pytestmark = pytest.mark.ray


# ---------------------------------------------------------------- fixtures
def _aws_env(server: Any) -> dict[str, str]:
    """What the nodes of a real cluster would have in their environment for its object store."""
    return {"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def cluster(s3_server: Any) -> Iterator[Any]:
    """A real two-node Ray cluster (head + one worker node, 1 CPU each), module-wide; its
    nodes reach the session's S3 server (moto, 127.0.0.1) through their environment."""
    pytest.importorskip("ray", reason="ray is in the [ray] extra")
    from tools.ray_local import RAY_ENV, LocalRayCluster

    mp = pytest.MonkeyPatch()
    for k, v in RAY_ENV.items():  # the driver (this process) must match the nodes
        mp.setenv(k, v)
    # a lost node is declared dead after ~2 s instead of Ray's default ~15 s
    fast_health_checks = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
                          "RAY_health_check_failure_threshold": "3"}
    c = LocalRayCluster(nodes=2, cpus_per_node=1, env={**_aws_env(s3_server), **fast_health_checks})
    try:
        c.start()
        yield c
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        c.stop()
        mp.undo()


@pytest.fixture(scope="module")
def driver(cluster: Any) -> Iterator[Any]:
    """This process connected to the cluster once, as a user's Ray driver script is: packs
    then reuse the connection and the cluster keeps its worker processes between them."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=cluster.address, logging_level=logging.WARNING)
    try:
        # start this driver's worker process on every node now: Ray hands a whole short job to
        # the first worker that is up, and the node-loss test needs node 2 to take shards
        from fastfeed.packing.engines.ray import _node  # importable on the workers (this test module is not)

        warm = ray.remote(num_cpus=1)(_node)
        ray.get([warm.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
                 for n in ray.nodes() if n["Alive"]])
        yield cluster
    finally:
        ray.shutdown()


def _bad_jpeg() -> bytes:
    return messy_images()["progressive.jpg"][0][:700]  # a JPEG header, data cut off


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder with real-world messy images and three bad files of different kinds."""
    from _pack_data import write_messy_folder

    root = make_image_folder(tmp_path_factory.mktemp("ray-src") / "train", num_images=40, num_classes=3,
                             size=(96, 72), vary_size=True)
    write_messy_folder(root, classes=3)
    (root / "n00000000" / "empty.jpg").write_bytes(b"")                     # skipped while planning
    (root / "n00000001" / "notes.jpg").write_bytes(b"not an image at all")  # skipped while planning
    (root / "n00000002" / "cut.jpg").write_bytes(_bad_jpeg())               # skipped while writing
    return root


def _same_output(a: Path, b: Path) -> None:
    da, db = tree_digest(a), tree_digest(b)
    assert sorted(da) == sorted(db)
    assert da == db


# ---------------------------------------------------------------- identical output
def test_cli_ray_engine_matches_local_byte_for_byte(
    cluster: Any, images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    opts = ["--samples-per-shard", "6", "--max-side", "64", "--on-error", "skip"]
    assert main(["pack", str(images), str(tmp_path / "local"), "--workers", "2", *opts]) == 0
    with caplog.at_level(logging.INFO, logger="fastfeed.pack.ray"):
        rc = main(["pack", str(images), str(tmp_path / "ray"), "--engine", "ray",
                   "--ray-address", cluster.address, *opts])
    assert rc == 0
    out = capsys.readouterr().out
    assert "skipped 3 input(s)" in out
    _same_output(tmp_path / "local", tmp_path / "ray")
    rows = (tmp_path / "ray" / "skipped.txt").read_text().splitlines()[1:]
    assert sorted(r.split("\t")[0] for r in rows) == [
        "n00000000/empty.jpg", "n00000001/notes.jpg", "n00000002/cut.jpg"]
    idx = fastfeed.DatasetIndex.load(tmp_path / "ray")
    assert len(idx.skipped) == 3 and fastfeed.verify(tmp_path / "ray").ok
    assert not (tmp_path / "ray" / ".fastfeed-pack").exists()
    # the driver reported progress on the log (no terminal here) and both nodes wrote shards
    final = [r.getMessage() for r in caplog.records if "shards per node" in r.getMessage()]
    assert final and f"{len(idx.shards)}/{len(idx.shards)} shards" in final[0]
    assert "files/s" in final[0] and "MB/s" in final[0] and "ETA" in final[0]


def test_ray_engine_lmdb_jsonl_lengths_matches_local(driver: Any, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    manifest = make_text_jsonl(tmp_path / "src" / "texts.jsonl", num_samples=90)
    opts: dict[str, Any] = dict(format="lmdb", samples_per_shard=20, length="text", seed=3)
    local = pack(manifest, tmp_path / "local", workers=1, **opts)
    ray_idx = pack(manifest, tmp_path / "ray", engine="ray", **opts)
    _same_output(tmp_path / "local", tmp_path / "ray")
    assert ray_idx.num_samples == local.num_samples == 90
    assert list(ray_idx.lengths) == list(local.lengths)
    # a re-run finds the dataset complete and leaves it as it is
    again = pack(manifest, tmp_path / "ray", engine="ray", **opts)
    assert again.fingerprint == ray_idx.fingerprint
    _same_output(tmp_path / "local", tmp_path / "ray")


# ---------------------------------------------------------------- object storage + resume
def _s3_objects(server: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    s3 = server.client()
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) + 1:]] = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
    return out


@pytest.mark.s3
def test_s3_destination_fails_on_bad_file_then_resumes(
    driver: Any, s3_server: Any, s3_bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    import hashlib

    src = make_image_folder(tmp_path / "train", num_images=36, num_classes=3, size=(80, 60))
    bad = src / "n00000002" / "zz_last.jpg"  # sorts last: the last shard fails, the others complete
    bad.write_bytes(b"just some text, not a JPEG")
    opts: dict[str, Any] = dict(samples_per_shard=4, shuffle=False)
    url = f"s3://{s3_bucket}/ds"
    with pytest.raises(BadFileError) as local_err:
        pack(src, tmp_path / "local-fail", **opts)
    with pytest.raises(BadFileError) as ray_err:
        pack(src, url, engine="ray",
             storage_options=s3_server.storage_options, **opts)
    assert str(ray_err.value) == str(local_err.value)  # the same message, naming the file
    first = _s3_objects(s3_server, s3_bucket, "ds")
    assert "index.json" not in first and ".fastfeed-pack/job.json" in first
    # a shard is complete when its resume record is there (a shard uploaded by a task that was
    # cancelled before its record went up is written again)
    done_before = {k for k in first if k.startswith(".fastfeed-pack/shard-")}
    assert done_before, "some shards completed before the failure"
    assert all(k.replace(".fastfeed-pack/", "").replace(".json", ".tar") in first for k in done_before)

    bad.write_bytes(messy_images()["tiny.jpg"][0])  # the user fixes the file and re-runs
    with caplog.at_level(logging.INFO, logger="fastfeed.pack.ray"):
        idx = pack(src, url, engine="ray",
                   storage_options=s3_server.storage_options, **opts)
    final = [r.getMessage() for r in caplog.records if "shards per node" in r.getMessage()][-1]
    assert f"{len(done_before)} reused" in final

    pack(src, tmp_path / "local", **opts)
    objects = _s3_objects(s3_server, s3_bucket, "ds")
    local = {str(p.relative_to(tmp_path / "local")): p.read_bytes()
             for p in (tmp_path / "local").rglob("*") if p.is_file()}
    assert sorted(objects) == sorted(local)  # resume records and temporaries are gone
    assert {k: hashlib.sha256(v).hexdigest() for k, v in objects.items()} == \
        {k: hashlib.sha256(v).hexdigest() for k, v in local.items()}
    assert idx.root == url and idx.num_samples == 37
    assert json.loads(objects["index.json"])["num_samples"] == 37


@pytest.mark.s3
def test_s3_source_packs_like_its_local_copy(
    driver: Any, s3_server: Any, s3_bucket: str, images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fsspec

    for k, v in _aws_env(s3_server).items():
        monkeypatch.setenv(k, v)
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.put(str(images), f"{s3_bucket}/train", recursive=True)
    opts: dict[str, Any] = dict(samples_per_shard=9, on_error="skip", seed=7)
    pack(images, tmp_path / "local", **opts)
    idx = pack(f"s3://{s3_bucket}/train", tmp_path / "ray", engine="ray", **opts)
    _same_output(tmp_path / "local", tmp_path / "ray")
    # cut.jpg (no end-of-image marker) is left out while writing even without --max-side
    assert {s["path"] for s in idx.skipped} == {"n00000000/empty.jpg", "n00000001/notes.jpg", "n00000002/cut.jpg"}


@pytest.mark.s3
def test_local_engine_packs_into_s3_too(s3_server: Any, s3_bucket: str, images: Path, tmp_path: Path) -> None:
    opts: dict[str, Any] = dict(samples_per_shard=10, on_error="skip", max_side=64, workers=2)
    pack(images, tmp_path / "local", **opts)
    url = f"s3://{s3_bucket}/local-engine"
    idx = pack(images, url, storage_options=s3_server.storage_options, **opts)
    objects = _s3_objects(s3_server, s3_bucket, "local-engine")
    assert {k: len(v) for k, v in objects.items()} == \
        {k: len(v) for k, v in ((p.name, p.read_bytes()) for p in (tmp_path / "local").iterdir())}
    assert all(objects[p.name] == p.read_bytes() for p in (tmp_path / "local").iterdir())
    assert idx.root == url and len(idx.skipped) == 3
    with pytest.raises(DestinationError, match="already holds a complete dataset packed from other"):
        pack(images, url, storage_options=s3_server.storage_options, **{**opts, "seed": 1})


# ---------------------------------------------------------------- errors without a cluster
def test_missing_ray_gives_the_install_line(monkeypatch: pytest.MonkeyPatch, images: Path, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'fastfeed\[ray\]'"):
        pack(images, tmp_path / "out", engine="ray")
    assert not (tmp_path / "out").exists()  # refused before planning touched DST


def test_engine_and_address_are_checked(images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="engine='spark'"):
        pack(images, tmp_path / "out", engine="spark")
    assert main(["pack", str(images), str(tmp_path / "o"), "--ray-address", "127.0.0.1:1"]) == 2
    assert "--ray-address needs --engine ray" in capsys.readouterr().err


def test_task_refuses_a_destination_its_node_cannot_see(images: Path, tmp_path: Path) -> None:
    from fastfeed import __version__
    from fastfeed.packing.engines.ray import _write_task, shard_plan

    plan = plan_pack(images, tmp_path / "out", samples_per_shard=10, on_error="skip")
    sub = shard_plan(plan, 1)
    assert sub.shards[0].number == 1 and len(sub.shards) == 1
    elsewhere = sub.__class__(**{**sub.__dict__, "dst": str(tmp_path / "not-mounted-here")})
    with pytest.raises(DestinationError, match="not-mounted-here: not found on Ray node"):
        _write_task(elsewhere, None, __version__)
    with pytest.raises(ConfigError, match="install the same fastfeed on every node"):
        _write_task(sub, None, "0.0.0")
    result, _ = _write_task(sub, None, __version__)  # the task body, run here, writes shard 1
    assert result.number == 1 and (tmp_path / "out" / plan.shards[1].name).is_file()
    # a node that wrote into its own disk instead of the shared DST is caught before the index
    from fastfeed.packing.engines.ray import _check_shards_here

    other = plan.__class__(**{**plan.__dict__, "dst": str(tmp_path / "driver-view")})
    with pytest.raises(DestinationError, match="driver-view/shard-000001.tar: written by a Ray node but missing"):
        _check_shards_here(other, [result])


# ---------------------------------------------------------------- node loss (kills node 2: last)
def test_losing_a_node_mid_shard_still_gives_identical_output(driver: Any, tmp_path: Path) -> None:
    cluster = driver
    src = make_image_folder(tmp_path / "train", num_images=200, num_classes=4, size=(320, 240))
    opts: dict[str, Any] = dict(samples_per_shard=10, max_side=96)
    killed: list[int] = []
    stop = threading.Event()

    def kill_node_2_while_it_writes() -> None:
        while not stop.is_set():
            if cluster.busy(1, "fastfeed-pack"):  # a task's process title: ray::<task name>
                killed.append(cluster.kill_raylet(1))
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_node_2_while_it_writes, daemon=True)
    killer.start()
    try:
        pack(src, tmp_path / "ray", engine="ray", **opts)
    finally:
        stop.set()
        killer.join()
    assert killed, "node 2 never ran a shard, so nothing was killed"
    assert cluster.nodes[1].raylet_pid() is None
    pack(src, tmp_path / "local", workers=1, **opts)
    _same_output(tmp_path / "local", tmp_path / "ray")
    assert not list((tmp_path / "ray").glob("*.tmp"))


def test_ray_engine_parquet_with_tokenizer_matches_local(driver: Any, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = [f"row {i} of a small parquet corpus" for i in range(30)]
    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"text": texts, "n": list(range(30))}), tmp_path / "src" / "a.parquet", row_group_size=7)
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=60, special_tokens=["[PAD]", "[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    opts: dict[str, Any] = dict(samples_per_shard=10, tokenizer=tmp_path / "tokenizer.json", tokenize="text")
    local = pack(tmp_path / "src", tmp_path / "local", **opts)
    ray_idx = pack(tmp_path / "src", tmp_path / "ray", engine="ray", **opts)
    _same_output(tmp_path / "local", tmp_path / "ray")
    assert ray_idx.input == "parquet" and list(ray_idx.lengths) == list(local.lengths)
    assert ray_idx.num_samples == 30
