"""sources/base.py's Source protocol, honoured by every input kind: one harness, the same assertions.

Each case builds an input in tmp_path, opens it with ``open_source`` and runs :func:`_honours`:
what the planner reads (kind, where, problems, units and their measures, fields, labels), the
content id, the light copy every writer gets, and reading a shard's units back as items
(images through the writer's function, lengths, bad input raised or skipped). Then the
planner and the writer pack it through the protocol alone.
"""

from __future__ import annotations

import io
import json
import pickle
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from fastfeed.errors import BadFileError
from fastfeed.packing.finish import finalize
from fastfeed.packing.options import PackOptions
from fastfeed.packing.plan import plan_source
from fastfeed.packing.sources.base import (
    INPUTS,
    Content,
    Fields,
    Item,
    Measure,
    Member,
    Problem,
    Reading,
    Source,
    show,
)
from fastfeed.packing.sources.detect import open_source
from fastfeed.packing.write import write_shard
from tools.synth import make_jpeg


@dataclass(frozen=True)
class Expect:
    """What a case's source must show."""

    kind: str
    rows: int
    field: str  #: a name --tokenize/--length may use
    labels: bool
    blocks: bool = False
    images: bool = True  #: every sample holds an image
    length: str | None = None  #: a --length spec every sample has
    classes: tuple[str, ...] | None = None


def _jpeg(i: int) -> bytes:
    return make_jpeg(np.random.default_rng(i), (16 + i, 12))


def _imagefolder(root: Path) -> tuple[Any, Expect]:
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            (root / c / f"{i}.jpg").write_bytes(_jpeg(i))
    return root, Expect("imagefolder", 6, "jpg", labels=True, classes=("cat", "dog"))


def _files(root: Path) -> tuple[Any, Expect]:
    root.mkdir()
    for i in range(5):
        (root / f"{i:04d}.jpg").write_bytes(_jpeg(i))
        (root / f"{i:04d}.txt").write_text(" ".join(["word"] * (i + 1)))
        (root / f"{i:04d}.cls").write_text(str(i % 2))
    return root, Expect("files", 5, "txt", labels=True, length="txt")


def _jsonl(root: Path) -> tuple[Any, Expect]:
    (root / "img").mkdir(parents=True)
    lines = []
    for i in range(4):
        (root / "img" / f"{i}.jpg").write_bytes(_jpeg(i))
        lines.append(json.dumps({"image": f"img/{i}.jpg", "caption": f"photo {i}", "n": i, "label": i % 2}))
    (root / "data.jsonl").write_text("\n".join(lines) + "\n")
    return root / "data.jsonl", Expect("jsonl", 4, "caption", labels=True, length="n")


def _webdataset(root: Path) -> tuple[Any, Expect]:
    root.mkdir()
    for t in range(2):
        with tarfile.open(root / f"part-{t}.tar", "w") as tf:
            for i in range(3):
                for ext, data in (("jpg", _jpeg(i)), ("txt", f"caption {t} {i}".encode()), ("cls", b"%d" % i)):
                    info = tarfile.TarInfo(f"s{t}_{i}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return root, Expect("webdataset", 6, "txt", labels=True, length="txt")


def _parquet(root: Path) -> tuple[Any, Expect]:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    root.mkdir()
    table = pa.table({"text": [f"row {i} " * (i + 1) for i in range(7)], "pic": [_jpeg(i) for i in range(7)],
                      "label": list(range(7))})
    pq.write_table(table, root / "data.parquet", row_group_size=3)
    return root, Expect("parquet", 7, "text", labels=True, blocks=True, length="text")


def _hf_dataset(rows: int = 5) -> Any:
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset.from_dict({"text": [f"doc {i}" for i in range(rows)], "label": list(range(rows))})


def _hf_folder(root: Path) -> tuple[Any, Expect]:
    _hf_dataset().save_to_disk(str(root))
    return root, Expect("hf", 5, "text", labels=True, blocks=True, images=False, length="text")


def _hf_object(root: Path) -> tuple[Any, Expect]:
    return _hf_dataset(), Expect("hf", 5, "text", labels=True, blocks=True, images=False, length="text")


def _imagefolder_at_s3(root: Path, request: pytest.FixtureRequest) -> tuple[Any, Expect]:
    """The object-store tree: the same ImageFolder behind an s3:// prefix (moto on 127.0.0.1)."""
    s3fs = pytest.importorskip("s3fs")
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    monkeypatch = request.getfixturevalue("monkeypatch")
    for k, v in {"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()
    request.addfinalizer(s3fs.S3FileSystem.clear_instance_cache)
    local, expect = _imagefolder(root)
    client = server.client()
    for p in sorted(local.rglob("*")):
        if p.is_file():
            client.upload_file(str(p), bucket, f"train/{p.relative_to(local).as_posix()}")
    return f"s3://{bucket}/train", expect


#: case -> (the kind it must be detected as, how to build it)
CASES: dict[str, tuple[str, Callable[..., tuple[Any, Expect]]]] = {
    "imagefolder": ("imagefolder", _imagefolder), "files": ("files", _files), "jsonl": ("jsonl", _jsonl),
    "webdataset": ("webdataset", _webdataset), "parquet": ("parquet", _parquet),
    "hf-folder": ("hf", _hf_folder), "hf-object": ("hf", _hf_object),
    "imagefolder-s3": ("imagefolder", _imagefolder_at_s3),
}


def test_every_input_kind_has_a_case() -> None:
    assert {kind for kind, _ in CASES.values()} == set(INPUTS)


@pytest.mark.parametrize("case", list(CASES))
def test_every_source_honours_the_protocol(case: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    kind, build = CASES[case]
    src, expect = build(tmp_path / "src", request) if case.endswith("-s3") else build(tmp_path / "src")
    assert expect.kind == kind
    source = open_source(src)  # detected, not told
    _honours(source, expect)
    _packs(source, expect, tmp_path / "out")


def _honours(src: Source, expect: Expect) -> None:
    # what the planner reads
    assert isinstance(src, Source)
    assert src.kind == expect.kind and src.kind in INPUTS
    assert all(isinstance(v, str) for v in (src.src, src.shown, src.root, src.location, src.identity))
    assert src.shown == show(src.shown) and src.src
    assert isinstance(src.skipped, tuple) and all(set(d) == {"path", "key", "reason"} for d in src.skipped)
    assert isinstance(src.ignored, tuple) and all(isinstance(n, str) for n in src.ignored)
    assert src.classes == expect.classes and src.has_labels is expect.labels
    assert src.blocks is expect.blocks
    units = src.units
    assert isinstance(units, tuple) and units
    for fmt in ("tar", "lmdb"):
        measures = [src.measure(u, fmt) for u in units]
        assert all(isinstance(m, Measure) and m.rows >= 1 and m.size > 0 and m.files >= 0 and m.nbytes >= 0
                   for m in measures)
    rows = sum(m.rows for m in measures)
    assert rows == expect.rows
    # split keeps every row in order; a sample is never cut, a block is cut into rows that fit
    small = src.split(1, 1)
    assert [src.measure(u, "tar").rows for u in small.units] == [1] * rows
    assert small.units == units if not src.blocks else len(small.units) == rows
    fields = src.fields
    assert isinstance(fields, Fields) and expect.field in fields.names
    assert set(fields.listed) <= set(fields.names) and fields.noun == ("column" if src.blocks else "field")
    # the content id: deterministic, and depends on the cut and the options
    cut = src.split(10**9, 2).units
    one = [(cut, ())]
    content = src.content(one, {"format": "tar"}, None)
    assert isinstance(content, Content) and content == src.content(one, {"format": "tar"}, None)
    assert content.id != src.content([(cut[:1], ()), (cut[1:], ())], {"format": "tar"}, None).id
    assert content.id != src.content(one, {"format": "lmdb"}, None).id
    assert content.id != src.content(one, {"format": "tar"}, "tokenizer-sha").id
    # the copy every writer gets: no units, picklable, and it reads the units a shard holds
    writer = pickle.loads(pickle.dumps(src.for_writer()))
    assert writer.units == () and writer.kind == src.kind and writer.identity == src.identity
    skipped: list[dict[str, str]] = []
    items = list(writer.read(units, (), Reading("raise", skipped)))
    assert len(items) == rows and not skipped
    keys = [it.key for it in items]
    assert len(set(keys)) == rows and keys == sorted(keys)
    known = set(fields.names.values())
    for it in items:
        assert isinstance(it, Item) and it.fields and it.length is None and isinstance(it.label, int)
        assert all(isinstance(v, bytes) and (f in known or "" in known) for f, v in it.fields.items())
    assert any(it.label >= 0 for it in items) is expect.labels
    assert sum(it.files for it in items) == sum(m.files for m in measures)
    assert sum(it.nbytes for it in items) == sum(m.nbytes for m in measures)
    alone = list(writer.read(units[:1], (), Reading("raise", [])))
    assert [it.key for it in alone] == keys[:src.measure(units[0], "tar").rows]
    if expect.length is not None:
        counted = list(writer.read(units, (), Reading("raise", [], length=expect.length)))
        assert all(isinstance(it.length, int) and it.length >= 0 for it in counted)
    # every image goes through the writer's function; a bad one is raised or skipped
    seen: list[Member] = []

    def image(m: Member, data: bytes, pixels: bool) -> bytes:
        seen.append(m)
        return data

    assert [it.fields for it in writer.read(units, (), Reading("raise", [], image=image, reencodes=True))] \
        == [it.fields for it in items]
    assert (len(seen) >= rows) is expect.images and all(m.path for m in seen)

    def bad(m: Member, data: bytes, pixels: bool) -> bytes:
        raise Problem(BadFileError, m.path or "", "broken", "fix it")

    if expect.images:
        with pytest.raises(BadFileError, match="broken; fix it"):
            list(writer.read(units, (), Reading("raise", [], image=bad, reencodes=True)))
        skipped = []
        assert list(writer.read(units, (), Reading("skip", skipped, image=bad, reencodes=True))) == []
        assert len(skipped) == rows and all(s["reason"] == "broken" for s in skipped)


def _packs(src: Source, expect: Expect, dst: Path) -> None:
    """The planner and the writer need nothing but the protocol."""
    plan = plan_source(src, dst, PackOptions.create(samples_per_shard=2, jpeg_restarts=False))
    assert plan.kind == expect.kind and plan.num_samples == expect.rows and len(plan.shards) >= 2
    idx = finalize(plan, [write_shard(plan, n) for n in range(len(plan.shards))])
    assert idx.num_samples == expect.rows and idx.input == expect.kind and idx.classes == expect.classes
