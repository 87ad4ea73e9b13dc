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

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from aithermd.errors import PolicyError, PolicyErrors
from aithermd.files import read_regular

DEFAULT_CONFIG = Path("/etc/aithermd/aithermd.yaml")
DEFAULT_METRICS_LISTEN = "127.0.0.1:8736"  # the same as aithermd.publish.metrics.DEFAULT_METRICS_LISTEN
MAX_CONFIG_BYTES = 1 << 20
FLAG_NAMES = {"tick_s": "--tick", "nvml": "--no-nvml", "policy_dirs": "--policy-dir"}  # where not --key-name
MAX_CONFIG_VALUES = 10_000  # keys, values and list items, aliases expanded
ENV_PREFIX = "AITHERMD_"
JSON_SETTINGS = frozenset({"policy_dirs"})  # given in the environment as JSON (a list of directories)


class DaemonSettings(BaseModel):
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

    Built directly it holds exactly what it is given; :func:`load_settings` layers the file, the
    environment and the flags.
    """

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)

    config_file: Path | None = None
    tick_s: float = Field(1.0, ge=0.05, le=60.0)
    policy: str = Field("balanced", min_length=1)
    policy_pinned: bool = False
    policy_dirs: list[Path] | None = None
    state_dir: Path = Path("/var/lib/aithermd")
    runtime_dir: Path = Path("/run/aithermd")
    sysfs_root: Path = Path("/sys")
    nvml: bool = True
    dry_run: bool = False
    bus: str = "system"
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    energy_interval_s: float = Field(5.0, ge=0.0, le=3600.0)
    energy_top_n: int = Field(10, ge=0, le=1000)
    energy_cost_per_kwh: float | None = Field(None, ge=0.0)
    energy_currency: str = Field("", max_length=8, pattern=r"^[^\x00-\x1f\x7f]*$")
    names: dict[str, str] = Field(default_factory=dict)

    @field_validator("names")
    @classmethod
    def _check_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, name in value.items():
            if "/" not in key and ":" not in key:
                raise ValueError(f"{key!r} is not a channel or knob id (aithermd sensors lists them, e.g. "
                                 "hwmon:nct6798-isa-0290/pwm2)")
            if not name.strip() or len(name) > 64 or any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
                raise ValueError(f"{key}: the name {name!r} must be 1–64 printable characters")
        return value

    @field_validator("energy_interval_s")
    @classmethod
    def _check_interval(cls, value: float) -> float:
        if 0 < value < 1.0:
            raise ValueError("must be 0 (no attribution) or at least 1 s")
        return value

    @field_validator("metrics_listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        if value == "none":
            return value
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port
            raise ValueError(f"{value!r} is not HOST:PORT (a port 0-65535, e.g. 127.0.0.1:8736) or 'none'")
        return value

    @field_validator("bus")
    @classmethod
    def _check_bus(cls, value: str) -> str:
        if value in ("system", "session", "none") or "=" in value:
            return value
        raise ValueError(f"{value!r} is not system, session, none or a D-Bus address (unix:path=...)")



def environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings given as ``AITHERMD_<NAME>`` environment variables (the name in any case; other
    ``AITHERMD_*`` variables belong to other programs and are ignored); ``policy_dirs`` is a JSON list.
    Raises PolicyErrors for a value that is not JSON where JSON is expected."""
    env = os.environ if environ is None else environ
    by_name = {k[len(ENV_PREFIX):].lower(): v for k, v in env.items() if k.upper().startswith(ENV_PREFIX)}
    out: dict[str, Any] = {}
    for name in DaemonSettings.model_fields:
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
    """The config file as a dict, and each top-level key's (line, col), 1-based.

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
    try:
        settings = DaemonSettings(**{**file_data, **env, **given})
    except ValidationError as exc:
        raise _errors(exc, config, marks, file_data, {**env, **given}, given) from exc
    if extra_dirs:
        base = settings.policy_dirs if settings.policy_dirs is not None else default_policy_dirs()
        settings = settings.model_copy(update={"policy_dirs": [*base, *map(Path, extra_dirs)]})
    return settings


def default_policy_dirs() -> list[Path]:
    """The shipped policies, then the admin's directory (``/etc/aithermd/policies.d``)."""
    from aithermd.policy.loader import ADMIN_POLICY_DIR, shipped_policy_dir
    return [Path(shipped_policy_dir()), Path(ADMIN_POLICY_DIR)]


def _errors(exc: ValidationError, config: Path | None, marks: Mapping[str, tuple[int, int]],
            file_data: Mapping[str, Any], later: Mapping[str, Any], flags: Mapping[str, Any]) -> PolicyErrors:
    """Each error at its source: the file (FILE:LINE:COL) unless the environment or a flag overrode the
    key, the flag (``--tick``), or the environment variable."""
    errors: list[PolicyError] = []
    for err in exc.errors():
        loc = err.get("loc") or ()
        key = ".".join(str(p) for p in loc) or None
        top = str(loc[0]) if loc else ""
        message = _in_words(err)
        hint = None
        if err.get("type") == "extra_forbidden":
            close = _closest(top, DaemonSettings.model_fields)
            hint = f"did you mean {close!r}?" if close else None
        if config is not None and top in file_data and top not in later:
            line, col = marks.get(top, (None, None))
            errors.append(PolicyError(str(config), message, line=line, col=col, key=key, hint=hint))
        else:
            source = FLAG_NAMES.get(top, "--" + top.replace("_", "-")) if top in flags \
                else f"{ENV_PREFIX}{top.upper()}"
            errors.append(PolicyError(source, message, key=key, hint=hint))
    return PolicyErrors(errors)


def _closest(word: str, choices: Mapping[str, Any]) -> str | None:
    import difflib
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def _in_words(err: Mapping[str, Any]) -> str:
    """A pydantic error in the project's words: bounds as "must be at least 0.05 (got 0)"."""
    kind, ctx, got = err.get("type"), err.get("ctx") or {}, err.get("input")
    shown = f"{got:g}" if isinstance(got, int | float) and not isinstance(got, bool) else repr(got)
    bounds = {"greater_than_equal": ("at least", "ge"), "greater_than": ("more than", "gt"),
              "less_than_equal": ("at most", "le"), "less_than": ("less than", "lt")}
    if kind in bounds and bounds[kind][1] in ctx:
        words, key = bounds[kind]
        return f"must be {words} {ctx[key]:g} (got {shown})"
    if kind == "extra_forbidden":
        return "unknown setting"
    if kind in ("float_parsing", "int_parsing", "float_type", "int_type"):
        return f"must be a number (got {shown})"
    if kind == "finite_number":
        return f"must be a finite number (got {shown})"
    if kind == "value_error":  # a validator's own sentence, without pydantic's "Value error, "
        return str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return str(err.get("msg", "invalid"))
