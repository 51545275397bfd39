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

from fastfeed.diagnosis.monitor_page import NEUTRAL, VERDICT_COLORS, prose
from fastfeed.timing.measure import Measurement

__all__ = ["BAR", "DoctorReport", "Finding", "Stage", "TONES", "nice_ticks", "svg_chart"]

#: The verdict's colour on the page, by :attr:`DoctorReport.tone`: the step monitor's colours for the same
#: things (input-bound orange; the input not the problem green, as its compute-bound; padding and
#: stragglers red, as its imbalanced), grey when there is nothing to judge against.
TONES = {"input-bound": VERDICT_COLORS["input-bound"], "not-input-bound": VERDICT_COLORS["compute-bound"],
         "imbalanced": VERDICT_COLORS["imbalanced"], "neutral": NEUTRAL}
#: A stage's bar; the one the verdict names takes the verdict's colour (a slate grey when it keeps up).
BAR = "#8fb0d8"
_LIMITING_BAR = {"input-bound": TONES["input-bound"], "not-input-bound": "#3d5a80", "imbalanced": "#3d5a80",
                 "neutral": "#3d5a80"}


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
    @property
    def tone(self) -> str:
        """How the page colours the verdict: ``input-bound``, ``not-input-bound``, ``imbalanced`` (padding and
        stragglers lead) or ``neutral`` (no demand to compare with, or a note on what was measured)."""
        kind = self.verdict.kind
        if kind == "not-input-bound":
            return "not-input-bound"
        if kind == "balance":
            return "imbalanced"
        if self.input_bound and kind != "small-dataset":
            return "input-bound"
        return "neutral"

    def html(self) -> str:
        """A self-contained HTML page: the chart, the stage table and the findings."""
        e = html.escape
        rows = "".join(
            f"<tr><td class=name>{e(s.name)}</td><td class=n>"
            + ("-" if s.skipped or s.samples_per_s is None else f"{s.samples_per_s:,.0f}")
            + f"</td><td>{prose('skipped: ' + s.skipped if s.skipped else s.detail)}</td></tr>"
            for s in self.stages)
        finds = "".join(
            f"<div class='f {'v ' + self.tone if i == 0 else 'also'}'><h3><span>{'Verdict' if i == 0 else 'Also'}:"
            f"</span> {prose(f.title)}</h3><p><b>Why:</b> {prose(f.why)}</p><p><b>Fix:</b> {prose(f.fix)}</p></div>"
            for i, f in enumerate(self.findings))
        demand = (f"{self.demand:,.0f} samples/s per rank ({e(self.demand_from)})" if self.demand
                  else "not given")
        tones = "".join(f".{k}{{border-color:{c}}}.{k} h3 span{{color:{c}}}" for k, c in TONES.items())
        return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>fastfeed doctor: {e(self.path)}</title>
<style>
body{{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 16px;color:#222;line-height:1.4}}
table{{border-collapse:collapse;width:100%}}td,th{{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;
vertical-align:top}}td.n,th.n{{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}}
td.name{{white-space:nowrap}}
.f{{border-left:4px solid #bbb;padding:2px 14px;margin:12px 0;border-radius:4px}}
.v{{border-left-width:10px;background:#f7f7f7}}
{tones}code{{background:#eee;padding:0 3px;border-radius:2px}}
.key{{display:inline-block;margin-right:16px;font-size:13px;color:#444}}.key i{{display:inline-block;width:12px;
height:12px;margin-right:5px;vertical-align:-1px;border-radius:2px}}
</style></head><body>
<h1>fastfeed doctor</h1>
<p><code>{e(self.path)}</code>: {self.dataset['num_samples']:,} samples, {self.dataset['num_shards']:,}
{e(str(self.dataset['format']))} shard(s); {self.host['cores']} core(s); batch {self.settings['batch_size']},
{e(str(self.settings['setting']))}. Demand: {demand}.</p>
{finds}
<h2>Throughput of each stage (samples/s, one rank)</h2>
{svg_chart(self)}
{_chart_key(self)}
<table><tr><th>stage</th><th class=n>samples/s</th><th>figures</th></tr>{rows}</table>
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

    A log scale when the rates span more than 20x (storage is often 100x decode); at most
    about six labelled ticks either way, so the axis labels never run into each other.
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
        every = math.ceil((b - a + 1) / 6)  # decades: at most ~6 labels
        ticks = [10.0 ** k for k in range(a, b + 1, every)]
    else:
        ticks = nice_ticks(hi)  # the longest bar's value has the right margin
        top = ticks[-1]

        def x(v: float) -> float:
            return left + plot_w * v / top
    height = 30 + bar_h * len(bars) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12" role="img" aria-label="stage throughput">']
    for t in ticks:
        tx = x(t) if t > 0 or not log_scale else left
        parts.append(f'<line x1="{tx:.1f}" y1="20" x2="{tx:.1f}" y2="{height - 25}" stroke="#eee"/>'
                     f'<text x="{tx:.1f}" y="{height - 10}" text-anchor="middle" fill="#666">{_tick(t, ticks[-1])}</text>')
    limiting = _limiting_stage(report)
    mark = _LIMITING_BAR.get(report.tone, TONES["neutral"])
    halo = 'stroke="#fff" stroke-width="3" paint-order="stroke"'  # a value stays readable over the demand line
    for i, (name, v) in enumerate(bars):
        y = 25 + i * bar_h
        color = mark if name == limiting else BAR
        parts.append(f'<text x="{left - 8}" y="{y + bar_h * 0.6:.1f}" text-anchor="end">{html.escape(name)}</text>'
                     f'<rect x="{left}" y="{y + 3}" width="{max(1.0, x(v) - left):.1f}" height="{bar_h - 8}" '
                     f'fill="{color}"/><text x="{x(v) + 4:.1f}" y="{y + bar_h * 0.6:.1f}" {halo}>{v:,.0f}</text>')
    if report.demand:
        dx = x(report.demand)
        parts.append(f'<line x1="{dx:.1f}" y1="15" x2="{dx:.1f}" y2="{height - 25}" stroke="#222" '
                     f'stroke-dasharray="5,3" stroke-width="2"/><text x="{dx + 4:.1f}" y="13">demand '
                     f'{report.demand:,.0f}/s</text>')
    parts.append(f'<text x="{width - 5}" y="{height - 10}" text-anchor="end" fill="#666">'
                 f'{"log scale" if log_scale else ""}</text></svg>')
    return "".join(parts)


def nice_ticks(hi: float, most: int = 6) -> list[float]:
    """Ticks from 0 at a step of 1, 2 or 5 x 10^k, at most ``most`` + 1 of them, the last at or above ``hi``.

    Example:
        >>> nice_ticks(11_000)
        [0, 2000, 4000, 6000, 8000, 10000, 12000]
        >>> nice_ticks(19_000), nice_ticks(0.5)
        ([0, 5000, 10000, 15000, 20000], [0, 0.1, 0.2, 0.3, 0.4, 0.5])
    """
    if hi <= 0:
        return [0, 1]
    mag = 10.0 ** math.floor(math.log10(hi / most))
    step = next(m * mag for m in (1, 2, 5, 10) if hi / (m * mag) <= most)
    ticks = (round(k * step, 9) for k in range(0, math.ceil(hi / step - 1e-9) + 1))
    return [int(t) if float(t).is_integer() else t for t in ticks]


def _tick(v: float, top: float) -> str:
    """An axis label: ``2,000``; ``5k`` on an axis that reaches 10,000 (``1.5M`` past a million), so ~6 fit."""
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3 and top >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:g}"


def _chart_key(report: DoctorReport) -> str:
    """What the colours and the dashed line of the chart mean."""
    limiting = _limiting_stage(report)
    if limiting is None:
        return ""
    what = {"input-bound": "the stage that limits training", "not-input-bound": "the slowest stage (it keeps up)",
            "imbalanced": "the slowest stage"}.get(report.tone, "the stage that limits the pipeline")
    keys = [(_LIMITING_BAR.get(report.tone, TONES["neutral"]), f"{what}: {limiting}"), (BAR, "the other stages")]
    out = "".join(f"<span class=key><i style='background:{c}'></i>{html.escape(t)}</span>" for c, t in keys)
    if report.demand:
        out += "<span class=key>dashed line: what training consumes</span>"
    return f"<p>{out}</p>"


def _limiting_stage(report: DoctorReport) -> str | None:
    """The name of the stage drawn in the verdict's colour: the one the verdict names."""
    key = {"storage": "storage", "decode": "decode_all", "workers": "loader", "transfer": "loader",
           "input-bound": "loader"}.get(report.limiting)
    s = report.stage(key) if key else None
    return s.name if s is not None else None
