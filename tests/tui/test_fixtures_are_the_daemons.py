"""aithermctl is tested with what the daemon really sends.

Every fixture document of the TUI's tests (``fixtures/*.json``: GetSnapshot, GetHistory, Explain,
ListPolicies, GetPolicy, the Event signals, StopEnergyWindow) is written by ``python -m
tests.support.documents`` from the real daemon on the simulated workstation and on a recorded board
(:mod:`tests.support.documents`); none is written by hand. Here:

- each file is what the daemon sends *now*, value for value (the run is deterministic); only what the
  energy accounting's thread computes is compared by shape (members at the same places): a daemon that
  sends anything else — a new member, a changed message, another value — fails here until the files are
  regenerated;
- the snapshot and history files have the typed shape both ends share (:mod:`aithermd.publish.wire`),
  strictly;
- every member aithermctl reads — the CLI's status text, doctor, the TUI's views, history and every screen —
  is one the schema declares, and is present in what the daemon sends: the GPU card's slowdown line read a
  ``thresholds`` member no daemon published, and its test passed on a hand-written fixture.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import UnionType
from typing import Any, NamedTuple, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest
from fake_client import FakeClient
from screen_text import screen_text

from aithermctl import doctor, render
from aithermctl.app import AithermApp
from aithermctl.document import overview
from aithermctl.history import History, plotted_ids
from aithermd.publish import wire
from tests.support import documents

FIXTURES = Path(__file__).parent / "fixtures"
SCHEMAS = {"snapshot.json": wire.SnapshotDoc, "history.json": wire.HistoryDoc,
           "snapshot_nogpu.json": wire.SnapshotDoc}
FREE_FORM = {"series", "units", "knobs", "knob_units", "states", "inputs", "alarms",
             "max_rpm"}  # keyed by ids, policies, inputs: keys are values
# a member a daemon legitimately leaves out in that document's configuration
# energy accounting off on that run; duplicate_of only on a machine exposing its RAPL package twice (MMIO);
# held_idle only while a GPU is held high at idle (the workstation's GPUs are training): what the daemon
# sends then is read in tests/tui/test_render.py (runtime.tick.with_held_idle)
# .budget is sent only while a power budget is in force (workstation): tests/tui/test_status_budget.py
ABSENT_BY_DESIGN = {"snapshot_nogpu.json": {".processes", ".devices[powercap].duplicate_of", ".budget"},
                    "snapshot.json": {".devices[powercap].duplicate_of", ".devices[gpu].attrs.held_idle",
                                      ".budget"}}
REGENERATE = "the daemon's documents changed shape: regenerate with python -m tests.support.documents"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict[str, Any]:
    """The documents the daemon sends now (about four seconds: simulated time)."""
    return documents.fixture_documents(tmp_path_factory.mktemp("documents"))


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def shape(doc: Any, path: str = "", *, free: bool = False) -> set[str]:
    """Every member path of ``doc`` (list items collapsed to ``[]``; keys of free-form maps to ``*``;
    ``free``: ``doc`` itself is one, as Explain's map of knob ids)."""
    out = {path}
    if isinstance(doc, dict):
        free = free or path.rsplit(".", 1)[-1] in FREE_FORM
        for k, v in doc.items():
            out |= shape(v, f"{path}.{'*' if free else k}")
    elif isinstance(doc, list):
        for v in doc:
            out |= shape(v, f"{path}[]")
    return out


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_fixture_has_the_shared_typed_shape(name):
    wire.check(load(name), SCHEMAS[name], strict=True)


@pytest.mark.parametrize("name", documents.FIXTURE_FILES)
def test_each_fixture_is_what_the_daemon_sends_now(name, fresh):
    ours, theirs = load(name), json.loads(documents.fixture_text(name, fresh[name]))
    for member in documents.VOLATILE.get(name, ()):  # the accounting thread's: by shape
        mine, its = ours.pop(member, None), theirs.pop(member, None)
        assert shape(mine) == shape(its), f"{REGENERATE}: {member} changed shape"
    top = name == "explain.json"  # {knob id: ...}
    assert shape(ours, free=top) == shape(theirs, free=top), \
        f"{REGENERATE}: only in the file {sorted(shape(ours, free=top) - shape(theirs, free=top))[:8]}, " \
        f"only in the daemon's {sorted(shape(theirs, free=top) - shape(ours, free=top))[:8]}"
    assert ours == theirs, f"{REGENERATE}: {name} holds other values than the daemon sends now " \
                           f"(first difference at {first_difference(ours, theirs)})"


def first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where ``a`` and ``b`` first differ (a member path), for the failure message."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path or 'the top'}: {a!r:.60} in the file, {b!r:.60} from the daemon"


def test_the_value_check_sees_a_message_the_daemon_does_not_send(fresh):
    """The hand-written events of before ("450 W → 520 W by ai-training/raise-under-load") named a rule no
    shipped policy has and data members (from, to) the daemon never sends."""
    doc = json.loads(json.dumps(fresh["events.json"]))
    doc[0][1]["message"] = "450 W → 520 W by ai-training/raise-under-load"
    assert doc != fresh["events.json"]
    assert first_difference(doc, fresh["events.json"]).startswith("[0][1].message:")


def test_no_fixture_document_is_written_by_hand():
    """Every JSON file in fixtures/ is one the daemon's run writes."""
    assert sorted(p.name for p in FIXTURES.glob("*.json")) == sorted(documents.FIXTURE_FILES)


def test_the_shape_check_sees_a_member_the_daemon_does_not_send(fresh):
    """The hand-written snapshot of before had channel thresholds no daemon published: caught here."""
    doc = json.loads(json.dumps(fresh["snapshot_nogpu.json"]))
    doc["devices"][0]["serial"] = {"board": "1324021012345"}
    assert shape(doc) - shape(fresh["snapshot_nogpu.json"]) == {".devices[].serial", ".devices[].serial.board"}


# -- every member aithermctl reads ------------------------------------------------------------------------
class Read(NamedTuple):
    path: str
    key: str
    declared: bool  # the schema names it
    present: bool  # the document has it


class Watched(dict):
    """A document node that notes every member read through ``[]`` or ``.get`` (with the schema type of the
    node, so undeclared reads show)."""

    def __init__(self, data: dict, schema: Any, path: str, log: list[Read]) -> None:
        super().__init__(data)
        self._schema, self._path, self._log = schema, path, log

    def _child(self, key: str) -> tuple[bool, Any]:
        schema = self._schema
        if is_typeddict(schema):
            hints = get_type_hints(schema)
            return key in hints, hints.get(key, Any)
        if get_origin(schema) is dict:
            return True, get_args(schema)[1]
        return schema is Any, Any

    def _note(self, key: Any) -> Any:
        declared, schema = self._child(key)
        present = dict.__contains__(self, key)
        self._log.append(Read(self._path, str(key), declared, present))
        return schema

    def __getitem__(self, key: Any) -> Any:
        schema = self._note(key)
        return watch(dict.__getitem__(self, key), schema, f"{self._path}.{key}", self._log)

    def get(self, key: Any, default: Any = None) -> Any:
        schema = self._note(key)
        if not dict.__contains__(self, key):
            return default
        return watch(dict.__getitem__(self, key), schema, f"{self._path}.{key}", self._log)


class WatchedList(list):
    def __init__(self, data: list, schema: Any, path: str, log: list[Read]) -> None:
        super().__init__(data)
        self._schema, self._path, self._log = schema, path, log

    def _item(self, value: Any) -> Any:
        tag = ""
        if isinstance(value, dict):  # name the item by what it is: devices[gpu], channels[temperature]
            tag = str(value.get("kind") if "channels" in value else
                      value.get("attribute") or str(value.get("id", "")).rsplit("/", 1)[-1])
        return watch(value, self._schema, f"{self._path}[{tag}]", self._log)

    def __iter__(self) -> Iterator[Any]:
        return (self._item(v) for v in list.__iter__(self))

    def __getitem__(self, index: Any) -> Any:
        value = list.__getitem__(self, index)
        return [self._item(v) for v in value] if isinstance(index, slice) else self._item(value)


def watch(value: Any, schema: Any, path: str, log: list[Read]) -> Any:
    if get_origin(schema) in (Union, UnionType):  # X | None: the node is an X when it is there
        schema = next(a for a in get_args(schema) if a is not type(None))
    if isinstance(value, dict):
        return Watched(value, schema, path, log)
    if isinstance(value, list):
        item = get_args(schema)[0] if get_origin(schema) is list else Any
        return WatchedList(value, item, path, log)
    return value


class DoctorClient(FakeClient):
    async def name_has_owner(self, name: str = wire.BUS_NAME) -> bool:
        return True

    async def get_property(self, name: str) -> Any:
        return "0.0.0"


async def reads_of_every_consumer(doc: Any, history: Any, explained: Any) -> list[Read]:
    """Run every reader of the snapshot and history documents over watched copies of them."""
    log: list[Read] = []
    snap = watch(doc, wire.SnapshotDoc, "", log)
    overview(snap)
    render.status_text(snap)
    render.explain_text({}, snap)
    plotted_ids(snap)
    h = History()
    h.load(watch(history, wire.HistoryDoc, "history", log))
    h.append(doc["t_wall"] + 1.0, snap)
    client = DoctorClient()
    client.doc = snap
    await doctor.check_daemon(client)
    client.history = watch(history, wire.HistoryDoc, "history", log)
    client.explained = watch(explained, Any, "explain", log)
    app = AithermApp(client, retry_s=(0.01, 0.02), poll_s=60.0)
    async with app.run_test(size=(140, 40)) as pilot:
        for key in ("", "2", "3", "5", "1"):  # overview, plots, policy, processes
            if key:
                await pilot.press(key)
            for _ in range(3):
                await pilot.pause()
            assert screen_text(app)
    return log


@pytest.mark.parametrize("name", ["snapshot.json", "snapshot_nogpu.json"])
async def test_everything_aithermctl_reads_is_declared_and_sent(name, fresh):
    log = await reads_of_every_consumer(fresh[name], fresh["history.json"], fresh["explain.json"])
    undeclared = sorted({f"{r.path}.{r.key}" for r in log if not r.declared})
    assert not undeclared, f"aithermctl reads members the schema does not declare: {undeclared}"
    missing = {f"{r.path}.{r.key}" for r in log if not r.present} - ABSENT_BY_DESIGN.get(name, set())
    # alarms: a map by fan or knob id holding only what is in alarm; a fan without one is looked up in vain
    missing = {m for m in missing if not m.startswith(".alarms.")}
    assert not missing, f"aithermctl reads members the daemon does not send: {sorted(missing)}"
    assert ".devices[gpu].channels[temperature].thresholds.slowdown" in {f"{r.path}.{r.key}" for r in log} \
        or name == "snapshot_nogpu.json"


async def test_the_watch_catches_a_member_the_daemon_does_not_send(fresh):
    """Without thresholds (the daemon of before) the GPU card's slowdown read is reported missing."""
    doc = json.loads(json.dumps(fresh["snapshot.json"]))
    for device in doc["devices"]:
        for channel in device["channels"]:
            channel.pop("thresholds", None)
    log = await reads_of_every_consumer(doc, fresh["history.json"], fresh["explain.json"])
    missing = {f"{r.path}.{r.key}" for r in log if not r.present}
    assert ".devices[gpu].channels[temperature].thresholds" in missing
