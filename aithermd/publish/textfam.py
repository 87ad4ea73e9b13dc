"""Metric families written straight into the text exposition (format 0.0.4), for the scrape's hot path.

The exporter's collectors build their families through a factory, ``f.gauge(name, help, labels=...)`` and
``f.counter(...)``, then ``family.add_metric(label_values, value)``:

- :data:`PROM` makes prometheus-client's own ``GaugeMetricFamily``/``CounterMetricFamily``: what the
  registry's ``collect()`` gives (``generate_latest``, and OpenMetrics should a scraper ever be offered it);
- :data:`TEXT` makes :class:`TextFamily`, which writes each sample's line at once: the family's
  ``# HELP``/``# TYPE`` lines and each series' ``name{labels} `` prefix are made once per label values and
  kept (:data:`PREFIX_CACHE_MAX`), so a render costs a dict look-up and one formatted float per sample.
  No ``Sample`` tuple, label dict or per-sample suffix test is made. The bytes are prometheus-client's
  (its escaping, its ``floatToGoString``): the tests compare them with ``generate_latest`` of the registry.

:class:`TickHistogram` (the tick duration: a histogram whose state is one tuple, replaced at each
observation) and :class:`ProcessFigures` (``process_*``: one read of ``/proc/self/stat`` and of the fd
directory) render their text the same way, and their families for the registry as prometheus-client does.
"""

from __future__ import annotations

import bisect
import os
import resource
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

PREFIX_CACHE_MAX = 20_000  # kept series prefixes (per family shape), cleared past this
# (type, sample name, help, label names) → (header, {label values: prefix}, label order by name)
_Shape = tuple[str, dict[tuple[str, ...], str], tuple[int, ...]]
_shapes: dict[tuple[str, str, str, tuple[str, ...]], _Shape] = {}


def go_float(value: float) -> str:
    """``floatToGoString(value)``, with its common case (a finite float whose integer part has at most
    six digits, or a negative one) answered by ``repr`` alone."""
    s = repr(float(value))
    if s.find(".") > 6 or s[-1] in "fn":  # Go's exponent from 1e7 up; inf and nan
        return floatToGoString(value)
    return s


def _name(name: str) -> str:
    return om.escape_metric_name(name)


def header(name: str, mtype: str, documentation: str) -> str:
    """``# HELP`` and ``# TYPE`` lines of family ``name`` as generate_latest writes them."""
    doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {_name(name)} {doc}\n# TYPE {_name(name)} {mtype}\n"


def series(sample_name: str, labels: Sequence[tuple[str, str]]) -> str:
    """``name{k="v",…} `` with the labels in the order given (generate_latest sorts them by name)."""
    if not labels:
        return f"{_name(sample_name)} "
    text = ",".join(f'{om.escape_label_name(k)}="{om._escape(v, om.ALLOWUTF8, lambda *_: True)}"'
                    for k, v in labels)
    return f"{_name(sample_name)}{{{text}}} "


class TextFamily:
    """One family's text: its header and a line per ``add_metric`` (see the module doc)."""

    __slots__ = ("_prefixes", "_sample", "_labelnames", "_order", "parts")

    def __init__(self, mtype: str, name: str, documentation: str, labels: Sequence[str] | None,
                 value: float | None) -> None:
        if mtype == "counter" and name.endswith("_total"):
            name = name[:-6]
        sample = name + "_total" if mtype == "counter" else name
        key = (mtype, sample, documentation, tuple(labels or ()))
        shape = _shapes.get(key)
        if shape is None:
            names = key[3]
            shape = _shapes[key] = (header(sample, mtype, documentation), {},
                                    tuple(sorted(range(len(names)), key=names.__getitem__)))
        head, self._prefixes, self._order = shape
        self._sample, self._labelnames = sample, key[3]
        self.parts = [head]
        if value is not None:
            self.add_metric((), value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        values = tuple(labels)
        prefix = self._prefixes.get(values)
        if prefix is None:
            if len(self._prefixes) > PREFIX_CACHE_MAX:
                self._prefixes.clear()
            names = self._labelnames
            pairs = [(names[i], values[i]) for i in self._order]
            prefix = self._prefixes[values] = series(self._sample, pairs)
        self.parts += (prefix, go_float(value), "\n")


class _Prom:
    """Families for the registry: prometheus-client's own."""

    @staticmethod
    def gauge(name: str, documentation: str, value: float | None = None,
              labels: Sequence[str] | None = None) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, documentation, value, labels)

    @staticmethod
    def counter(name: str, documentation: str, value: float | None = None,
                labels: Sequence[str] | None = None) -> CounterMetricFamily:
        return CounterMetricFamily(name, documentation, value, labels)


class _Text:
    """Families for the scrape: :class:`TextFamily`."""

    @staticmethod
    def gauge(name: str, documentation: str, value: float | None = None,
              labels: Sequence[str] | None = None) -> TextFamily:
        return TextFamily("gauge", name, documentation, labels, value)

    @staticmethod
    def counter(name: str, documentation: str, value: float | None = None,
                labels: Sequence[str] | None = None) -> TextFamily:
        return TextFamily("counter", name, documentation, labels, value)


PROM: Any = _Prom()
TEXT: Any = _Text()


def text_of(families: Iterable[TextFamily]) -> bytes:
    """The exposition of ``families`` made with :data:`TEXT`."""
    return "".join(["".join(f.parts) for f in families]).encode()


class TextCollector(Collector):
    """A collector whose ``collect(f)`` builds its families with the factory ``f``; ``text()`` is its
    exposition made with :data:`TEXT` (the registry calls ``collect()``: :data:`PROM`)."""

    def describe(self) -> list[Metric]:
        return []  # families depend on the snapshot: never collect at registration time

    def collect(self, f: Any = PROM) -> Iterator[Any]:
        raise NotImplementedError

    def text(self) -> bytes:
        return text_of(self.collect(TEXT))


class TickHistogram(Collector):
    """A histogram of one unlabelled series: ``observe(value)``; ``state`` is (cumulative-free bucket
    counts, sum), one tuple replaced at each observation, so a render reads a consistent pair. Renders as
    prometheus-client's ``Histogram`` does (buckets, ``_count``, ``_sum``, then ``_created`` as a gauge)."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self._name, self._doc = name, documentation
        self._bounds = (*(float(b) for b in buckets), float("inf"))
        self._created = time.time()
        self.state: tuple[tuple[int, ...], float] = ((0,) * len(self._bounds), 0.0)
        les = [floatToGoString(b) for b in self._bounds]
        self._bucket_prefixes = [series(name + "_bucket", [("le", le)]) for le in les]
        self._les = les
        self._text_head = header(name, "histogram", documentation)
        self._created_text = (header(name + "_created", "gauge", documentation)
                              + f"{series(name + '_created', ())}{floatToGoString(self._created)}\n")

    def observe(self, value: float) -> None:
        counts, total = self.state
        i = bisect.bisect_left(self._bounds, value)  # the first bound >= value, as Histogram.observe
        self.state = (counts[:i] + (counts[i] + 1,) + counts[i + 1:], total + value)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        counts, total = self.state
        family = Metric(self._name, self._doc, "histogram")
        acc = 0.0
        for le, n in zip(self._les, counts, strict=True):
            acc += n
            family.add_sample(self._name + "_bucket", {"le": le}, acc)
        family.add_sample(self._name + "_count", {}, acc)
        family.add_sample(self._name + "_sum", {}, total)
        family.add_sample(self._name + "_created", {}, self._created)
        yield family

    def text(self) -> bytes:
        counts, total = self.state
        out = [self._text_head]
        acc = 0.0
        for prefix, n in zip(self._bucket_prefixes, counts, strict=True):
            acc += n
            out += (prefix, go_float(acc), "\n")
        out.append(f"{self._name}_count {go_float(acc)}\n{self._name}_sum {go_float(total)}\n")
        out.append(self._created_text)
        return "".join(out).encode()


class ProcessFigures(ProcessCollector):
    """prometheus-client's ``process_*`` collector, whose ``text()`` gives the same families and values
    from cheaper reads: memory from ``/proc/self/statm`` (the same counters ``stat`` shows, without its
    per-thread CPU walk and fifty fields), CPU from ``times(2)`` (the same adjusted thread-group times in
    clock ticks), the start time read once, the open-files limit from ``getrlimit`` (what
    ``/proc/self/limits`` shows) and the open fds counted in ``/proc/self/fd`` as it does."""

    _NAMES = (("process_virtual_memory_bytes", "Virtual memory size in bytes."),
              ("process_resident_memory_bytes", "Resident memory size in bytes."),
              ("process_start_time_seconds", "Start time of the process since unix epoch in seconds."),
              ("process_cpu_seconds_total", "Total user and system CPU time spent in seconds."),
              ("process_open_fds", "Number of open file descriptors."),
              ("process_max_fds", "Maximum number of open file descriptors."))

    def __init__(self) -> None:
        super().__init__(registry=None)
        self._heads = [header(n, "counter" if n.endswith("_total") else "gauge", h) for n, h in self._NAMES]
        self._start: float | None = None
        try:
            with open("/proc/self/stat", "rb") as stat:
                self._start = float(stat.read().split(b")")[-1].split()[19]) / self._ticks + self._btime
        except (OSError, IndexError, ValueError):
            pass

    def text(self) -> bytes:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        try:
            if not self._btime or self._start is None or soft == resource.RLIM_INFINITY:
                raise OSError("not the common case")
            fd = os.open("/proc/self/statm", os.O_RDONLY)  # no buffered file object: half the cost
            try:
                size, resident = os.read(fd, 256).split()[:2]
            finally:
                os.close(fd)
            fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            from aithermd.publish.scrape import exposition
            return exposition(self.collect())
        cpu = os.times()
        page = self._pagesize
        values = (float(size) * page, float(resident) * page, self._start, cpu.user + cpu.system, float(fds),
                  float(soft))
        lines = zip(self._heads, self._NAMES, values, strict=True)
        return "".join([f"{head}{name} {go_float(v)}\n" for head, (name, _), v in lines]).encode()
