"""Text gauges: horizontal bars in eighth blocks, coloured by how close a value is to its limit."""

from __future__ import annotations

from rich.text import Text

_EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar(fraction: float | None, width: int) -> str:
    """A bar ``width`` cells wide filled to ``fraction`` (0–1, clamped), in eighth blocks."""
    if width <= 0:
        return ""
    if fraction is None:
        return "·" * width
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[part] if part else "")
    return text.ljust(width)


def level_style(fraction: float | None, warn: float = 0.8, alert: float = 0.95) -> str:
    if fraction is None:
        return "dim"
    if fraction >= alert:
        return "bold red"
    if fraction >= warn:
        return "yellow"
    return "green"


def gauge(fraction: float | None, width: int, warn: float = 0.8, alert: float = 0.95) -> Text:
    """A coloured bar on a dim track."""
    return Text(bar(fraction, width), style=level_style(fraction, warn, alert))


def ratio(v: float | None, of: float | None) -> float | None:
    if v is None or not of:
        return None
    return v / of
