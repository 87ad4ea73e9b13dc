"""``aithermctl fans``: what the daemon knows of the fans (``show``, from ``GetSnapshot``), and fan detection
and calibration (``detect``, ``calibrate``: ``aithermd fans`` itself, which must run as root on the machine
with the daemon stopped, since it takes the fans over for a while)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aithermctl.document import all_knobs, fmt


def fans_text(doc: Mapping[str, Any]) -> str:
    """Per pwm or GPU fan knob: its name, the fan inputs detection found behind it, start and stop duty,
    speed at full, its duty now and who sets it; then each alarm."""
    rows = [("fan", "name", "fan inputs", "starts", "stops", "full speed", "duty", "set by")]
    for knob_id, k in all_knobs(doc).items():  # type: ignore[arg-type]
        if k.get("kind") not in ("pwm", "fan"):
            continue
        fan = k.get("fan")
        if fan is None:
            inputs = "(paired by number)" if k.get("kind") == "pwm" else "(the GPU's own)"
        else:
            inputs = ", ".join(t.rsplit("/", 1)[-1] for t in fan.get("tachs") or ()) or "(empty header)"
        top = ((fan or {}).get("max_rpm") or {}).items()
        full = ", ".join(f"{t.rsplit('/', 1)[-1]} {fmt(r, 'RPM')}" for t, r in top)
        rows.append((knob_id, str(k.get("label") or ""), inputs, fmt((fan or {}).get("start_pct"), "%", 1),
                     fmt((fan or {}).get("stop_pct"), "%", 1), full or "—", fmt(k.get("value"), "%"),
                     str(k.get("rule") or "firmware")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not any(all_knobs(doc).get(r[0], {}).get("fan") for r in rows[1:]):  # type: ignore[arg-type]
        lines.append("no fan detection stored: fan inputs are paired by number (aithermctl fans detect, as "
                     "root, with aithermd stopped)")
    for subject, a in (doc.get("alarms") or {}).items():
        lines.append(f"! {a.get('kind')}: {a.get('message') or subject}")
    return "\n".join(lines) + "\n"


def run_aithermd_fans(verb: str, rest: Sequence[str]) -> int:
    """Replace this process with ``aithermd fans VERB REST...`` (the ``aithermd`` next to this Python, else
    ``python -m aithermd``)."""
    script = os.path.join(os.path.dirname(sys.executable), "aithermd")
    if os.path.exists(script):
        argv = [script, "fans", verb, *rest]
    elif shutil.which("aithermd"):
        argv = ["aithermd", "fans", verb, *rest]
    else:
        argv = [sys.executable, "-m", "aithermd", "fans", verb, *rest]
    sys.stdout.flush()
    os.execvp(argv[0], argv)
    return 127  # not reached
