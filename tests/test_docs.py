"""The docs cannot rot: every example runs on the data its page names, with the results the page
shows; the API reference lists every public name at its defining module; the built site reads as
written (``test_site_*``: one ``mkdocs build --strict``, then what can be asserted on its pages).

- The example scripts (``docs/examples/``) run as their pages' commands say, on the data the
  pages' own ``python -m tools.demo ...`` line makes (its data and pack steps: tuning and the
  timed epoch measure this machine, not the example).
- A guide's example marked ``<!-- test: run -->`` (the line before its fence) runs as it is,
  in a fresh folder shared by the page's marked blocks, in page order: Python blocks with
  ``expression  # value`` lines checked against the value, bash blocks' ``fastfeed`` commands
  with the ``# output`` lines below them checked against what they print.
- Every ``>>>`` block of the docs runs as a doctest; every other Python block compiles and names
  only ``fastfeed`` attributes that exist.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import io
import math
import os
import re
import shlex
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import fastfeed

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
TRAIN = DOCS / "examples" / "train_cpu.py"
TRAIN_PAGE = DOCS / "examples" / "train_cpu.md"
MONITOR = DOCS / "examples" / "monitor_cpu.py"
MONITOR_PAGE = DOCS / "guides" / "monitor.md"
RUN_MARK = "<!-- test: run -->"


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    page: Path
    line: int
    lang: str
    text: str
    marked: bool  # the line before the fence is RUN_MARK

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` (indented ones, in lists, dedented)."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^( *)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, start = len(m.group(1)), i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        marked = start > 0 and lines[start - 1].strip() == RUN_MARK
        out.append(Block(page, start + 1, m.group(2), "\n".join(body) + "\n", marked))
        i += 1
    return out


def shell_commands(text: str) -> list[tuple[list[str], list[str]]]:
    """Each command of a bash block as argv, with the comment lines under it (its output)."""
    out: list[tuple[list[str], list[str]]] = []
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith("#"):
            if out:
                out[-1][1].append(line[1:].strip())
        elif line.strip():
            out.append((shlex.split(line, comments=True), []))
    return out


def page_commands(page: Path, program: str) -> list[list[str]]:
    """The commands of ``page``'s bash blocks that run ``program`` (``tools.demo``, a script)."""
    return [argv for b in blocks(page) if b.lang == "bash" for argv, _ in shell_commands(b.text)
            if program in argv]


# ------------------------------------------------------------------- the example scripts' data
@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the example pages' commands run in, after their ``python -m tools.demo ...``."""
    import tools.demo as demo

    made = {tuple(argv) for page in (TRAIN_PAGE, MONITOR_PAGE) for argv in page_commands(page, "tools.demo")}
    assert len(made) == 1, f"the example pages name one demo dataset, not {made}"
    argv = list(made.pop())
    assert argv[:3] == ["python", "-m", "tools.demo"], argv
    cwd = tmp_path_factory.mktemp("docs")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        mp.setattr(demo, "STEPS", [s for s in demo.STEPS if s[1] in (demo.make_data, demo.pack_data)])
        assert demo.main(argv[3:]) == 0
    return cwd


def _dataset(cwd: Path, argv: list[str]) -> str:
    """The dataset argument of an example's command line, as a path from the test's folder."""
    return str(cwd / next(a for a in argv[2:] if not a.startswith("-")))


def _run(argv: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    """Run a page's command line in ``cwd``, with this Python and the clone's docs/examples/."""
    cmd = [sys.executable if argv[0] == "python" else str(Path(sys.executable).with_name(argv[0])),
           *[str(ROOT / a) if a.startswith("docs/examples/") else a for a in argv[1:]]]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_demo_data_is_what_make_demo_makes_but_smaller(demo_dir: Path) -> None:
    """20 classes, as ``make demo``'s: the examples size their model from the index."""
    idx = fastfeed.DatasetIndex.load(demo_dir / "demo-data" / "train-ff")
    assert idx.num_samples == 200 and len(idx.classes) == 20


@pytest.mark.parametrize("argv", page_commands(TRAIN_PAGE, "docs/examples/train_cpu.py"), ids=" ".join)
def test_train_cpu_runs_as_its_page_says(argv: list[str], demo_dir: Path) -> None:
    out = _run(argv, demo_dir, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    n = fastfeed.DatasetIndex.load(_dataset(demo_dir, argv)).num_samples
    epochs = int(argv[argv.index("--epochs") + 1]) if "--epochs" in argv else 2
    assert out.stdout.strip() == f"trained on {epochs * n} samples"
    out = _run(argv, demo_dir, timeout=300)  # the same command again: the checkpoint is at the end
    assert out.returncode == 0 and out.stdout.strip() == "trained on 0 samples", out.stderr[-3000:]


def test_train_cpu_resumes_exactly(demo_dir: Path, tmp_path: Path) -> None:
    train = _module(TRAIN).train
    data = str(demo_dir / "demo-data" / "train-ff")
    n = fastfeed.DatasetIndex.load(data).num_samples
    full = train(data, str(tmp_path / "a.pt"), epochs=2)
    assert len(full) == 2 * n
    assert sorted(full[:n]) == sorted(full[n:]) and full[:n] != full[n:]   # every sample, a new order
    first = train(data, str(tmp_path / "b.pt"), epochs=2, stop_after=64)  # "crash" in epoch 0
    rest = train(data, str(tmp_path / "b.pt"), epochs=2)
    assert first + rest == full


def test_the_examples_refuse_data_without_classes(tmp_path: Path) -> None:
    from tools.synth import make_image_folder

    make_image_folder(tmp_path / "folders", num_images=4, num_classes=1, size=(32, 32))
    (tmp_path / "flat").mkdir()
    for f in (tmp_path / "folders").rglob("*.jpg"):
        f.rename(tmp_path / "flat" / f.name)  # no class folders: no labels
    fastfeed.pack(tmp_path / "flat", tmp_path / "ff")
    assert not fastfeed.DatasetIndex.load(tmp_path / "ff").classes
    with pytest.raises(SystemExit, match="records no classes"):
        _module(TRAIN).train(str(tmp_path / "ff"), str(tmp_path / "c.pt"))
    with pytest.raises(SystemExit, match="records no classes"):
        _module(MONITOR).train(str(tmp_path / "ff"))


def test_monitor_example_reports_where_the_steps_went(demo_dir: Path, tmp_path: Path) -> None:
    data = str(demo_dir / "demo-data" / "train-ff")
    batches = math.ceil(fastfeed.DatasetIndex.load(data).num_samples / 8)
    r = _module(MONITOR).train(data, epochs=2, every=3, html=str(tmp_path / "m.html"), jsonl=str(tmp_path / "m.jsonl"))
    assert r.steps == 2 * batches - 1 and r.verdict in fastfeed.diagnosis.vocabulary.VERDICTS
    assert "verdict" not in r.fix and (tmp_path / "m.html").read_text().startswith("<!DOCTYPE html>")
    # the header, a line per window of 3 batches, the report
    assert (tmp_path / "m.jsonl").read_text().count("\n") == 1 + math.ceil(2 * batches / 3) + 1


def _monitor_params() -> list[Any]:
    marks = {"python": [pytest.mark.slow], "torchrun": [pytest.mark.slow, pytest.mark.dist]}
    return [pytest.param(argv, marks=marks[argv[0]], id=" ".join(argv))
            for argv in page_commands(MONITOR_PAGE, "docs/examples/monitor_cpu.py")]


def test_the_monitor_page_runs_the_example_both_ways() -> None:
    assert sorted(p.values[0][0] for p in _monitor_params()) == ["python", "torchrun"]


@pytest.mark.parametrize("argv", _monitor_params())
def test_monitor_example_runs_as_its_page_says(argv: list[str], demo_dir: Path) -> None:
    (demo_dir / "monitor.html").unlink(missing_ok=True)
    out = _run(argv, demo_dir, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = int(argv[argv.index("--nproc-per-node") + 1]) if argv[0] == "torchrun" else 1
    assert f"fastfeed step monitor: {ranks} rank(s)" in out.stdout and "verdict: " in out.stdout
    assert f"fastfeed monitor: steps 1-10 on {ranks} rank(s)" in out.stderr  # rank 0's line per window
    assert (demo_dir / "monitor.html").read_text().startswith("<!DOCTYPE html>")
    if ranks > 1:
        assert "slowest rank" in out.stdout


# -------------------------------------------------------------------- the guides' examples
def _comments(code: str) -> dict[int, str]:
    """Line -> the comment after the code on it, with the comment-only lines that continue it
    (below it, starting in the same column)."""
    lines = code.splitlines()
    found: dict[int, str] = {}
    last: tuple[int, int] | None = None  # (row, column) of the comment being continued
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type != tokenize.COMMENT:
            continue
        (row, col), text = tok.start, tok.string[1:].strip()
        if not lines[row - 1][:col].strip():  # a comment-only line
            if last and row == last[0] + 1 and col == last[1]:
                found[_owner(found, row)] += " " + text
                last = (row, col)
            continue
        found[row], last = text, (row, col)
    return found


def _owner(found: dict[int, str], row: int) -> int:
    return max(r for r in found if r < row)


def _candidates(comment: str) -> list[str]:
    """The comment, and each prefix of it that ends before a top-level ", " or "; " (the value
    shown, without the prose after it: ``torch.Size([4, 8]), padded with the pad id``)."""
    out, depth, quote = [comment], 0, ""
    for i, ch in enumerate(comment):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        else:
            depth += (ch in "([{") - (ch in ")]}")
            if depth == 0 and comment[i:i + 2] in (", ", "; "):
                out.append(comment[:i])
    return out


def _matches(value: Any, shown: str) -> bool:
    """Whether ``value`` is what a page shows for it: a literal, or its repr (``...``: any text)."""
    have = " ".join(repr(value).split())
    for want in _candidates(shown):
        try:
            if value == ast.literal_eval(want) and "..." not in want:
                return True
        except (ValueError, SyntaxError, TypeError):
            pass
        pattern = ".*?".join(re.escape(part) for part in " ".join(want.split()).split("..."))
        if re.fullmatch(pattern, have):
            return True
    return False


#: A comment that shows a value (others are prose: ``# a save_to_disk folder``).
_VALUE = re.compile(r"""[\[({'"\d-]|array\(|torch\.|True\b|False\b|None\b""")


def run_python(block: Block, ns: dict[str, Any]) -> None:
    """Run a Python block; check each ``expression  # value`` against the value."""
    comments = _comments(block.text)
    for stmt in ast.parse(block.text, filename=str(block)).body:
        shown = comments.get(stmt.end_lineno, "")
        if isinstance(stmt, ast.Expr) and _VALUE.match(shown):
            value = eval(compile(ast.Expression(stmt.value), str(block), "eval"), ns)
            assert _matches(value, shown), f"{block} line {stmt.lineno}: {value!r}; the page shows {shown}"
        else:
            exec(compile(ast.Module([stmt], type_ignores=[]), str(block), "exec"), ns)


def run_bash(block: Block, capsys: pytest.CaptureFixture[str]) -> None:
    """Run a bash block's ``fastfeed`` commands; each ``# line`` under one is a line it prints."""
    from fastfeed.cli import main

    for argv, shown in shell_commands(block.text):
        assert argv[0] == "fastfeed", f"{block}: only fastfeed commands run here, not {argv}"
        capsys.readouterr()
        rc = main(argv[1:])
        out = capsys.readouterr().out.splitlines()
        assert rc == 0, f"{block}: {shlex.join(argv)} exited {rc}"
        for line in shown:
            assert line == "..." or line in out, f"{block}: {shlex.join(argv)} printed {out}, not {line!r}"


RUN_PAGES = [p for p in PAGES if any(b.marked for b in blocks(p))]


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_guides_runnable_examples_run_as_shown(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    ns: dict[str, Any] = {"__name__": "__docs__"}
    for block in (b for b in blocks(page) if b.marked):
        if block.lang == "python":
            run_python(block, ns)
        elif block.lang == "bash":
            run_bash(block, capsys)
        else:
            raise AssertionError(f"{block}: {RUN_MARK} on a {block.lang or 'plain'} block")


def test_pages_that_say_an_example_runs_mark_it() -> None:
    """Prose that promises "runs as it is" is followed by a marked block (so the test runs it)."""
    assert RUN_PAGES, "no page marks a runnable example"
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"runs as it is", text):
            assert RUN_MARK in text[m.end(): m.end() + 300], f"{page}: an example said to run as it is is not marked"


DOCTESTS = [b for p in PAGES for b in blocks(p) if b.lang == "python" and b.text.lstrip().startswith(">>>")]


@pytest.mark.parametrize("block", DOCTESTS, ids=str)
def test_doctest_blocks_run(block: Block) -> None:
    test = doctest.DocTestParser().get_doctest(block.text, {"fastfeed": fastfeed}, str(block), str(block.page),
                                               block.line)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = io.StringIO()
    runner.run(test, out=out.write)
    assert runner.failures == 0, out.getvalue()


PYTHON = [b for p in PAGES for b in blocks(p) if b.lang == "python" and b not in DOCTESTS
          and not b.text.startswith("--8<--")]


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_every_python_block_compiles_and_names_real_fastfeed_attributes(block: Block) -> None:
    compile(block.text, str(block), "exec")
    for name in sorted(set(re.findall(r"\bfastfeed\.(\w+)", block.text))):
        if not hasattr(fastfeed, name):
            importlib.import_module(f"fastfeed.{name}")  # a sub-package (fastfeed.decode...)


def test_api_reference_lists_every_public_name_at_its_module() -> None:
    text = "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md"))
    listed = re.findall(r"^::: (fastfeed\.[\w.]+)\.(\w+)$", text, flags=re.M)
    assert sorted(name for _, name in listed) == sorted(fastfeed._EXPORTS)
    for module, name in listed:
        assert fastfeed._EXPORTS[name] == module, f"{name} is defined in {fastfeed._EXPORTS[name]}"


# ------------------------------------------------------------------------------- the built site
@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once as ``make docs`` builds it (``--strict``), into a temporary folder."""
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-5000:]
    assert "WARNING" not in log and "Formatting signatures requires" not in log, log[-5000:]
    return out


def _pages(site: Path) -> dict[str, str]:
    return {str(p.relative_to(site)): p.read_text() for p in site.rglob("*.html") if "404" not in p.name}


def _prose(html: str) -> str:
    """A page without its code blocks (where ``\\|`` and ``:func:`` may be what the code says)."""
    return re.sub(r"<pre\b.*?</pre>", "", html, flags=re.S)


def test_site_shows_no_raw_sphinx_roles_nor_escaped_pipes(site: Path) -> None:
    for name, html in _pages(site).items():
        text = _prose(html)
        assert not re.search(r":(?:func|class|mod|meth|data|attr|exc|obj):(?:<code>|`)", text), name
        assert "\\|" not in text, f"{name}: a literal \\| (a table cell's escaped pipe)"


def test_site_needs_no_internet(site: Path) -> None:
    """No script or stylesheet from a CDN (highlight.js was one): the code is coloured at build time."""
    for name, html in _pages(site).items():
        assert not re.search(r"<(?:script|link)\b[^>]*(?:src|href)=\"(?:https?:)?//", html), name
    guide = (site / "guides" / "loading" / "index.html").read_text()
    assert '<span class="kn">import</span>' in guide  # Pygments' classes, styled by css/pygments.css
    assert (site / "css" / "pygments.css").is_file() and (site / "css" / "fastfeed.css").is_file()


def test_site_api_reference_reads_well(site: Path) -> None:
    ref = (site / "reference" / "loading" / "index.html").read_text()
    signature = re.search(r'<div class="[^"]*doc-signature[^"]*"><pre>(.*?)</pre>', ref, flags=re.S)[1]
    assert re.sub(r"<[^>]+>", "", signature).strip().startswith("loader(\n")  # ruff's: a line a parameter
    for name, html in _pages(site).items():
        if name.startswith("reference"):  # grouped entries ("rank, world_size: ...") are split
            cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td>\s*<code>(.*?)</code>", html, flags=re.S)]
            assert not [c for c in cells if re.fullmatch(r"\w+,\s*\w+.*", c)], name
            said_twice = [c for c in (re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", html,
                                                                                     flags=re.S))
                          if len(re.findall(r"\bdefault\b", c)) > 1]  # "(default: when CUDA ...) (default None)"
            assert not said_twice, (name, said_twice)
    # roles became links: loader() in Loader's docstring leads to the function
    links = re.findall(r'<a class="autorefs autorefs-internal"[^>]* href="#fastfeed.loading.api.loader">(.*?)</a>', ref)
    assert "<code>loader()</code>" in [re.sub(r"</?span[^>]*>", "", link) for link in links]


def test_site_lists_after_a_paragraph_line_are_lists(site: Path) -> None:
    """benchmarks/RESULTS.md, included by results.md, lists its machines right below "Machines:"."""
    results = (site / "results" / "index.html").read_text()
    assert re.search(r"<li><strong>one NVIDIA H200 \(16 cores\)</strong>", results)


def test_site_figures_pages_speak_to_users(site: Path) -> None:
    """The figures pages name dates, hardware and commands, not our history (sessions, issues,
    a machine called "python")."""
    for page in ("results", "benchmarks"):
        text = re.sub(r"<code>.*?</code>", "", _prose((site / page / "index.html").read_text()), flags=re.S)
        text = re.sub(r"<[^>]+>", "", text)
        for wrong in (r"\b[Ss]ession[- ]\d", r"\b[Ii]ssue \d", r"\bmachine python\b", r"\bthe GPU machine\b"):
            assert not re.search(wrong, text), (page, re.search(rf".{{0,80}}{wrong}.{{0,80}}", text)[0])


@pytest.mark.parametrize("path", sorted((DOCS / "_ext").glob("*.py")), ids=lambda p: p.name)
def test_site_extensions_examples_run(path: Path) -> None:
    """The docstring examples of the site's hooks and griffe extensions (``make test``'s doctest run
    covers ``fastfeed/`` only)."""
    if path.stem.startswith("griffe"):
        pytest.importorskip("griffe", reason="the docs extra: pip install -e '.[docs]'")
    else:
        pytest.importorskip("markdown", reason="the docs extra: pip install -e '.[docs]'")
    result = doctest.testmod(_module(path), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
