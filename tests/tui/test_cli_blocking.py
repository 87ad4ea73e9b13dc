"""``aithermctl status`` over one blocking connection (aithermctl.calls.BlockingClient): the same output as
the dbus-fast client without an event loop, and the dbus-fast client for a bus jeepney does not speak."""

import asyncio
import json
import sys

import pytest
from cli_helpers import ctl

from aithermctl import calls, errors
from aithermd.publish import wire

LOADED = ("import sys; from aithermctl.cli import main; rc = main(sys.argv[1:]); "
          "print(sorted({m.split('.')[0] for m in sys.modules} & {'asyncio', 'dbus_fast', 'textual'}), "
          "file=sys.stderr); sys.exit(rc)")


async def test_status_starts_no_event_loop_nor_dbus_fast(fake_daemon, private_bus):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOADED, "--bus", private_bus, "status",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    assert err.decode() == "[]\n"
    assert "  gpu0  NVIDIA GeForce RTX 4090" in out.decode()


async def test_blocking_and_asyncio_clients_read_the_same_document(fake_daemon, private_bus):
    from aithermctl.client import DaemonClient

    async with DaemonClient(private_bus) as c:
        expected = await c.get_snapshot()
    with calls.BlockingClient(private_bus) as c:
        assert await asyncio.to_thread(c.get_snapshot) == expected == fake_daemon.doc
        text = await asyncio.to_thread(c.call, "GetSnapshot")
    assert text == json.dumps(fake_daemon.doc, ensure_ascii=False)


async def test_blocking_client_maps_daemon_errors(fake_daemon, private_bus):
    with calls.BlockingClient(private_bus) as c:
        with pytest.raises(errors.Rejected) as info:
            await asyncio.to_thread(c.call, "GetPolicy", "no-such-policy")
    assert info.value.dbus_name == wire.ERROR_UNKNOWN_POLICY
    assert str(info.value).endswith("(policies: aithermctl policy list)")


def test_blocking_client_refuses_a_missing_socket(tmp_path):
    address = f"unix:path={tmp_path}/nobus"
    with pytest.raises(errors.BusUnreachable) as info:
        calls.BlockingClient(address).connect()
    assert str(info.value) == (f"cannot reach the bus at {address}: no bus socket (check the address; "
                               "`aithermctl demo` starts a private bus with a simulated daemon)")


@pytest.mark.parametrize("address", ["tcp:host=127.0.0.1,port=9", "nonsense", "session"])
def test_an_address_without_unix_transport_is_for_dbus_fast(address, monkeypatch):
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)  # dbus-fast also looks for X11's
    with pytest.raises(calls.Unsupported):
        calls.BlockingClient(address).connect()


async def test_status_on_a_tcp_bus_goes_through_dbus_fast(tmp_path):
    """Nothing listens on the discard port: dbus-fast's refusal, one line, exit 3."""
    rc, out, err = await ctl("tcp:host=127.0.0.1,port=9", "status")
    assert (rc, out) == (wire.EXIT_NOT_RUNNING, "")
    assert err.startswith("aithermctl: cannot reach the bus at tcp:host=127.0.0.1,port=9: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("address", ["garbage", "", "unix:path", "unix:path=/run/x;nonsense"])
def test_a_malformed_bus_address_is_a_usage_error(address, capsys):
    """`aithermctl --bus garbage status` exited 3 (not running) for what is a typo."""
    from aithermctl.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--bus", address, "status"])
    assert info.value.code == wire.EXIT_USAGE
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == (f"aithermctl: error: argument --bus: {address!r} is not system, session or a D-Bus address "
                   "(unix:path=/run/dbus/system_bus_socket, the one `aithermctl demo` prints)")


async def test_run_with_no_bus_says_the_command_was_not_run(tmp_path):
    """newuser7 10: only 'cannot reach the bus' was said; CMD was not run and nothing said so."""
    marker = tmp_path / "ran"
    rc, out, err = await ctl("tcp:host=127.0.0.1,port=9", "run", "--policy", "ai-training", "--", "touch",
                             str(marker))
    assert (rc, out) == (wire.EXIT_NOT_RUNNING, "") and not marker.exists()
    assert err.startswith("aithermctl: cannot reach the bus at tcp:host=127.0.0.1,port=9: ")
    assert err.splitlines()[-1] == (f"aithermctl: run: touch {marker} was not run (ai-training could not be "
                                    "held for it); start aithermd, or run it without aithermctl")
