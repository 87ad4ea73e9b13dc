"""Daemon settings: defaults < config file < ``AITHERMD_*`` environment < command-line flags.

The config file is YAML (``/etc/aithermd/aithermd.yaml`` unless ``--config FILE``), a mapping of the keys
of :class:`DaemonSettings`; unknown keys are refused. An invalid file raises
:class:`~aithermd.errors.PolicyErrors` whose entries read ``FILE:LINE:COL: error: KEY: message``.

Metrics port: the Prometheus default-port allocations
(github.com/prometheus/prometheus/wiki/Default-port-allocations) hold 9090–9093 for Prometheus' own
components, filled 9100–9999 with exporters by 2023 and continue upward from 10000, so the default
``127.0.0.1:8736`` lies outside them; loopback only unless the admin says otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aithermd.errors import PolicyError, PolicyErrors
from aithermd.files import read_regular

DEFAULT_CONFIG = Path("/etc/aithermd/aithermd.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/aithermd")
DEFAULT_METRICS_LISTEN = "127.0.0.1:8736"  # the same as aithermd.publish.metrics.DEFAULT_METRICS_LISTEN
MAX_CONFIG_BYTES = 1 << 20
FLAG_NAMES = {"tick_s": "--tick", "nvml": "--no-nvml", "policy_dirs": "--policy-dir"}  # where not --key-name
MAX_CONFIG_VALUES = 10_000  # keys, values and list items, aliases expanded
ENV_PREFIX = "AITHERMD_"
JSON_SETTINGS = frozenset({"policy_dirs"})  # given in the environment as JSON (a list of directories)


LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
BOUNDS: dict[str, tuple[float, float | None]] = {  # ge, le
    "tick_s": (0.05, 60.0), "energy_interval_s": (0.0, 3600.0), "energy_top_n": (0, 1000),
    "energy_cost_per_kwh": (0.0, None)}
CURRENCY = re.compile(r"^[^\x00-\x1f\x7f]*$")
MAX_CURRENCY = 8
PATHS = ("state_dir", "runtime_dir", "sysfs_root")


class SettingsInvalid(ValueError):
    """Settings that do not validate: ``errors`` as pydantic's ``ValidationError.errors()`` gives them."""

    def __init__(self, message: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.errors = errors


def check_names(value: Mapping[str, str]) -> Mapping[str, str]:
    for key, name in value.items():
        if "/" not in key and ":" not in key:
            raise ValueError(f"{key!r} is not a channel or knob id (aithermd sensors lists them, e.g. "
                             "hwmon:nct6798-isa-0290/pwm2)")
        if not name.strip() or len(name) > 64 or any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
            raise ValueError(f"{key}: the name {name!r} must be 1–64 printable characters")
    return value


def check_interval(value: float) -> float:
    if 0 < value < 1.0:
        raise ValueError("must be 0 (no attribution) or at least 1 s")
    return value


def check_listen(value: str) -> str:
    if value == "none":
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port
        raise ValueError(f"{value!r} is not HOST:PORT (a port 0-65535, e.g. 127.0.0.1:8736) or 'none'")
    return value


def check_bus(value: str) -> str:
    if value in ("system", "session", "none") or "=" in value:
        return value
    raise ValueError(f"{value!r} is not system, session, none or a D-Bus address (unix:path=...)")


@dataclass(frozen=True)
class DaemonSettings:
    """Everything ``aithermd run`` is told. Units in the names; paths absolute or relative to the cwd.

    - ``tick_s``: control-loop period, s (0.05–60).
    - ``policy``: the active policy's name; ``policy_pinned`` (set by ``--policy``) makes it win over the
      choice kept in the state directory (otherwise the kept choice wins over this one).
    - ``policy_dirs``: directories loaded in order, a later file of the same name replacing an earlier one;
      None = the shipped policies then ``/etc/aithermd/policies.d``.
    - ``state_dir``: journal of original knob values, kept policy choice and overrides.
    - ``runtime_dir``: where the machine-wide lock lives (one daemon per machine: :mod:`aithermd.runtime.
      instance`; the unit's ``RuntimeDirectory=``).
    - ``sysfs_root``: root of the sysfs tree the hwmon/powercap backends read (a fixture copy in tests).
    - ``nvml``: open GPUs through NVML (no driver = zero GPUs, not an error).
    - ``dry_run``: decide and log, write nothing (not even the journal).
    - ``bus``: ``system`` | ``session`` | ``none`` | a D-Bus address.
    - ``metrics_listen``: ``HOST:PORT`` of the Prometheus endpoint, or ``none``.
    - ``log_format``: ``auto`` (JSON when stderr is not a terminal) | ``json`` | ``console``; ``log_level``.
    - ``names``: the admin's names for fans and sensors, by id (``hwmon:nct6798-isa-0290/pwm2: CPU fan``):
      shown in status, the TUI, explain and metrics (``label``) and matched by policies; ids never change.
    - ``energy_interval_s``: how often energy is attributed to processes, s (1–3600; 0: no attribution,
      energy windows still sum the devices); ``energy_top_n``: consumers per family with series of their own
      in Prometheus (the rest is ``other``); ``energy_cost_per_kwh`` and ``energy_currency``: the price the
      energy report multiplies by (None: no cost).

    Built directly it holds exactly what it is given, validated (:class:`SettingsInvalid`);
    :func:`load_settings` layers the file, the environment and the flags. Read-only: :meth:`replace`
    gives a changed copy.

    Validation: values already of their type and within bounds (what the command line and the defaults
    give) are checked here without pydantic; anything else (text from the environment or a file, a value
    out of bounds, an unknown key) goes to the pydantic model (:func:`_model`), whose coercions and error
    messages are the reference. pydantic and its validators cost the daemon ~12 MB and 0.05 s at start
    when imported for nothing.
    """

    config_file: Path | None = None
    tick_s: float = 1.0
    policy: str = "balanced"
    policy_pinned: bool = False
    policy_dirs: list[Path] | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    runtime_dir: Path = Path("/run/aithermd")
    sysfs_root: Path = Path("/sys")
    nvml: bool = True
    dry_run: bool = False
    bus: str = "system"
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    log_format: str = "auto"
    log_level: str = "info"
    energy_interval_s: float = 5.0
    energy_top_n: int = 10
    energy_cost_per_kwh: float | None = None
    energy_currency: str = ""
    names: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        values = {name: getattr(self, name) for name in FIELDS}
        checked = _quick(values)
        for name, value in (checked if checked is not None else validated(values)).items():
            object.__setattr__(self, name, value)

    def replace(self, **changes: Any) -> DaemonSettings:
        """A copy with ``changes``, validated. Raises SettingsInvalid."""
        return dataclasses.replace(self, **changes)


FIELDS = tuple(f.name for f in dataclasses.fields(DaemonSettings))


def _number(value: Any, name: str, kind: type = float) -> bool:
    lo, hi = BOUNDS[name]
    if type(value) is not kind and not (kind is float and type(value) is int):
        return False
    return math.isfinite(value) and lo <= value and (hi is None or value <= hi)


def _path(value: Any) -> Path | None:
    if isinstance(value, Path):
        return value
    return Path(value) if type(value) is str and value else None


def _quick(v: Mapping[str, Any]) -> dict[str, Any] | None:
    """The values as the model would give them, when each is plainly of its type and valid; None when
    any needs pydantic's judgement (coercion from text, an error to report)."""
    out = dict(v)
    try:
        if not (_number(v["tick_s"], "tick_s") and _number(v["energy_interval_s"], "energy_interval_s")
                and _number(v["energy_top_n"], "energy_top_n", int)
                and (v["energy_cost_per_kwh"] is None
                     or _number(v["energy_cost_per_kwh"], "energy_cost_per_kwh"))
                and all(type(v[k]) is bool for k in ("policy_pinned", "nvml", "dry_run"))
                and all(type(v[k]) is str for k in ("policy", "bus", "metrics_listen", "energy_currency"))
                and v["policy"] and len(v["energy_currency"]) <= MAX_CURRENCY
                and CURRENCY.match(v["energy_currency"])
                and v["log_format"] in LOG_FORMATS and v["log_level"] in LOG_LEVELS
                and type(v["names"]) is dict
                and all(type(k) is str and type(n) is str for k, n in v["names"].items())):
            return None
        for key in ("tick_s", "energy_interval_s"):
            out[key] = float(v[key])
        if v["energy_cost_per_kwh"] is not None:
            out["energy_cost_per_kwh"] = float(v["energy_cost_per_kwh"])
        for key in (*PATHS, "config_file"):
            out[key] = _path(v[key])
            if out[key] is None and (key != "config_file" or v[key] is not None):
                return None
        if v["policy_dirs"] is not None:
            if type(v["policy_dirs"]) is not list:
                return None
            out["policy_dirs"] = [_path(d) for d in v["policy_dirs"]]
            if None in out["policy_dirs"]:
                return None
        check_names(v["names"]), check_interval(v["energy_interval_s"])
        check_listen(v["metrics_listen"]), check_bus(v["bus"])
    except (ValueError, TypeError):
        return None
    return out


def validated(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (any keys) as the pydantic model coerces them, every field (:mod:`aithermd.settings_model`).
    Raises SettingsInvalid with every problem (unknown keys included)."""
    from aithermd.settings_model import validated
    return validated(values)


def environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings given as ``AITHERMD_<NAME>`` environment variables (the name in any case; other
    ``AITHERMD_*`` variables belong to other programs and are ignored); ``policy_dirs`` is a JSON list.
    Raises PolicyErrors for a value that is not JSON where JSON is expected."""
    env = os.environ if environ is None else environ
    by_name = {k[len(ENV_PREFIX):].lower(): v for k, v in env.items() if k.upper().startswith(ENV_PREFIX)}
    out: dict[str, Any] = {}
    for name in FIELDS:
        if name not in by_name:
            continue
        raw = by_name[name]
        if name in JSON_SETTINGS:
            try:
                out[name] = json.loads(raw)
            except ValueError:
                raise PolicyErrors([PolicyError(f"{ENV_PREFIX}{name.upper()}", f"not JSON: {raw!r}", key=name,
                                                hint='give a JSON list, e.g. ["/etc/aithermd/policies.d"]')]) \
                    from None
        else:
            out[name] = raw
    return out


def read_config(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """The config file as a dict, and each top-level key's (line, col), 1-based (``key.sub`` for the entries
    of a top-level mapping).

    Raises :class:`PolicyErrors` when the file cannot be read or is not a YAML mapping."""
    from ruamel.yaml import YAML  # only with a config file
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.reader import ReaderError

    text = _read_text(path)
    try:
        doc = YAML(typ="rt").load(text)
    except ReaderError as exc:  # a control character: ruamel gives only an offset
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise PolicyErrors([PolicyError(str(path), "not valid YAML: a control character is not allowed",
                                        line=line, col=col, hint="remove it")]) from None
    except RecursionError:
        raise PolicyErrors([PolicyError(str(path), "not valid YAML: nested too deeply")]) from None
    except YAMLError as exc:
        from aithermd.policy.loader import yaml_hint
        mark = getattr(exc, "problem_mark", None)
        problem = str(getattr(exc, "problem", None) or exc)
        raise PolicyErrors([PolicyError(
            str(path), f"not valid YAML: {problem}", line=mark.line + 1 if mark else None,
            col=mark.column + 1 if mark else None, hint=yaml_hint(problem, mark))]) from exc
    if doc is None:
        return {}, {}
    if not isinstance(doc, Mapping):
        raise PolicyErrors([PolicyError(str(path), "the config must be a mapping of settings",
                                        line=1, col=1, hint="e.g. 'tick_s: 1.0'")])
    marks: dict[str, tuple[int, int]] = {}
    lc = getattr(doc, "lc", None)
    for key in doc:
        if lc is not None:
            try:
                line, col = lc.key(key)
                marks[str(key)] = (line + 1, col + 1)
            except (KeyError, TypeError):
                pass
        inner = doc[key]  # a mapping's entries too (``names:``): an error points at its own line
        for sub in inner if isinstance(inner, Mapping) and getattr(inner, "lc", None) is not None else ():
            try:
                line, col = inner.lc.key(sub)
                marks[f"{key}.{sub}"] = (line + 1, col + 1)
            except (KeyError, TypeError):
                pass
    budget = [MAX_CONFIG_VALUES]
    try:
        return {str(k): _plain(v, budget) for k, v in doc.items()}, marks
    except OverflowError:
        raise PolicyErrors([PolicyError(str(path), f"expands to more than {MAX_CONFIG_VALUES} values "
                                        "(anchors and aliases repeating each other?): not a config file",
                                        line=1, col=1)]) from None


def _read_text(path: Path) -> str:
    """The file's text; PolicyErrors when it is not a readable regular UTF-8 file of at most
    MAX_CONFIG_BYTES (O_NONBLOCK: a FIFO never hangs the daemon or ``aithermd restore``)."""
    try:
        raw = read_regular(path, MAX_CONFIG_BYTES)
    except OSError as exc:  # NotRegularFile included: "not a regular file"
        raise PolicyErrors([PolicyError(str(path), f"cannot read: {exc.strerror or exc}")]) from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise PolicyErrors([PolicyError(str(path), f"larger than {MAX_CONFIG_BYTES} bytes: "
                                                   "not a config file")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyErrors([PolicyError(str(path), f"not UTF-8 text ({exc.reason} at byte {exc.start})")]) \
            from None


def _plain(value: Any, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise OverflowError
    if isinstance(value, Mapping):
        return {str(k): _plain(v, budget) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, budget) for v in value]
    return value


def load_settings(config: Path | None = None, flags: Mapping[str, Any] | None = None) -> DaemonSettings:
    """Settings from ``config`` (or :data:`DEFAULT_CONFIG` when it exists) overridden by ``flags``.

    ``flags`` holds only what the command line gave (None values are ignored); ``policy`` there pins the
    policy; ``policy_dirs`` there are appended to the file's (or the default) directories.
    Raises :class:`PolicyErrors` (exit 2 for an unreadable file, 1 for invalid content).
    """
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    env = environment()
    if config is None and DEFAULT_CONFIG.is_file():
        config = DEFAULT_CONFIG
    if config is None and env.get("config_file"):
        config = Path(env["config_file"])
    file_data: dict[str, Any] = {}
    marks: dict[str, tuple[int, int]] = {}
    if config is not None:
        file_data, marks = read_config(config)
        given["config_file"] = config
    if "policy" in given:
        given["policy_pinned"] = True
    extra_dirs = given.pop("policy_dirs", None)
    data = {**file_data, **env, **given}
    try:
        settings = DaemonSettings(**(data if set(data) <= set(FIELDS) else validated(data)))
    except SettingsInvalid as exc:
        from aithermd.settings_model import errors_at_sources
        raise errors_at_sources(exc, config, marks, file_data, {**env, **given}, given) from exc
    if extra_dirs:
        base = settings.policy_dirs if settings.policy_dirs is not None else default_policy_dirs()
        settings = settings.replace(policy_dirs=[*base, *map(Path, extra_dirs)])
    return settings


def default_policy_dirs() -> list[Path]:
    """The shipped policies, then the admin's directory (``/etc/aithermd/policies.d``)."""
    from aithermd.policy.loader import ADMIN_POLICY_DIR, shipped_policy_dir
    return [Path(shipped_policy_dir()), Path(ADMIN_POLICY_DIR)]
