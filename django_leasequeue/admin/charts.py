"""Server-side SVG charts for the console: small, dependency-free, no JavaScript.

:func:`throughput_svg` draws a :class:`~django_leasequeue.health.Series` as stacked bars (done,
failed, dead per bucket) with a y axis, time labels, a legend and, per bucket, a ``<title>``
tooltip with the bucket's time and exact numbers. Colours are Django admin's CSS variables
(``--primary``, ``--error-fg``, ``--body-quiet-color``, ``--hairline-color``, with their light
values as fallbacks) or the package's ``--lq-chart-*`` variables (admin.css, set per theme), so the
chart follows the admin's dark mode; text is ``currentColor``. The
SVG has a ``viewBox`` and ``width="100%"``: it scales to its container. Every text is escaped.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from ..health import Series

#: The drawing's size in viewBox units (it scales to the container's width).
WIDTH, HEIGHT = 720, 210
_LEFT, _RIGHT, _TOP, _BOTTOM = 44, 8, 26, 24

#: Each outcome's label and fill: admin's variables, with the light theme's values as fallbacks.
SERIES_STYLE = (
    ("done", "done", "var(--lq-chart-done, var(--primary, #79aec8))"),
    ("failed", "failed (retried)", "var(--lq-chart-failed, #d98e04)"),
    ("dead", "dead", "var(--error-fg, #ba2121)"),
)

_RANGE_WORDS = {"hour": "the last hour", "day": "the last 24 hours", "month": "the last 30 days"}


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _nice_max(value: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is >= ``value`` (at least 1)."""
    if value <= 1:
        return 1
    step = 1
    while True:
        for m in (1, 2, 5):
            if m * step >= value:
                return m * step
        step *= 10


def _label(moment: datetime, span: int) -> str:
    local = timezone.localtime(moment)
    if span < 3600:
        return local.strftime("%H:%M")
    if span < 86400:
        return local.strftime("%H:00")
    return local.strftime("%m-%d")


def _bucket_words(moment: datetime, span: int) -> str:
    start, end = timezone.localtime(moment), timezone.localtime(moment + timedelta(seconds=span))
    if span >= 86400:
        return start.strftime("%Y-%m-%d %Z")
    return f"{start:%Y-%m-%d %H:%M}–{end:%H:%M} {start:%Z}"


def throughput_svg(series: Series, *, title: str = "") -> SafeString:
    """Draw ``series`` as an SVG of stacked bars.

    Args:
        series: the zero-filled series (:func:`django_leasequeue.health.throughput`).
        title: the chart's accessible name (``<title>`` of the whole drawing); default
            "Jobs done, failed and dead per <bucket> over <range>".

    Returns:
        The ``<svg>`` element as safe HTML: one ``<g class="lq-bar">`` per bucket (each with its
        ``<title>`` and a ``<rect>`` per non-zero outcome), the axes and the legend; without any
        event, a sentence saying so instead of the bars.
    """
    span = series.span
    unit = {60: "minute", 3600: "hour", 86400: "day"}.get(span, f"{span} s")
    words = _RANGE_WORDS.get(series.range, series.range)
    title = title or f"Jobs done, failed and dead per {unit} over {words}"
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    n = len(series.points)
    top = _nice_max(max((p.total for p in series.points), default=0))
    slot = plot_w / max(n, 1)
    bar_w = max(slot * 0.8, 1.0)
    base = _TOP + plot_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="lq-chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
           f'width="100%" role="img" preserveAspectRatio="xMidYMid meet" '
           f'style="color: var(--body-fg, #333); font: 11px sans-serif; max-width: {WIDTH * 1.5:.0f}px">',
           f"<title>{escape(title)}</title>"]
    # Legend, top left.
    x = _LEFT
    for _key, label, fill in SERIES_STYLE:
        out.append(f'<rect class="lq-legend" x="{x}" y="6" width="10" height="10" style="fill: {fill}"/>'
                   f'<text x="{x + 14}" y="15" fill="currentColor">{escape(label)}</text>')
        x += 24 + 6 * len(label)
    # Y axis: gridlines at 0, half and the top, with their values.
    grid = "var(--hairline-color, #e8e8e8)"
    for value in (0, top / 2, top):
        y = base - plot_h * (value / top)
        out.append(f'<line x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{_num(y)}" y2="{_num(y)}" '
                   f'style="stroke: {grid}" stroke-width="1"/>'
                   f'<text x="{_LEFT - 4}" y="{_num(y + 4)}" text-anchor="end" fill="currentColor">'
                   f"{escape(_num(value))}</text>")
    if series.empty:
        empty = escape(f"No job finished or failed in {words}.")
        out.append(f'<text class="lq-chart-empty" x="{_LEFT + plot_w / 2:.0f}" y="{_TOP + plot_h / 2:.0f}" '
                   f'text-anchor="middle" fill="currentColor">{empty}</text>')
    else:
        for i, p in enumerate(series.points):
            x0 = _LEFT + i * slot + (slot - bar_w) / 2
            tip = (f"{_bucket_words(p.bucket, span)}: {p.done} done, {p.failed} failed (retried), "
                   f"{p.dead} dead")
            parts = [f'<g class="lq-bar" data-bucket="{escape(p.bucket.isoformat())}"><title>{escape(tip)}</title>',
                     # A transparent hit area the full height of the slot, so the tooltip shows on
                     # an empty or a thin bar too.
                     f'<rect x="{_num(_LEFT + i * slot)}" y="{_TOP}" width="{_num(slot)}" height="{plot_h}" '
                     f'fill="transparent"/>']
            y = float(base)
            for key, _label_text, fill in SERIES_STYLE:
                value = getattr(p, key)
                if not value:
                    continue
                h = plot_h * value / top
                y -= h
                parts.append(f'<rect class="lq-seg lq-{key}" x="{_num(x0)}" y="{_num(y)}" width="{_num(bar_w)}" '
                             f'height="{_num(h)}" style="fill: {fill}"/>')
            parts.append("</g>")
            out.append("".join(parts))
    # X labels: about six, at even steps, plus the axis line.
    out.append(f'<line x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{base}" y2="{base}" '
               f'style="stroke: var(--body-quiet-color, #666)" stroke-width="1"/>')
    step = max(1, n // 6)
    for i in range(0, n, step):
        cx = _LEFT + i * slot + slot / 2
        out.append(f'<text x="{_num(cx)}" y="{base + 15}" text-anchor="middle" fill="currentColor">'
                   f"{escape(_label(series.points[i].bucket, span))}</text>")
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308 - every interpolated text above is escaped
