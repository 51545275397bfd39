"""What ``fastfeed doctor`` found: stages, findings, the verdict; as text, JSON and HTML.

The HTML page is self-contained (inline SVG, inline CSS, no external assets): one bar per
measured stage, in samples/s for one rank, against the demand line of the training step.

Example:
    >>> r = fastfeed.doctor("/data/ff", step_time=0.25)        # doctest: +SKIP
    >>> print(r.text())                                         # doctest: +SKIP
    >>> r.write_html("report.html")                             # doctest: +SKIP
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastfeed.timing.measure import Measurement

__all__ = ["DoctorReport", "Finding", "Stage"]


@dataclass(frozen=True)
class Stage:
    """One stage measured on its own.

    Attributes:
        key: ``storage``, ``source``, ``decode_core``, ``decode_all``, ``loader``,
            ``loader_step``, ``dali`` or ``balance``.
        name: a label for people.
        samples_per_s: samples/s this stage delivers to one rank (shared stages are
            divided by the ranks on the host); None when it is not a rate or was skipped.
        detail: the figures behind it, one line.
        figures: the same and more, for JSON.
        skipped: why the stage was not measured (None when it was).
        measurement: the :class:`~fastfeed.timing.measure.Measurement` behind the rate.
    """

    key: str
    name: str
    samples_per_s: float | None
    detail: str
    figures: dict[str, Any]
    skipped: str | None = None
    measurement: Measurement | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "samples_per_s": self.samples_per_s,
                "detail": self.detail, "skipped": self.skipped, "figures": self.figures}


@dataclass(frozen=True)
class Finding:
    """One conclusion.

    Attributes:
        kind: ``storage``, ``decode``, ``workers``, ``transfer``, ``input-bound``,
            ``not-input-bound``, ``balance``, ``packing``, ``cold-start`` or ``remote-cache``.
        title: the conclusion, one line.
        why: the figures behind it.
        fix: what to do.
    """

    kind: str
    title: str
    why: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "title": self.title, "why": self.why, "fix": self.fix}


@dataclass(frozen=True)
class DoctorReport:
    """The result of :func:`fastfeed.doctor`.

    Attributes:
        path: the dataset.
        dataset: what the index says (samples, shards, bytes, format, fields, lengths).
        host: cores, local ranks, memory.
        settings: batch size, image size, decode, loader setting and where it came from.
        demand: samples/s one rank's training consumes (None: not given).
        demand_from: how the demand was given, in words.
        deliverable: samples/s the input pipeline delivers to one rank.
        limiting: the stage that limits the pipeline (``storage``, ``decode``,
            ``workers``, ``transfer``, ``input-bound``).
        input_bound: True/False against the demand; None without one.
        headroom: deliverable / demand (None without a demand).
        findings: the verdict first, then other findings.
        stages: what was measured.
        elapsed_s: seconds the diagnosis took.
    """

    path: str
    dataset: dict[str, Any]
    host: dict[str, Any]
    settings: dict[str, Any]
    demand: float | None
    demand_from: str
    deliverable: float
    limiting: str
    input_bound: bool | None
    headroom: float | None
    findings: tuple[Finding, ...]
    stages: tuple[Stage, ...]
    elapsed_s: float

    @property
    def verdict(self) -> Finding:
        """The main finding."""
        return self.findings[0]

    @property
    def bottleneck(self) -> str:
        """The kind of the main finding (``decode``, ``storage``, ``not-input-bound``, ...)."""
        return self.verdict.kind

    def stage(self, key: str) -> Stage | None:
        """The stage with this key, or None."""
        return next((s for s in self.stages if s.key == key), None)

    # ------------------------------------------------------------------ text
    def text(self) -> str:
        """The report for a terminal."""
        d, h = self.dataset, self.host
        lines = [
            f"fastfeed doctor: {self.path}",
            f"  dataset  {d['num_samples']:,} samples in {d['num_shards']:,} {d['format']} shard(s), "
            f"{d['bytes'] / 1e6:,.1f} MB" + (", remote" if d.get("remote") else ""),
            f"  host     {h['cores']} usable core(s), {h['local_ranks']} rank(s) on this host, "
            f"{h['memory_gib']:.0f} GiB" + (f", load average {h['load_average']:.1f}"
                                            if h.get("load_average") is not None else ""),
            f"  loader   batch {self.settings['batch_size']}, image size {_size(self.settings['image_size'])}, "
            f"decode {self.settings['decode']}, {self.settings['setting']} ({self.settings['workers_from']})",
            "  demand   " + (f"{self.demand:,.0f} samples/s per rank ({self.demand_from})" if self.demand
                              else "not given (pass --target-rate or --step-time)"),
            "",
        ]
        name_w = max(len(s.name) for s in self.stages) + 2
        head = f"  {'stage':<{name_w}}{'samples/s':>12}{'vs demand':>11}   figures"
        lines += [head, "  " + "-" * (len(head) + 20)]
        for s in self.stages:
            if s.skipped:
                lines.append(f"  {s.name:<{name_w}}{'-':>12}{'':>11}   skipped: {s.skipped}")
                continue
            rate = f"{s.samples_per_s:,.0f}" if s.samples_per_s is not None else ""
            vs = f"{s.samples_per_s / self.demand:.2f}x" if self.demand and s.samples_per_s is not None else ""
            lines.append(f"  {s.name:<{name_w}}{rate:>12}{vs:>11}   {s.detail}")
        lines.append("")
        v = self.verdict
        lines += [f"verdict: {v.title}", f"  why: {v.why}", f"  fix: {v.fix}"]
        for f in self.findings[1:]:
            lines += ["", f"also: {f.title}", f"  why: {f.why}", f"  fix: {f.fix}"]
        lines.append(f"\n(diagnosed in {self.elapsed_s:.0f} s)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "path": self.path, "dataset": self.dataset, "host": self.host, "settings": self.settings,
            "demand": self.demand, "demand_from": self.demand_from, "deliverable": self.deliverable,
            "limiting": self.limiting, "input_bound": self.input_bound, "headroom": self.headroom,
            "bottleneck": self.bottleneck, "verdict": self.verdict.to_json(),
            "findings": [f.to_json() for f in self.findings], "stages": [s.to_json() for s in self.stages],
            "elapsed_s": self.elapsed_s,
        }

    # ------------------------------------------------------------------ HTML
    def html(self) -> str:
        """A self-contained HTML page: the chart, the stage table and the findings."""
        e = html.escape
        rows = "".join(
            f"<tr><td>{e(s.name)}</td><td class=n>"
            + ("-" if s.skipped or s.samples_per_s is None else f"{s.samples_per_s:,.0f}")
            + f"</td><td>{e('skipped: ' + s.skipped if s.skipped else s.detail)}</td></tr>"
            for s in self.stages)
        finds = "".join(
            f"<div class='f{' v' if i == 0 else ''}'><h3>{'Verdict' if i == 0 else 'Also'}: {e(f.title)}</h3>"
            f"<p><b>Why:</b> {e(f.why)}</p><p><b>Fix:</b> {e(f.fix)}</p></div>"
            for i, f in enumerate(self.findings))
        demand = (f"{self.demand:,.0f} samples/s per rank ({e(self.demand_from)})" if self.demand
                  else "not given")
        return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>fastfeed doctor: {e(self.path)}</title>
<style>
body{{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;width:100%}}td,th{{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left}}
td.n{{text-align:right;font-variant-numeric:tabular-nums}}
.f{{border-left:4px solid #999;padding:2px 12px;margin:12px 0}}
.v{{border-color:#c0392b;background:#fdf2f0}}code{{background:#eee;padding:0 3px}}
</style></head><body>
<h1>fastfeed doctor</h1>
<p><code>{e(self.path)}</code>: {self.dataset['num_samples']:,} samples, {self.dataset['num_shards']:,}
{e(str(self.dataset['format']))} shard(s); {self.host['cores']} core(s); batch {self.settings['batch_size']},
{e(str(self.settings['setting']))}. Demand: {demand}.</p>
{finds}
<h2>Throughput of each stage (samples/s, one rank)</h2>
{svg_chart(self)}
<table><tr><th>stage</th><th>samples/s</th><th>figures</th></tr>{rows}</table>
<p style="color:#777">Diagnosed in {self.elapsed_s:.0f} s. Every rate is the median of steady-state windows
(fastfeed.timing.measure).</p>
</body></html>
"""

    def write_html(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`html` to ``path``; returns it."""
        out = Path(path)
        out.write_text(self.html(), encoding="utf-8")
        return out


def _size(size: list[int] | None) -> str:
    return "as stored" if not size else f"{size[1]}x{size[0]}"


def svg_chart(report: DoctorReport, width: int = 900, bar_h: int = 26) -> str:
    """Horizontal bars, one per stage with a rate, and the demand as a vertical line.

    A log scale when the rates span more than 20x (storage is often 100x decode).
    """
    bars = [(s.name, s.samples_per_s) for s in report.stages
            if not s.skipped and s.samples_per_s is not None and s.samples_per_s > 0]
    if not bars:
        return "<p>(no stage produced a rate)</p>"
    values = [v for _, v in bars] + ([report.demand] if report.demand else [])
    lo, hi = min(values), max(values)
    log_scale = hi / lo > 20
    left, right = 250, 90
    plot_w = width - left - right
    if log_scale:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        b = b if b > a else a + 1

        def x(v: float) -> float:
            return left + plot_w * (math.log10(v) - a) / (b - a)
        ticks = [10.0 ** k for k in range(a, b + 1)]
    else:
        top = hi * 1.1

        def x(v: float) -> float:
            return left + plot_w * v / top
        step = 10 ** math.floor(math.log10(top / 4)) if top > 0 else 1
        ticks = [k * step for k in range(0, int(top / step) + 1)]
    height = 30 + bar_h * len(bars) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12" role="img" aria-label="stage throughput">']
    for t in ticks:
        tx = x(t) if t > 0 or not log_scale else left
        parts.append(f'<line x1="{tx:.1f}" y1="20" x2="{tx:.1f}" y2="{height - 25}" stroke="#eee"/>'
                     f'<text x="{tx:.1f}" y="{height - 10}" text-anchor="middle" fill="#666">{t:,.0f}</text>')
    limiting = _limiting_stage(report)
    for i, (name, v) in enumerate(bars):
        y = 25 + i * bar_h
        color = "#c0392b" if name == limiting else "#4a7bb7"
        parts.append(f'<text x="{left - 8}" y="{y + bar_h * 0.6:.1f}" text-anchor="end">{html.escape(name)}</text>'
                     f'<rect x="{left}" y="{y + 3}" width="{max(1.0, x(v) - left):.1f}" height="{bar_h - 8}" '
                     f'fill="{color}"/><text x="{x(v) + 4:.1f}" y="{y + bar_h * 0.6:.1f}">{v:,.0f}</text>')
    if report.demand:
        dx = x(report.demand)
        parts.append(f'<line x1="{dx:.1f}" y1="15" x2="{dx:.1f}" y2="{height - 25}" stroke="#222" '
                     f'stroke-dasharray="5,3" stroke-width="2"/><text x="{dx + 4:.1f}" y="13">demand '
                     f'{report.demand:,.0f}/s</text>')
    parts.append(f'<text x="{width - 5}" y="{height - 10}" text-anchor="end" fill="#666">'
                 f'{"log scale" if log_scale else ""}</text></svg>')
    return "".join(parts)


def _limiting_stage(report: DoctorReport) -> str | None:
    """The name of the stage drawn in red: the one the verdict names."""
    key = {"storage": "storage", "decode": "decode_all", "workers": "loader", "transfer": "loader",
           "input-bound": "loader"}.get(report.limiting)
    s = report.stage(key) if key else None
    return s.name if s is not None else None
