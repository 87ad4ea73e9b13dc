"""Serving ``/metrics``: prometheus-client's text format with its per-series strings cached, and each
collector's text kept while its inputs are the same objects (:class:`Exposition`: a second scrape within a
tick renders nothing), rendered after the tick before an expected scrape (:class:`Ahead`), from a thread
that sleeps in ``select`` until a scraper connects.

:func:`exposition` writes exactly what ``prometheus_client.generate_latest`` writes (text format 0.0.4;
the library's own escaping and float formatting), but keeps each series' ``name{labels}`` prefix and each
family's HELP/TYPE lines once made: a scrape then costs one formatted float per sample. The cache is keyed
by name and labels (bounded: cleared past :data:`PREFIX_CACHE_MAX` entries).

:class:`ScrapeServer` answers ``GET /metrics`` (and ``/`` with a landing page that links to it) with
HTTP/1.1 ``Connection: close``, one request
at a time, each client given :data:`CLIENT_TIMEOUT_S` to send its request head; other methods get 405, other
paths 404. Its thread blocks in ``select`` on the listening socket and a wake-up pipe with no timeout, so an
unscraped daemon never wakes it (the standard library's ``serve_forever`` polls every 0.5 s).
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.openmetrics import exposition as om
from prometheus_client.utils import floatToGoString

from aithermd.publish.listen import bind, parse_listen  # noqa: F401 - parse_listen: for metrics.py

CLIENT_TIMEOUT_S = 5.0
MAX_HEAD = 16 * 1024
PREFIX_CACHE_MAX = 20_000
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TYPES = {"counter": "counter", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram",
          "unknown": "untyped"}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")

_prefixes: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
_headers: dict[tuple[str, str, str], str] = {}


LANDING_PAGE = (b"<!DOCTYPE html>\n<html><head><title>aithermd exporter</title></head><body>\n"
                b"<h1>aithermd exporter</h1>\n<p><a href=\"/metrics\">Metrics</a></p>\n</body></html>\n")

def _prefix(name: str, labels: dict[str, str]) -> str:
    key = (name, tuple(labels.items()))
    p = _prefixes.get(key)
    if p is None:
        if len(_prefixes) > PREFIX_CACHE_MAX:
            _prefixes.clear()
        if labels:
            text = ",".join(f'{om.escape_label_name(k)}="{om._escape(v, om.ALLOWUTF8, lambda *_: True)}"'
                            for k, v in sorted(labels.items()))
            p = f"{om.escape_metric_name(name)}{{{text}}} "
        else:
            p = f"{om.escape_metric_name(name)} "
        _prefixes[key] = p
    return p


def _header(name: str, mtype: str, doc: str) -> str:
    key = (name, mtype, doc)
    h = _headers.get(key)
    if h is None:
        if len(_headers) > PREFIX_CACHE_MAX:
            _headers.clear()
        escaped = doc.replace("\\", r"\\").replace("\n", r"\n")
        h = _headers[key] = f"# HELP {om.escape_metric_name(name)} {escaped}\n# TYPE {om.escape_metric_name(name)} {mtype}\n"
    return h


def _line(s: Any) -> str:
    ts = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
    return f"{_prefix(s.name, s.labels)}{floatToGoString(s.value)}{ts}\n"


def exposition(families: Iterable[Any]) -> bytes:
    """The text exposition of ``families`` (a registry's ``collect()``), byte for byte as generate_latest."""
    out: list[str] = []
    for metric in families:
        mtype = metric.type
        mname = metric.name + ("_total" if mtype == "counter" else "_info" if mtype == "info" else "")
        out.append(_header(mname, _TYPES.get(mtype, mtype), metric.documentation))
        extra: dict[str, list[str]] = {}
        for s in metric.samples:
            for suffix in _OM_SUFFIXES:
                if s.name == metric.name + suffix:
                    extra.setdefault(suffix, []).append(_line(s))
                    break
            else:
                out.append(_line(s))
        for suffix, lines in sorted(extra.items()):
            out.append(_header(metric.name + suffix, "gauge", metric.documentation))
            out.extend(lines)
    return "".join(out).encode("utf-8")


class Exposition:
    """The text exposition of a registry's collectors, in the order they were added (the order
    ``generate_latest`` renders them in), each collector's text kept while its inputs are unchanged.

    A collector added with ``inputs`` (a function returning what its families are made from: the published
    snapshot or parts of it, a counter's dict that is replaced, never mutated, on each change) is rendered
    again only when one of them is neither the very object it was at its last render nor equal to it (the
    tuples are compared with ``==``, which tries identity first: alarms or a health report made anew at
    each tick with the same values keep the text); its text is the same bytes otherwise. What is kept is
    never mutated by the daemon once published (a snapshot is frozen), so an equal key means equal text.
    One added without ``inputs`` (the process's CPU seconds and memory) is rendered at every scrape.
    Render from one thread at a time (the scrape thread)."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self._parts: list[tuple[Any, Callable[[], tuple[Any, ...]] | None]] = []
        self._kept: dict[int, tuple[tuple[Any, ...], bytes]] = {}
        self.renders = 0  # collectors rendered (not taken from what was kept): for tests and benchmarks

    def add(self, collector: Any, inputs: Callable[[], tuple[Any, ...]] | None = None) -> Any:
        """Register ``collector`` in the registry and here; returns it."""
        self.registry.register(collector)
        self._parts.append((collector, inputs))
        return collector

    def render(self) -> bytes:
        out = []
        for i, (collector, inputs) in enumerate(self._parts):
            key = inputs() if inputs is not None else None
            kept = self._kept.get(i)
            if key is not None and kept is not None and kept[0] == key:  # each item: the same object, or equal
                out.append(kept[1])
                continue
            self.renders += 1
            text = collector.text() if hasattr(collector, "text") else exposition(collector.collect())
            if key is not None:
                self._kept[i] = (key, text)
            out.append(text)
        return b"".join(out)


class Ahead:
    """When to render ahead of a scrape, and one render at a time (a lock shared by the scrape thread and
    the loop's thread).

    Scrapers come at a steady interval (Prometheus's ``scrape_interval``, its offset fixed per target). A
    scrape (:meth:`scrape`) notes its time; after each tick, :meth:`due` says whether the next scrape,
    expected one interval (the last two scrapes' gap) after the last, falls before the next tick (expected
    one tick period, the last two ticks' gap, from now) or is late by less than a period. The tick's
    changes are then rendered at once (:meth:`render`, on the loop's thread, with no wait: a scrape that
    is rendering keeps the lock and the tick goes on), so the scrape finds every collector's text kept and
    renders only a collector added without inputs. What is rendered ahead is what the scrape
    would render itself, at most one render a scrape interval (or a tick, when scraped faster): no
    CPU is added, it moves off the scrape's path. A tick or a change after that render is still seen: the
    scrape renders whatever collector's inputs changed since (:class:`Exposition`). Without scrapes, or
    once they stop for a period, nothing is rendered ahead. ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        import time

        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._scraped = (float("-inf"), float("-inf"))  # the last two scrapes' times
        self._ticked = float("-inf")
        self.ahead = 0  # renders made ahead of a scrape: for tests and benchmarks

    def scrape(self, exposition: Exposition) -> bytes:
        """The exposition, for a scrape at this instant (from the scrape thread)."""
        self._scraped = (self._scraped[1], self._clock())
        return self.render(exposition, wait=True)

    def due(self) -> bool:
        """Called once after each tick: whether the next scrape is expected before the next tick."""
        now = self._clock()
        period, self._ticked = now - self._ticked, now
        before, last = self._scraped
        if before == float("-inf"):
            return False  # fewer than two scrapes: no rhythm known
        return -period < last + (last - before) - now <= period

    def render(self, exposition: Exposition, wait: bool = False) -> bytes:
        """``exposition.render()`` under the lock; ``wait`` False: b"" at once when it is held."""
        if not self._lock.acquire(blocking=wait):
            return b""
        try:
            if not wait:
                self.ahead += 1
            return exposition.render()
        finally:
            self._lock.release()


class ScrapeServer:
    """``/metrics`` on ``(host, port)`` (port 0: any) from a thread of its own; ``body()`` gives the text.
    ``sock``: that address's listening socket, taken already (:func:`~aithermd.publish.listen.bind`; the
    server owns it from now on). Raises OSError when the address cannot be had."""

    def __init__(self, host: str, port: int, body: Callable[[], bytes],
                 sock: socket.socket | None = None) -> None:
        self._sock = sock if sock is not None else bind(host, port)
        self.address: tuple[str, int] = (host, self._sock.getsockname()[1])
        self._body = body
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="aithermd-metrics", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():  # no timeout: asleep until a scraper or stop()
                    if key.fileobj == self._wake_r:
                        return
                    try:
                        conn, _ = self._sock.accept()
                    except OSError:
                        continue
                    with conn:
                        try:
                            self._answer(conn)
                        except OSError:
                            pass

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(CLIENT_TIMEOUT_S)
        head = b""
        while b"\r\n\r\n" not in head and b"\n\n" not in head:
            chunk = conn.recv(4096)
            if not chunk or len(head) > MAX_HEAD:
                return
            head += chunk
        parts = head.split(b"\r\n", 1)[0].split()
        method, path = (parts[0], parts[1].split(b"?", 1)[0]) if len(parts) >= 2 else (b"", b"")
        if method not in (b"GET", b"HEAD"):
            status, ctype, body = b"405 Method Not Allowed", b"text/plain", b"only GET /metrics\n"
        elif path == b"/":  # a landing page, as every Prometheus exporter has, pointing to the metrics
            status, ctype, body = b"200 OK", b"text/html; charset=utf-8", LANDING_PAGE
        elif path != b"/metrics":
            status, ctype, body = b"404 Not Found", b"text/plain", b"try /metrics\n"
        else:
            status, ctype, body = b"200 OK", CONTENT_TYPE.encode(), self._body()
        conn.sendall(b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (status, ctype, len(body), b"" if method == b"HEAD" else body))

    def stop(self) -> None:
        """Stop serving (the answer in progress finishes first); safe to call twice."""
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
            self._thread.join(timeout=CLIENT_TIMEOUT_S + 1.0)
            self._sock.close()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            self._wake_r = self._wake_w = -1
