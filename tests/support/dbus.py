"""The one private ``dbus-daemon`` of the tests: a real bus of our own, never the machine's.

``PrivateBus.start()`` writes a bus configuration into a fresh directory under the system temporary
directory (mode 0755, so a client running as an unprivileged uid reaches the socket; pytest's ``tmp_path``
is root-only), starts ``dbus-daemon --nofork`` on it and returns once the daemon printed its address (it
prints it after it listens). Three kinds of bus:

- ``"session"`` (default): a session bus where anyone may own and call anything (the rules of
  ``/usr/share/dbus-1/session.conf``, without its service activation);
- ``"system"``: ``<type>system</type>`` with the same permissive default policy: polkit and logind mocks
  and the daemon's service run on it as on the system bus, without the system bus's deny rules;
- ``policy=...``: the caller's own ``<policy>`` elements and ``include`` files (the shipped bus policy file
  under a Debian-like system bus).

``service_dirs`` adds ``<servicedir>`` elements: D-Bus activation from the ``.service`` files there.

A test without ``dbus-daemon`` installed is skipped with the package to install. ``stop()`` ends the bus and
removes its directory; ``kill()`` kills it with SIGKILL (a bus that dies under the daemon); ``restart()``
starts a new one on the same socket (a dbus-daemon restart).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

PERMISSIVE = """\
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
  </policy>"""

SESSION = """\
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>"""

CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>{type}</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
{policy}
{includes}
{service_dirs}
</busconfig>
"""


def need_dbus_daemon() -> str:
    """The path of ``dbus-daemon``; skips the test when it is not installed."""
    found = shutil.which("dbus-daemon")
    if found is None:
        pytest.skip("dbus-daemon is not installed (scripts/system-packages.txt: dbus-daemon)")
    return found


class PrivateBus:
    """One running private bus: ``address`` (``unix:path=...``), ``socket``, ``directory``, ``proc``."""

    def __init__(self, proc: subprocess.Popen[str], directory: Path, address: str) -> None:
        self.proc, self.directory, self.address = proc, directory, address
        self.socket = directory / "bus"

    @classmethod
    def start(cls, kind: str = "session", *, policy: str | None = None,
              include: Sequence[Path] = (), service_dirs: Sequence[Path] = (),
              timeout_s: float = 10.0) -> PrivateBus:
        """Start a bus of ``kind`` (``"session"`` or ``"system"``) with ``policy`` (``<policy>`` elements;
        default: the kind's permissive rules) and ``include`` (bus policy files to include)."""
        if kind not in ("session", "system"):
            raise ValueError(f"kind must be 'session' or 'system', not {kind!r}")
        daemon = need_dbus_daemon()
        directory = Path(tempfile.mkdtemp(prefix="aithermd-bus-"))
        directory.chmod(0o755)
        socket = directory / "bus"
        if policy is None:
            policy = SESSION if kind == "session" else PERMISSIVE
        includes = "\n".join(f"  <include>{p}</include>" for p in include)
        config = directory / "bus.conf"
        services = "\n".join(f"  <servicedir>{d}</servicedir>" for d in service_dirs)
        config.write_text(CONFIG.format(type=kind, socket=socket, policy=policy, includes=includes,
                                        service_dirs=services))
        log = directory / "bus.log"  # a file, not a pipe: a chatty bus never blocks on a full pipe
        with log.open("w") as err:
            proc = subprocess.Popen([daemon, f"--config-file={config}", "--nofork", "--nopidfile",
                                     "--nosyslog", "--print-address=1"], stdout=subprocess.PIPE, stderr=err,
                                    text=True)
        try:
            address = _first_line(proc, log, timeout_s)
        except BaseException:
            proc.kill()
            proc.wait()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return cls(proc, directory, address)

    def restart(self, timeout_s: float = 10.0) -> None:
        """Stop the bus and start a new dbus-daemon on the same socket (a ``systemctl restart dbus``):
        every connection is lost, the address stays."""
        self.kill()
        self.socket.unlink(missing_ok=True)
        config = self.directory / "bus.conf"
        with (self.directory / "bus.log").open("a") as err:
            self.proc = subprocess.Popen([need_dbus_daemon(), f"--config-file={config}", "--nofork",
                                          "--nopidfile", "--nosyslog", "--print-address=1"],
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        address = _first_line(self.proc, self.directory / "bus.log", timeout_s)
        assert address.split(",")[0] == self.address.split(",")[0], (address, self.address)

    def kill(self) -> None:
        """SIGKILL the bus (every connection on it is lost at once); ``stop()`` still cleans up."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PrivateBus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _first_line(proc: subprocess.Popen[str], log: Path, timeout_s: float) -> str:
    """The address ``dbus-daemon --print-address`` writes once it listens; raises RuntimeError with the
    daemon's stderr when it exits first or says nothing within ``timeout_s``."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if sel.select(timeout_s):
            line = proc.stdout.readline().strip()
            if line.startswith("unix:"):
                return line
    exited = proc.poll()
    proc.kill()
    proc.wait()
    why = f"exited with {exited}" if exited is not None else f"no address within {timeout_s:g} s"
    raise RuntimeError(f"dbus-daemon did not start ({why}): {log.read_text().strip() or 'no output'}")


@contextmanager
def private_bus(kind: str = "session", **kw) -> Iterator[PrivateBus]:
    """``with private_bus() as bus:`` — :meth:`PrivateBus.start`, stopped and removed on exit."""
    bus = PrivateBus.start(kind, **kw)
    try:
        yield bus
    finally:
        bus.stop()
