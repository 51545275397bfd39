"""The step monitor's HTML page: self-contained (inline CSS and SVG, nothing fetched), read in five seconds.

Top to bottom: the verdict in large type with its fix; where the step went (one bar for all
ranks, one per rank, the slowest marked); the per-rank stacked timeline of seconds per step on
one scale, so a slow rank or a slow stretch of the run stands out; then the figures behind the
verdict, the scheduling signals, the notes and the windows.

Example:
    >>> bandwidth(12.5), bandwidth(0.085)
    ('12.50 GB/s', '85.0 MB/s')
    >>> prose("run `fastfeed tune a<b`")
    'run <code>fastfeed tune a&lt;b</code>'
"""

from __future__ import annotations

import html
import re
from typing import Any

from fastfeed.diagnosis.vocabulary import CATEGORIES, CATEGORY_LABELS, pct

__all__ = ["COLORS", "NEUTRAL", "VERDICT_COLORS", "bandwidth", "page", "prose"]

#: The categories' colours (the bars, the timeline, the legend).
COLORS = {"data": "#e8871e", "compute": "#3f8f5f", "collective": "#7d4fb0", "wait": "#c8372d", "other": "#a7a7a7"}
#: The verdicts' colours (the banner); ``fastfeed doctor``'s page uses the same: input-bound orange, the
#: input not the problem (compute-bound here, "not input-bound" there) green.
VERDICT_COLORS = {"input-bound": "#e8871e", "imbalanced": "#c8372d", "straggler": "#c8372d",
                  "communication-bound": "#7d4fb0", "compute-bound": "#3f8f5f"}
#: A verdict that is neither good nor bad (no demand to compare with, a note on the measurement).
NEUTRAL = "#6b7280"

WIDTH, LEFT, RIGHT = 1000, 200, 20
PLOT = WIDTH - LEFT - RIGHT

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1040px;margin:24px auto;padding:0 16px;
color:#1d1d1d;line-height:1.45}
h1{font-size:20px;margin:0}h2{font-size:17px;margin:28px 0 6px}.meta{color:#555;margin:2px 0 14px}
.verdict{border-left:10px solid;padding:10px 18px;background:#f7f7f7;border-radius:4px}
.verdict .name{font-size:34px;font-weight:700;letter-spacing:.5px}
.verdict .title{font-size:17px;margin:4px 0 10px}.verdict .fix{font-size:15px;margin:0}
.verdict .fix b{display:inline-block;background:#1d1d1d;color:#fff;padding:0 7px;border-radius:3px;margin-right:6px}
.key{display:inline-block;margin-right:16px;font-size:13px}.key i{display:inline-block;width:12px;height:12px;
margin-right:5px;vertical-align:-1px;border-radius:2px}
ul{margin:4px 0;padding-left:20px}li{margin:3px 0}code{background:#eee;padding:0 3px}
table{border-collapse:collapse;font-size:13px;width:100%}td,th{border-bottom:1px solid #ddd;padding:3px 8px;
text-align:right}td:first-child,th:first-child{text-align:left}.muted{color:#777;font-size:13px}
svg text{font-family:system-ui,-apple-system,Segoe UI,sans-serif}
"""


def bandwidth(gb_s: float) -> str:
    """GB/s as people read it: ``12.50 GB/s``, ``85 MB/s``."""
    return f"{gb_s:,.2f} GB/s" if gb_s >= 0.1 else f"{gb_s * 1e3:,.1f} MB/s"


def _e(s: Any) -> str:
    return html.escape(str(s))


def prose(text: Any) -> str:
    """A verdict's words as HTML: escaped, and the commands written in backticks as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(str(text)))


def _legend() -> str:
    return "<p>" + "".join(f"<span class=key><i style='background:{COLORS[c]}'></i>{_e(CATEGORY_LABELS[c])}</span>"
                           for c in CATEGORIES) + "</p>"


def _bar(y: float, h: float, shares: dict[str, float]) -> str:
    """One 100% stacked bar, the share written inside segments wide enough for it."""
    out, x = [], float(LEFT)
    for c in CATEGORIES:
        w = PLOT * max(0.0, shares.get(c, 0.0))
        if w <= 0:
            continue
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{COLORS[c]}">'
                   f'<title>{_e(CATEGORY_LABELS[c])}: {shares[c]:.1%}</title></rect>')
        if w >= 38:
            out.append(f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + 5:.1f}" text-anchor="middle" fill="#fff" '
                       f'font-size="13" font-weight="600">{pct(shares[c])}</text>')
        x += w
    return "".join(out)


def _shares_svg(r: Any) -> str:
    rows: list[tuple[str, dict[str, float], bool]] = [("all ranks" if r.world_size > 1 else "this process",
                                                        r.shares, False)]
    if r.world_size > 1:
        for k, sh in enumerate(r.per_rank):
            host = r.hosts[k] if k < len(r.hosts) else ""
            rows.append((f"rank {k}" + (f" ({host[:14]})" if len(set(r.hosts)) > 1 else ""), sh,
                         k == r.slowest_rank and r.slowest_matters))
    h, gap = 30, 8
    height = len(rows) * (h + gap) + 4 + (10 if len(rows) > 1 else 0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img" '
             f'aria-label="share of step time per category">']
    y = 2.0
    for i, (label, sh, slow) in enumerate(rows):
        color, weight = ("#c8372d", "700") if slow else ("#1d1d1d", "600" if i == 0 else "400")
        mark = " \u25c0 slowest" if slow else ""
        parts.append(f'<text x="{LEFT - 10}" y="{y + h / 2 + 5:.1f}" text-anchor="end" font-size="14" '
                     f'fill="{color}" font-weight="{weight}">{_e(label + mark)}</text>')
        parts.append(_bar(y, h, sh))
        y += h + gap + (10 if i == 0 and len(rows) > 1 else 0)
    parts.append("</svg>")
    return "".join(parts)


def _ticks(lo: int, hi: int, n: int = 6) -> list[int]:
    span = max(1, hi - lo)
    raw = span / n
    mag = 10 ** max(0, len(str(int(raw))) - 1)
    step = max(1, int(round(raw / mag)) * mag)
    first = (lo + step - 1) // step * step
    return list(range(first, hi + 1, step))


def _timeline_svg(r: Any) -> str:
    t = r.timeline
    if t is None or not t.starts:
        return "<p class=muted>(no steps to draw)</p>"
    ranks, bins = len(t.seconds), len(t.starts)
    totals = sorted(sum(b) for rank in t.seconds for b in rank)
    # one scale for all ranks, set by the typical step: a rare long one (a checkpoint) is cut at the top
    typical = totals[min(len(totals) - 1, int(0.95 * len(totals)))] if totals else 0.0
    top = min(totals[-1], 2 * typical) if typical > 0 else (totals[-1] if totals and totals[-1] > 0 else 1.0)
    row_h = 70 if ranks <= 8 else 44
    gap, axis = 16, 30
    height = ranks * (row_h + gap) + axis
    bw = PLOT / bins
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img" '
             f'aria-label="seconds per step per rank over the run">']
    for k in range(ranks):
        y0 = k * (row_h + gap)
        slow = k == r.slowest_rank and r.slowest_matters
        parts.append(f'<text x="{LEFT - 10}" y="{y0 + row_h / 2}" text-anchor="end" font-size="14" '
                     f'fill="{"#c8372d" if slow else "#1d1d1d"}" font-weight="{"700" if slow else "400"}">'
                     f'{_e(f"rank {k}" if r.world_size > 1 else "this process")}</text>'
                     f'<text x="{LEFT - 10}" y="{y0 + row_h / 2 + 16}" text-anchor="end" font-size="11" '
                     f'fill="#777">0-{top * 1e3:,.0f} ms</text>')
        parts.append(f'<rect x="{LEFT}" y="{y0}" width="{PLOT}" height="{row_h}" fill="#f4f4f4"/>')
        width = max(bw - (0.5 if bw > 3 else 0), 0.6)
        for b in range(bins):
            x, base = LEFT + b * bw, float(y0 + row_h)
            for c, v in zip(CATEGORIES, t.seconds[k][b]):
                hh = min(row_h * v / top, base - y0)
                if hh <= 0:
                    continue
                base -= hh
                parts.append(f'<rect x="{x:.2f}" y="{base:.2f}" width="{width:.2f}" height="{hh:.2f}" '
                             f'fill="{COLORS[c]}"/>')
            if sum(t.seconds[k][b]) > top * 1.001:  # cut: mark it, with its length on hover
                parts.append(f'<rect x="{x:.2f}" y="{y0 - 3}" width="{max(width, 2):.2f}" height="3" fill="#1d1d1d">'
                             f'<title>steps {t.starts[b]}-{t.ends[b]}: {sum(t.seconds[k][b]) * 1e3:,.0f} ms per step'
                             f'</title></rect>')
    y_axis = ranks * (row_h + gap)
    lo, hi = t.starts[0], t.ends[-1]
    for s in _ticks(lo, hi):
        x = LEFT + PLOT * (s - lo) / max(1, hi - lo)
        parts.append(f'<line x1="{x:.1f}" y1="{y_axis - gap}" x2="{x:.1f}" y2="{y_axis - gap + 5}" stroke="#666"/>'
                     f'<text x="{x:.1f}" y="{y_axis + 4}" text-anchor="middle" font-size="11" fill="#666">{s}'
                     f'</text>')
    parts.append(f'<text x="{LEFT - 10}" y="{y_axis + 4}" text-anchor="end" font-size="11" fill="#666">step</text>')
    parts.append("</svg>")
    return "".join(parts)


def _windows_table(r: Any) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in CATEGORIES)
    rows = []
    for w in r.windows:
        rate = f"{w.samples_per_s:,.0f}" if w.samples_per_s else "-"
        same = {None: "", True: " (same)", False: ""}[w.same_slowest]
        rows.append(f"<tr><td>{w.first_step + 1}-{w.first_step + w.steps}</td><td>{w.step_s * 1e3:,.1f}</td>"
                    f"<td>{rate}</td>" + "".join(f"<td>{pct(w.shares[c])}</td>" for c in CATEGORIES)
                    + f"<td>{w.slowest_rank}{same}</td></tr>")
    return (f"<details><summary>{len(r.windows)} window(s) of up to {r.every} steps</summary><table><tr><th>steps</th>"
            f"<th>ms/step</th><th>samples/s</th>{head}<th>slowest rank</th></tr>{''.join(rows)}</table></details>")


def page(r: Any) -> str:
    """The page of a :class:`~fastfeed.diagnosis.monitor_report.MonitorReport`."""
    color = VERDICT_COLORS.get(r.verdict, NEUTRAL)
    head, _, rest = r.title.partition(": ")  # "input-bound on rank 1 (host a)" in large type, then the figures
    rest = rest[:1].upper() + rest[1:] if rest else ""
    hosts = len(set(r.hosts)) or 1
    rate = f" &middot; {r.samples_per_s:,.0f} samples/s" if r.samples_per_s else ""
    lists = ""
    if r.signals:
        lists += "<h2>Signals</h2><ul>" + "".join(f"<li>{prose(s)}</li>" for s in r.signals) + "</ul>"
    if r.notes:
        lists += "<h2>Notes</h2><ul>" + "".join(f"<li>{prose(n)}</li>" for n in r.notes) + "</ul>"
    bus = (f" Gradient all-reduce: {bandwidth(r.bus_gb_s)} bus bandwidth."
           if r.bus_gb_s is not None and "bus bandwidth" not in r.why else "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>fastfeed step monitor: {_e(r.verdict)}</title>
<style>{CSS}</style></head><body>
<h1>fastfeed step monitor</h1>
<p class=meta>{r.world_size} rank(s) on {hosts} host(s) &middot; {r.steps:,} steps &middot; {r.step_s * 1e3:,.1f} ms per
step{rate}</p>
<section class=verdict style="border-color:{color}">
<div class=name style="color:{color}">{_e(head)}</div>
<p class=title>{prose(rest)}</p>
<p class=fix><b>fix</b>{prose(r.fix)}</p>
</section>
<h2>Where the step went</h2>
{_legend()}
{_shares_svg(r)}
<h2>Over the run: seconds per step, each rank</h2>
{_timeline_svg(r)}
<h2>Why</h2>
<p>{prose(r.why)}.{_e(bus)}</p>
{lists}
<h2>Windows</h2>
{_windows_table(r)}
<p class=muted>Each rank timed its own steps: the wait in <code>next()</code> for the batch (data), the step
(compute), the gradient collectives compute did not hide (collective), the time between steps (other); the wait
for the slowest rank comes from the ranks' busy times, so no clock is shared between hosts. The first step
(start-up) is left out. Made by fastfeed.StepMonitor.</p>
</body></html>
"""
