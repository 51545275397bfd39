"""MkDocs hooks (``hooks:`` in mkdocs.yml): the pages' Markdown read as GitHub reads it.

The pages, and ``benchmarks/RESULTS.md`` that ``results.md`` includes, are written to read well
on GitHub too, whose Markdown (CommonMark) differs from Python-Markdown's in two places a page
relies on:

- a bullet list may follow a paragraph line directly (``Machines:`` then ``- **h200**: ...``);
  Python-Markdown needs a blank line first, else the items run into the paragraph;
- in a table, ``\\|`` inside a code span is a ``|`` of the code (``--image-size PX\\|none``);
  Python-Markdown already keeps a code span's ``|`` out of the cell split, and shows the ``\\``.

One preprocessor, run after ``pymdownx.snippets`` has inserted the included files, brings the
two in line; fenced code is left alone.

And in the built pages, inline code breaks only between its words, never at the hyphens of a
flag (``--fail-if-input-`` / ``bound``): each word of it goes into a ``<span class="nobreak">``
(css/fastfeed.css), so the text a reader copies stays the same. Code blocks are left alone.
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

_FENCE = re.compile(r"^\s*(```|~~~)")
_BULLET = re.compile(r"^(?:[-*]|1\.) \S")  # "+ flip" in a wrapped line stays text, as written
_CODE = re.compile(r"(`+)(.+?)\1")


def github_markdown(lines: list[str]) -> list[str]:
    """``lines`` with a blank line before a list that follows a paragraph line, and ``\\|`` in
    the code spans of table rows unescaped (see the module docstring).

    Example:
        >>> github_markdown(["Machines:", "- **h200**: one GPU", "| `a\\\\|b` | c |"])
        ['Machines:', '', '- **h200**: one GPU', '| `a|b` | c |']
    """
    out: list[str] = []
    fence = False
    for line in lines:
        if _FENCE.match(line):
            fence = not fence
        elif not fence:
            prev = out[-1] if out else ""
            if _BULLET.match(line) and prev.strip() and not prev.startswith((" ", "\t", "|", "#", "<", ">")) \
                    and not _BULLET.match(prev) and not re.match(r"^\d+\. ", prev):
                out.append("")
            if line.lstrip().startswith("|"):
                line = _CODE.sub(lambda m: m[1] + m[2].replace("\\|", "|") + m[1], line)
        out.append(line)
    return out


class _GithubMarkdown(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        return github_markdown(lines)


class GithubMarkdown(Extension):
    """The preprocessor, after pymdownx.snippets (priority 32) and before the HTML blocks (20)."""

    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 (Python-Markdown's name)
        md.preprocessors.register(_GithubMarkdown(md), "fastfeed_github_markdown", 25)


def on_config(config: Any, **kwargs: Any) -> Any:
    config.markdown_extensions.append(GithubMarkdown())
    return config


_PRE = re.compile(r"(<pre\b.*?</pre>)", flags=re.S)
_CODE_SPAN = re.compile(r"<code>([^<]+)</code>")  # plain code (a type with links has tags: left as it is)


def keep_words(html: str) -> str:
    """``html`` with each word of its inline code kept on one line (code blocks untouched).

    Example:
        >>> keep_words("<p><code>--batch-size B</code></p><pre><code>a-b c</code></pre>")
        '<p><code><span class="nobreak">--batch-size</span> <span class="nobreak">B</span></code></p><pre><code>a-b c</code></pre>'
    """
    def code(m: re.Match[str]) -> str:
        return "<code>" + re.sub(r"(\S+)", r'<span class="nobreak">\1</span>', m[1]) + "</code>"

    return "".join(part if part.startswith("<pre") else _CODE_SPAN.sub(code, part) for part in _PRE.split(html))


def on_page_content(html: str, **kwargs: Any) -> str:
    return keep_words(html)
