"""The introspection file in the repo is what the daemon exports."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from dbus_helpers import call

from aithermd.publish import wire

XML = Path(__file__).parents[3] / "systemd" / "io.github.aithermd.Daemon1.xml"


def _members(xml_text: str) -> dict[tuple[str, str], tuple]:
    """{(kind, name): args or (type, access)} of the io.github.aithermd.Daemon1 interface."""
    root = ET.fromstring(xml_text)
    (iface,) = [i for i in root.iter("interface") if i.get("name") == wire.INTERFACE]
    out: dict[tuple[str, str], tuple] = {}
    for element in iface:
        if element.tag == "property":
            out[("property", element.get("name"))] = (element.get("type"), element.get("access"))
        elif element.tag in ("method", "signal"):
            default = "in" if element.tag == "method" else "out"
            out[(element.tag, element.get("name"))] = tuple(
                (a.get("name"), a.get("direction", default), a.get("type")) for a in element.iter("arg"))
    return out


async def test_the_xml_file_matches_the_live_introspection(service, client):
    reply = await call(client, "Introspect", interface="org.freedesktop.DBus.Introspectable")
    assert reply.error_name is None, reply.body
    assert _members(XML.read_text()) == _members(reply.body[0])


def test_the_xml_file_covers_wire():
    members = _members(XML.read_text())
    for name, (sig_in, sig_out) in wire.METHODS.items():
        args = members[("method", name)]
        assert "".join(t for _n, d, t in args if d == "in") == sig_in, name
        assert "".join(t for _n, d, t in args if d == "out") == sig_out, name
    for name, sig in wire.PROPERTIES.items():
        assert members[("property", name)] == (sig, "read")
    for name, sig in wire.SIGNALS.items():
        assert "".join(t for _n, _d, t in members[("signal", name)]) == sig
    assert len(members) == len(wire.METHODS) + len(wire.PROPERTIES) + len(wire.SIGNALS)
