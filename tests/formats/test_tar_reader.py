"""The loader's tar parser: its fast path for plain ustar members gives exactly what the general one gives.

Every span is a real tar made by :mod:`tarfile` (ustar, GNU and pax formats) or by
fastfeed's own writer, some then altered byte by byte the way other writers spell their
headers; each is parsed three ways: :func:`parse_sample` (fast path first), the general
parser ``_parse`` alone, and, where both give a dict, the fast path alone must give it too
or decline (None).
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from fastfeed.errors import SampleError
from fastfeed.formats import tar_reader
from fastfeed.formats.naming import split_key
from fastfeed.formats.tar import TarShardWriter
from fastfeed.formats.tar_reader import FastTarReader, parse_sample


def _tar(members: list[tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT, *, end: bool = False,
         kind: bytes = tarfile.REGTYPE) -> bytes:
    """The members as a tar; without the end-of-archive blocks unless ``end``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.type, info.mtime = len(data), kind, 1_700_000_000
            tf.addfile(info, io.BytesIO(data))
        body = out.tell()
    return out.getvalue() if end else out.getvalue()[:body]


def _checksummed(h: bytearray, spelling: str = "%06o\0 ") -> bytearray:
    h[148:156] = b" " * 8
    h[148:156] = (spelling % sum(h)).encode()
    return h


def _respelled(buf: bytes, at: int, field: slice, value: bytes, spelling: str = "%06o\0 ") -> bytes:
    """``buf`` with one header field rewritten and the header's checksum fixed."""
    b = bytearray(buf)
    h = bytearray(b[at:at + 512])
    h[field] = value
    b[at:at + 512] = _checksummed(h, spelling)
    return bytes(b)


def _general(buf: bytes) -> dict | None:
    try:
        return tar_reader._parse(buf, "<tar>", 0)
    except (tar_reader._Unusual, ValueError):
        return None


def _outcome(parse, buf: bytes) -> object:
    """What ``parse(buf)`` gives, or the message of the SampleError it raises."""
    try:
        return parse(buf)
    except SampleError as e:
        return str(e)


PLAIN = {  # spans the fast path reads itself
    "three fields": _tar([("000001.id.txt", b"000001"), ("000001.text", b"x" * 1777),
                          ("000001.tokens.npy", b"\x93NUMPY" + b"\0" * 130)]),
    "empty members": _tar([("k.a", b""), ("k.b", b""), ("k.c", b"z")]),
    "odd sizes": _tar([(f"k.f{n}", bytes(range(256)) * (n // 256) + bytes(n % 256)) for n in (1, 511, 512, 513, 1025)]),
    "folders and dots": _tar([("a.b/c/k.seg.PNG", b"p"), ("a.b/c/k.JSON", b"{}"), ("a.b/c/k.txt.gz", b"g")]),
    "ustar prefix (a long name)": _tar([("d" * 120 + "/k.txt", b"1"), ("d" * 120 + "/k.cls", b"2")]),
    "one member": _tar([("solo.bin", b"\xff" * 700)]),
    "end-of-archive blocks": _tar([("k.a", b"1"), ("k.b", b"2")], end=True),
    "a hidden name": _tar([("a/b/.x.txt", b"h"), ("a/b/.y.txt", b"i")]),
    "non-UTF-8 bytes": _tar([("k\udce9.txt", b"e"), ("k\udce9.cls", b"1")]),
    "a newline in the key": _tar([("a\n/b.txt", b"n"), ("a\n/b.cls", b"1")]),
    "contiguous file type": _tar([("k.a", b"7")], kind=tarfile.CONTTYPE),
    "fastfeed's writer": None,  # filled below
}


def _writer_span(tmp: Path) -> bytes:
    w = TarShardWriter(tmp / "s.tar")
    w.add("w/k0", {"txt": b"t"})
    off, size = w.add("w/k1", {"txt": b"hello", "cls": b"3", "npy": b"\x93NUMPY" * 100})
    w.close()
    return (tmp / "s.tar").read_bytes()[off:off + size]


OTHER = {  # spans the fast path leaves to the general parser, which must still read them
    "GNU long name": _tar([("g" * 150 + ".txt", b"1"), ("g" * 150 + ".cls", b"2")], tarfile.GNU_FORMAT),
    "pax long name": _tar([("p" * 150 + ".txt", b"1"), ("p" * 150 + ".cls", b"2")], tarfile.PAX_FORMAT),
    "pax non-ASCII": _tar([("ké.txt", b"1"), ("ké.cls", b"2")], tarfile.PAX_FORMAT),
    "GNU magic": _tar([("k.txt", b"1"), ("k.cls", b"2")], tarfile.GNU_FORMAT),
    "a directory first": _tar([("k", b"")], kind=tarfile.DIRTYPE) + _tar([("k.txt", b"1")]),
    "a member without key": _tar([("README", b"r"), ("k.txt", b"1")]),
    "a metadata member": _tar([("__meta__/x.json", b"{}"), ("k.txt", b"1")]),
    "dunder key": _tar([("__k.txt", b"1"), ("__k.a__", b"2")]),
    "size NUL-padded": _respelled(_tar([("k.txt", b"abc"), ("k.cls", b"1")]), 0, slice(124, 136), b"3\0" + b"\0" * 10),
    "size without terminator": _respelled(_tar([("k.txt", b"abc")]), 0, slice(124, 136), b"000000000003"),
    "checksum of 7 digits": _respelled(_tar([("k.txt", b"abc")]), 0, slice(124, 136), b"00000000003\0", "%07o\0"),
    "checksum with NUL first": _respelled(_tar([("k.txt", b"abc")]), 0, slice(124, 136), b"00000000003\0", "%06o  "),
}


def _signed(buf: bytes) -> bytes:
    """An old tar's header: a byte above 127 and the checksum summed over signed chars."""
    b = bytearray(buf)
    h = bytearray(b[:512])
    h[265:270] = b"\xe9user"  # uname
    h[148:156] = b" " * 8
    signed = sum(x - 256 if x > 127 else x for x in h)
    h[148:156] = b"%06o\0 " % signed
    b[:512] = h
    return bytes(b)


OTHER["old signed checksum"] = _signed(_tar([("k.txt", b"abc")]))


def _cases(tmp_path: Path, table: dict) -> dict[str, bytes]:
    return {k: (v if v is not None else _writer_span(tmp_path)) for k, v in table.items()}


@pytest.mark.parametrize("case", sorted(PLAIN))
def test_plain_spans_take_the_fast_path_and_match_the_general_parser(tmp_path: Path, case: str) -> None:
    buf = _cases(tmp_path, PLAIN)[case]
    want = _general(buf)
    assert want is not None and want["__key__"]
    assert tar_reader._parse_plain(buf) == want
    got = parse_sample(buf)
    assert got == want and list(got) == list(want)  # the same fields in the same order
    mapped = parse_sample(memoryview(buf))  # a memory-mapped shard: the same sample
    assert {k: bytes(v) if isinstance(v, memoryview) else v for k, v in mapped.items()} == want
    assert all(type(v) is bytes for k, v in mapped.items() if k not in ("__key__", "rgb8"))


@pytest.mark.parametrize("case", sorted(OTHER))
def test_other_spans_are_left_to_the_general_parser(case: str) -> None:
    buf = OTHER[case]
    try:
        fast = tar_reader._parse_plain(buf)
    except ValueError:
        fast = None
    want = _general(buf)
    assert fast is None or fast == want
    assert parse_sample(buf) == want
    if want is not None:  # and tarfile agrees with what the general parser read
        with tarfile.open(fileobj=io.BytesIO(buf + b"\0" * 1024)) as tf:
            names = [m.name for m in tf.getmembers() if m.isfile()]
        assert {split_key(n)[1] for n in names if split_key(n) and split_key(n)[0] == want["__key__"]} \
            == set(want) - {"__key__"}


def test_fields_match_for_names_the_key_rule_splits_oddly() -> None:
    """Later members of a sample skip the key rule's regexes when they start with key + "."
    (the shortcut); over odd names both ways must agree."""
    names = ["a.b/c.d", "a/b/.x", "x.y/z", "k\n.t", "k.\n", "k.a.b.C", "d/k.", "k.Ä", "_.x", "k.x/y"]
    fast = 0
    for first in names:
        for later in names + [first + ".x", first + "/.y"]:
            buf = _tar([(first, b"1"), (later, b"2")])
            assert _outcome(parse_sample, buf) == _outcome(_general, buf), (first, later)
            fast += tar_reader._parse_plain(buf) is not None
    assert fast >= 20  # the shortcut did run


def test_bad_checksum_and_foreign_members_raise_in_both_paths() -> None:
    good = _tar([("k.txt", b"abc"), ("k.cls", b"1")])
    bad = bytearray(good)
    bad[1024 + 3] ^= 1  # inside the second header's name: its checksum no longer fits
    with pytest.raises(SampleError, match="corrupt tar header at offset 1536 \\(bad checksum\\)"):
        parse_sample(bytes(bad), "s.tar", 512)
    two = _tar([("k.txt", b"abc"), ("j.txt", b"1")])
    with pytest.raises(SampleError, match="more than one sample"):
        parse_sample(two)
    with pytest.raises(SampleError, match="runs past the sample's span"):
        parse_sample(good[:1024 + 512])  # the second member's data cut off


def test_a_shard_reads_the_same_through_the_reader(tmp_path: Path) -> None:
    """FastTarReader over a real shard gives what tarfile's reader gives, sample by sample."""
    from fastfeed.formats.tar import TarShardReader

    path = tmp_path / "s.tar"
    w = TarShardWriter(path)
    locs = [w.add(f"d/{i:04d}" + "x" * (i * 7), {"txt": b"t" * i, "npy": bytes(i * 97), "cls": b"%d" % i})
            for i in range(30)]
    w.close()
    fast, slow = FastTarReader(path), TarShardReader(path)
    for off, size in locs:
        assert fast.read(off, size) == slow.read(off, size)
