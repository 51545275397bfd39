"""Every command fastfeed prints as advice works from a clone installed as README.md says
(``pip install .`` or ``pip install -e '.[dev,docs]'``; fastfeed is on no package index).

The commands are collected from the message sources: every string literal and f-string of
``fastfeed/`` and ``tools/`` that is no docstring (placeholders stand for what the code fills
in), plus the rendered messages of :func:`fastfeed.errors.missing_dependency` at each of its
call sites. Three kinds:

- ``pip install ...``: parsed by pip's own parser (the flags exist); each requirement is the
  clone (``.``, ``'.[extra]'``), fastfeed with extras (``'fastfeed[extra]'``: pip takes the
  installed fastfeed and adds the extra's packages, no index needed), or a distribution that
  exists (installed here, or named by pyproject.toml); extras exist in pyproject.toml; plain
  ``fastfeed`` (``--no-binary fastfeed fastfeed``) is refused: it needs fastfeed on an index;
- ``apt-get install ...``: Debian/Ubuntu packages from a fixed list (the JPEG ones ship
  ``jpeglib.h``, which ``fastfeed/_jpegroi.c`` includes: ``libturbojpeg0-dev`` does not);
- ``fastfeed COMMAND ...``: parsed by ``fastfeed``'s own parser (the command and its flags
  exist), with metavariables such as ``SRC DST`` standing for the positionals; a bare
  ``fastfeed pack`` ("re-run `fastfeed pack`") names a command; and every ``--flag`` a message
  names outside a command (``pass --key-by path``) is a flag of some command.

The docs' install lines (README.md, docs/) are checked the same way.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import io
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from fastfeed.cli.app import COMMANDS, build_parser
from fastfeed.errors import missing_dependency

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(ROOT / "fastfeed").rglob("*.py"), *(ROOT / "tools").rglob("*.py")])
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]

#: What a placeholder of a message (``%s``, ``{x}``) stands for: one token of any kind.
HOLE = "\x00"

#: Debian/Ubuntu packages fastfeed may name, and why; the JPEG ones ship jpeglib.h.
DEBIAN = {
    "gcc": "the C compiler of the extensions",
    "libjpeg62-turbo-dev": "jpeglib.h and libjpeg.so, Debian",
    "libjpeg-turbo8-dev": "jpeglib.h and libjpeg.so, Ubuntu",
    "libjpeg-dev": "the distribution's libjpeg headers (Debian and Ubuntu)",
}

#: Distributions advised by name that pyproject.toml does not list (they exist on PyPI).
KNOWN_DISTRIBUTIONS = {"xxhash"}

#: Words that end a command written inside a sentence ("pip install xxhash everywhere, ...").
PROSE = {"everywhere", "first", "then", "or", "and", "to", "for", "in", "on", "with", "from", "before", "after"}

#: Source files whose advice is known to be wrong, each with why; they are outside the change
#: that added this test. Strict: fixing one makes its case pass, and the entry must go.
KNOWN_WRONG: dict[str, str] = {}


@dataclass(frozen=True)
class Message:
    """One string the package can print: where it is, its text (placeholders as HOLE)."""

    where: str
    text: str


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings (module, class, function, attribute)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            for stmt in body if isinstance(body, list) else []:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                        and isinstance(stmt.value.value, str):
                    ids.add(id(stmt.value))
    return ids


def _holes(text: str) -> str:
    return re.sub(r"%[-#0 +]*\d*(?:\.\d+)?[sdrifg]", HOLE, text)


def messages_of(path: Path) -> list[Message]:
    """Every string literal and f-string of ``path`` that is no docstring."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstrings(tree)
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    rel = path.relative_to(ROOT).as_posix()
    out = []
    for node in ast.walk(tree):
        if id(node) in skip or id(node) in inner:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
        else:
            continue
        out.append(Message(f"{rel}:{node.lineno}", _holes(text)))
    return out


# ------------------------------------------------------------------------------ finding commands
_END = re.compile(r"[`;,()]|\s\((?=\w)|$")


def _command_after(text: str, start: int) -> str:
    """The command that starts at ``start``, up to the punctuation or prose that ends it."""
    rest = text[start:]
    if start > 0 and text[start - 1] == "`":  # a code span: up to its closing backtick
        return rest.split("`", 1)[0]
    m = re.search(r"`|;|,\s|\)|\s\(|\s#|\s[|>&]|$", rest)
    words = rest[: m.start()].split()
    for i, w in enumerate(words[2:], 2):  # "pip install", "apt-get install", "fastfeed CMD"
        if w in PROSE:
            words = words[:i]
            break
    return " ".join(words)


def commands(text: str, head: str) -> list[str]:
    """The commands in ``text`` that start with ``head`` (``pip install``, ``apt-get install``)."""
    return [_command_after(text, m.start()) for m in re.finditer(rf"(?<![\w-]){re.escape(head)}\b", text)]


_SUBCOMMANDS = {c.name for c in COMMANDS}


def fastfeed_commands(text: str) -> list[str]:
    """The ``fastfeed COMMAND ...`` command lines of ``text``.

    In a code span always; in prose only when arguments follow (``fastfeed verify DST``), so
    that "a fastfeed tune result" or "fastfeed pack's default" are words, not commands.
    """
    out = []
    for m in re.finditer(r"(?<![\w./-])fastfeed (\w+)", text):
        in_span = m.start() > 0 and text[m.start() - 1] == "`"
        after = text[m.end():]
        if m.group(1) not in _SUBCOMMANDS:
            if in_span:
                out.append(_command_after(text, m.start()))  # `fastfeed frobnicate`: an unknown command
            continue
        if after[:1] not in ("", " "):  # "fastfeed pack: error: ...", "fastfeed pack's": its output, a word
            continue
        if not in_span and not re.match(rf" (?:-|{HOLE}|[A-Z]{{2,}}\b|\.\.\.|\S*[/.]\S)", after):
            continue
        out.append(_command_after(text, m.start()))
    return out


def _other_tools(text: str) -> str:
    """``text`` without code spans of other tools (`ray start --head`) and install commands."""
    text = re.sub(r"`(?!fastfeed )[^`]*`", " ", text)
    for head in ("pip install", "apt-get install", "apt install"):
        for cmd in commands(text, head):
            text = text.replace(cmd, " ")
    for cmd in fastfeed_commands(text):
        text = text.replace(cmd, " ")
    return text


# ----------------------------------------------------------------------------------- checking them
def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _named_by_pyproject() -> set[str]:
    reqs = [*PYPROJECT["project"]["dependencies"], *(r for rs in EXTRAS.values() for r in rs)]
    return {canonicalize_name(Requirement(r).name) for r in reqs}


def check_pip(command: str, text: str = "") -> list[str]:
    """What is wrong with ``pip install ...`` (empty: nothing); ``text`` is the whole message."""
    from pip._internal.commands import create_command

    args = shlex.split(command)[2:]
    if not args:
        return []  # "`pip install` also builds ...": the command named, not a command line
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            options, reqs = create_command("install").parse_args(args)
        reqs = [*options.editables, *reqs]
    except SystemExit:
        return [f"pip does not parse {command!r}: {err.getvalue().strip()}"]
    if not reqs:
        return [f"{command!r} installs nothing"]
    problems = []
    known = _named_by_pyproject() | KNOWN_DISTRIBUTIONS
    for req in reqs:
        if HOLE in req:
            continue  # filled in by the code: test_missing_dependency_messages renders them
        local = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", req)
        if local:
            extras = local.group(1).split(",") if local.group(1) else []
        else:
            try:
                parsed = Requirement(req)
            except InvalidRequirement:
                problems.append(f"{command!r}: {req!r} is no requirement")
                continue
            name, extras = canonicalize_name(parsed.name), sorted(parsed.extras)
            if name == "fastfeed" and not extras:
                problems.append(f"{command!r}: installs fastfeed from a package index, where it is not; "
                                "from the clone: pip install . (or -e .)")
            elif name != "fastfeed" and name not in known and not _installed(name):
                problems.append(f"{command!r}: {req!r} is no distribution pyproject.toml names or this "
                                "environment has")
            elif name != "fastfeed" and extras:
                problems.append(f"{command!r}: extras of {name} are not fastfeed's")
                extras = []
        problems += [f"{command!r}: pyproject.toml has no extra {e!r}" for e in extras if e not in EXTRAS]
    return problems


def check_apt(command: str) -> list[str]:
    words = [w for w in command.split()[2:] if not w.startswith("-")]
    if not words:
        return [f"{command!r} installs nothing"]
    return [f"{command!r}: {w!r} is not one of the Debian/Ubuntu packages fastfeed needs ({sorted(DEBIAN)}); "
            "the JPEG headers (jpeglib.h) are in libjpeg62-turbo-dev (Debian), libjpeg-turbo8-dev (Ubuntu)"
            for w in words if w not in DEBIAN]


def _parse(argv: list[str]) -> str:
    """argparse's complaint about ``fastfeed ARGV`` ('' when it parses)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            build_parser().parse_args(argv)
    except SystemExit as e:
        return err.getvalue().strip().splitlines()[-1] if e.code else ""
    return ""


def check_fastfeed(command: str) -> list[str]:
    """What is wrong with ``fastfeed COMMAND ...``: it must parse, metavariables standing in.

    Placeholders and metavariables parse as positionals (``1``); ``...`` and a command line
    written without its positionals ("re-pack with `fastfeed pack --format tar`") get the
    positionals the command needs.
    """
    words = shlex.split(re.sub(f"{HOLE}+", " 1 ", command).replace("[", " ").replace("]", " "))
    words = ["1" if re.fullmatch(r"[A-Z][A-Z0-9_]*", w) and i > 1 else w for i, w in enumerate(words)]  # DST, B
    argv = [w for w in words[1:] if w != "..."]  # "fastfeed pack ... --shard-size 256MB": the rest
    argv = ["1" if w == "..." and prev.startswith("-") else w  # "--tokenizer ...": a value
            for prev, w in zip(words, words[1:]) if w != "..." or prev.startswith("-")]
    if argv[0] == "COMMAND":  # "fastfeed COMMAND --help": every command
        return [p for c in sorted(_SUBCOMMANDS) for p in check_fastfeed(command.replace("COMMAND", c, 1))]
    if argv[0] not in _SUBCOMMANDS:
        return [f"{command!r}: fastfeed has no command {argv[0]!r} ({', '.join(sorted(_SUBCOMMANDS))})"]
    if len(argv) == 1:
        return []  # "re-run `fastfeed pack`": the command named
    if argv[-1].startswith("-") and "expected one argument" in _parse(argv):
        argv.append("1")  # "`fastfeed tune --plot`" names the flag: its value left out
    error = _parse(argv)
    for n in (1, 2):  # "re-pack with `fastfeed pack --format tar`": the positionals left out
        if not re.search(r"the following arguments are required: (?!-)", error):
            break
        error = _parse([argv[0], *["1"] * n, *argv[1:]])
    return [f"{command!r} does not parse: {error}"] if error else []


def _all_flags() -> set[str]:
    parser = build_parser()
    flags = {o for a in parser._actions for o in a.option_strings}
    for sub in parser._subparsers._group_actions[0].choices.values():
        flags |= {o for a in sub._actions for o in a.option_strings}
    return flags


def check_message(text: str) -> list[str]:
    problems = []
    for cmd in commands(text, "pip install"):
        problems += check_pip(cmd, text)
    for head in ("apt-get install", "apt install"):
        for cmd in commands(text, head):
            problems += check_apt(cmd)
    for cmd in fastfeed_commands(text):
        problems += check_fastfeed(cmd)
    flags = _all_flags()
    for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", _other_tools(text)):
        if flag not in flags:
            problems.append(f"--{flag.lstrip('-')}: no fastfeed command has this flag")
    return problems


# --------------------------------------------------------------------------------------- the tests
def _advice(m: Message) -> bool:
    if m.text.startswith("-") and " " not in m.text:  # a flag's own definition: add_argument("--x")
        return False
    return bool(re.search(r"pip install|apt-get install|apt install|fastfeed \w|(?<![\w-])--[a-z]", m.text))


@pytest.mark.parametrize("source", [
    pytest.param(p, id=p.relative_to(ROOT).as_posix(),
                 marks=[pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[p.relative_to(ROOT).as_posix()])]
                 if p.relative_to(ROOT).as_posix() in KNOWN_WRONG else [])
    for p in SOURCES if any(_advice(m) for m in messages_of(p))])
def test_every_command_a_message_gives_works_from_the_clone(source: Path) -> None:
    problems = [f"{m.where}: {p}" for m in messages_of(source) if _advice(m) for p in check_message(m.text)]
    assert not problems, "\n".join(problems)


def _missing_dependency_calls() -> list[tuple[str, str, str, str]]:
    """``(where, module, extra, purpose)`` of every call of missing_dependency with constants."""
    calls = []
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) \
                    == "missing_dependency" and len(node.args) == 3:
                values = [a.value if isinstance(a, ast.Constant) else "X" for a in node.args]
                calls.append((f"{path.relative_to(ROOT).as_posix()}:{node.lineno}", *values))
    return calls


CALLS = _missing_dependency_calls()


def test_missing_dependency_is_called_where_the_extras_are() -> None:
    assert len(CALLS) >= 8, CALLS  # the scan finds the call sites (tune --plot, parquet, ray, ...)


@pytest.mark.parametrize(("where", "module", "extra", "purpose"), CALLS, ids=[c[0] for c in CALLS])
def test_missing_dependency_messages(where: str, module: str, extra: str, purpose: str) -> None:
    """Each rendered message: a working install line, of an extra that brings the module."""
    text = str(missing_dependency(module, extra, purpose))
    assert not check_message(text), check_message(text)
    assert f"pip install '.[{extra}]'" in text  # the clone's spelling, as README.md installs
    assert extra in EXTRAS, f"{where}: pyproject.toml has no extra {extra!r}"
    if module != "X":  # the module's distribution is one the extra installs
        brings = {canonicalize_name(Requirement(r).name) for r in EXTRAS[extra]}
        assert canonicalize_name(module) in brings or canonicalize_name(module.split(".")[0]) in brings, \
            f"{where}: the {extra!r} extra ({sorted(brings)}) does not install {module!r}"


def _doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _doc_texts(page: Path) -> list[tuple[int, str]]:
    """``(line, text)``: each line of a code block, each paragraph of prose on one line."""
    out: list[tuple[int, str]] = []
    para: list[str] = []
    start, fence = 0, False
    for n, line in enumerate([*page.read_text().splitlines(), ""], 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            line = ""
        if fence:
            if out and out[-1][1].endswith("\\"):  # a continued shell line
                out[-1] = (out[-1][0], out[-1][1][:-1] + " " + line.strip())
            else:
                out.append((n, line))
            continue
        if line.strip():
            start = start or n
            para.append(line.strip())
        elif para:
            out.append((start, " ".join(para)))
            para, start = [], 0
    return out


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_command_of_the_docs_works_from_the_clone(page: Path) -> None:
    problems = []
    for n, line in _doc_texts(page):
        for cmd in commands(line, "pip install"):
            problems += [f"{page.name}:{n}: {p}" for p in check_pip(cmd, line)]
        for head in ("apt-get install", "apt install"):
            problems += [f"{page.name}:{n}: {p}" for cmd in commands(line, head) for p in check_apt(cmd)]
        for cmd in fastfeed_commands(line):
            problems += [f"{page.name}:{n}: {p}" for p in check_fastfeed(cmd)]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------- the checker, checked
@pytest.mark.parametrize(("text", "wrong"), [
    ("pip install --force-reinstall --no-deps --no-binary fastfeed fastfeed", True),
    ("pip install 'fastfeed[plott]'", True),
    ("pip install --no-such-flag .", True),
    ("pip install '.[plot]'", False),
    ("pip install 'fastfeed[plot]' (or pip install '.[plot]' in the clone)", False),
    ("needs xxhash (pip install xxhash everywhere, for xxh3_64)", False),
    ("apt-get install gcc libturbojpeg0-dev", True),
    ("apt-get install gcc libjpeg62-turbo-dev", False),
    ("re-run `fastfeed pack`", False),
    ("re-pack with `fastfeed pack --format tar`", False),
    ("re-pack with `fastfeed pack --fromat tar`", True),
    ("measure it with `fastfeed tune \x00 --batch-size \x00\x00`", False),
    ("`fastfeed tune DATASET --batch-szie 64`", True),
    ("`fastfeed frobnicate DST`", True),
    ("(fastfeed pack --tokenizer ... --tokenize FIELD)", False),
    ("check it before training: fastfeed verify \x00", False),
    ("a fastfeed tune result, else 2; fastfeed pack's default", False),
    ("pass --ray-address HOST:PORT (as printed by `ray start --head`)", False),
    ("or pass --key-by path", True),
])
def test_the_checker_tells_working_advice_from_broken(text: str, wrong: bool) -> None:
    assert bool(check_message(text)) == wrong, check_message(text)
