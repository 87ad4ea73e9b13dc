"""A umockdev testbed driven over stdin, for the hotplug tests. Runs under the SYSTEM python3 (PyGObject and
gir1.2-umockdev-1.0 from Debian) inside ``umockdev-wrapper``, so that sysfs paths it creates are the ones
the daemon (the project's venv python under the same LD_PRELOAD and UMOCKDEV_DIR) sees.

Prints the testbed's root directory (the daemon's UMOCKDEV_DIR), then answers each JSON command line with a
JSON line: ``{"op": "load", "text": UMOCKDEV_DESCRIPTION}`` adds devices (udev sends their ``add``),
``{"op": "remove", "path": SYSPATH}`` sends ``remove`` and deletes the device (the kernel's order: the
daemon must wait until the directory is gone), ``{"op": "quit"}`` ends it.
"""

import json
import sys

import gi

gi.require_version("UMockdev", "1.0")
from gi.repository import UMockdev  # noqa: E402


def main() -> int:
    testbed = UMockdev.Testbed.new()
    print(json.dumps({"root": testbed.get_root_dir()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "load":
                testbed.add_from_string(cmd["text"])
            elif op == "remove":
                testbed.uevent(cmd["path"], "remove")
                testbed.remove_device(cmd["path"])
            elif op == "quit":
                print(json.dumps({"ok": True}), flush=True)
                return 0
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:  # noqa: BLE001 - reported to the test
            print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
            continue
        print(json.dumps({"ok": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
