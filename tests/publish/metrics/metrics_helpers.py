"""Helpers of the metrics tests: parse an exposition into {(name, labels): value}."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from aithermd.publish import metrics
from aithermd.publish.hub import StateHub


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def scrape(handle: metrics.MetricsHandle) -> dict[tuple[str, frozenset], float]:
    return samples(metrics.render(handle).decode())


def value(found: dict, name: str, **labels: str) -> float:
    """The one sample ``name`` whose labels include ``labels``."""
    hits = [v for (n, ls), v in found.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def names(found: dict) -> set[str]:
    return {n for n, _ in found}


def handle_with(*snapshots, events=()) -> tuple[StateHub, metrics.MetricsHandle]:
    hub = StateHub()
    handle = metrics.start("none", hub)
    for i, s in enumerate(snapshots):
        hub.publish(s, events if i == len(snapshots) - 1 else ())
    return hub, handle
