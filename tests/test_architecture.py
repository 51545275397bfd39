"""docs/architecture.md matches the code: its layers are the import contracts' and it names every wing."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def _page_layers() -> dict[str, list[list[str]]]:
    """``<!-- layers: CONTAINER -->`` blocks: each line's names (before the description), top first."""
    text = PAGE.read_text(encoding="utf-8")
    out: dict[str, list[list[str]]] = {}
    for container, block in re.findall(r"<!-- layers: ([\w.]+) -->\s*```text\n(.*?)```", text, flags=re.S):
        rows = []
        for line in block.splitlines():
            if not line.strip() or line[0].isspace():
                continue  # a description's continuation
            names = re.split(r"\s{2,}", line.strip())[0]
            rows.append([n.strip() for n in names.split("|")])
        out[container] = rows
    return out


def _contract_layers() -> dict[str, list[list[str]]]:
    """The import-linter "layers" contracts of pyproject.toml, by the package their layers sit in."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    out: dict[str, list[list[str]]] = {}
    for c in config["tool"]["importlinter"]["contracts"]:
        if c["type"] != "layers":
            continue
        layers = [[m.strip() for m in layer.split("|")] for layer in c["layers"]]
        if c.get("containers"):
            (container,) = c["containers"]
        else:
            first = layers[0][0]
            container = first.rpartition(".")[0]
        prefix = container + "."
        out[container] = [[m[len(prefix):] if m.startswith(prefix) else m for m in layer] for layer in layers]
    return out


def test_the_page_draws_the_contracts_layers() -> None:
    page, contracts = _page_layers(), _contract_layers()
    assert set(page) <= set(contracts), f"the page draws layers no contract enforces: {set(page) - set(contracts)}"
    for container, rows in page.items():
        assert rows == contracts[container], container


def _modules(package: Path) -> set[str]:
    """The sub-packages and modules of ``package`` (no __init__, no __main__, no C sources)."""
    names = {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    names |= {p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return names


@pytest.mark.parametrize("container", ["fastfeed", "fastfeed.loading", "fastfeed.packing"])
def test_the_page_names_every_part_of_the_package(container: str) -> None:
    rows = _page_layers().get(container)
    if rows is None:
        pytest.fail(f"docs/architecture.md draws no layers of {container}")
    drawn = {name for row in rows for name in row}
    parts = _modules(ROOT / container.replace(".", "/"))
    assert parts == drawn, f"in the code, not on the page: {parts - drawn}; on the page only: {drawn - parts}"
