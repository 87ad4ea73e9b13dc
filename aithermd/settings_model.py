"""The pydantic model of :class:`~aithermd.settings.DaemonSettings` and its errors in the project's words.

The slow path of settings validation: :mod:`aithermd.settings` checks values that are plainly of their type
and within bounds itself; text to coerce (the environment, a config file), a value out of bounds and an
unknown key come here, where pydantic coerces and words the errors. Imported only then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from aithermd.errors import PolicyError, PolicyErrors
from aithermd.settings import (
    BOUNDS,
    CURRENCY,
    DEFAULT_METRICS_LISTEN,
    DEFAULT_STATE_DIR,
    ENV_PREFIX,
    FIELDS,
    FLAG_NAMES,
    LOG_FORMATS,
    LOG_LEVELS,
    MAX_CURRENCY,
    SettingsInvalid,
    check_bus,
    check_interval,
    check_listen,
    check_names,
)


def validated(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (any keys) as the pydantic model coerces them, every field. Raises SettingsInvalid with
    every problem (unknown keys included)."""
    from pydantic import ValidationError
    try:
        m = _model()(**values)
    except ValidationError as exc:
        raise SettingsInvalid(str(exc), exc.errors()) from None
    return {name: getattr(m, name) for name in FIELDS}


_models: list[Any] = []


def _model() -> Any:
    """The pydantic model of :class:`DaemonSettings` (built once, when first needed): the reference for
    coercion (text from the environment and files) and for the error messages."""
    if _models:
        return _models[0]
    from pydantic import BaseModel, ConfigDict, Field, field_validator

    b = BOUNDS

    class DaemonSettingsModel(BaseModel):
        model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)

        config_file: Path | None = None
        tick_s: float = Field(1.0, ge=b["tick_s"][0], le=b["tick_s"][1])
        policy: str = Field("balanced", min_length=1)
        policy_pinned: bool = False
        policy_dirs: list[Path] | None = None
        state_dir: Path = DEFAULT_STATE_DIR
        runtime_dir: Path = Path("/run/aithermd")
        sysfs_root: Path = Path("/sys")
        nvml: bool = True
        dry_run: bool = False
        bus: str = "system"
        metrics_listen: str = DEFAULT_METRICS_LISTEN
        log_format: Literal[LOG_FORMATS] = "auto"  # type: ignore[valid-type]
        log_level: Literal[LOG_LEVELS] = "info"  # type: ignore[valid-type]
        energy_interval_s: float = Field(5.0, ge=b["energy_interval_s"][0], le=b["energy_interval_s"][1])
        energy_top_n: int = Field(10, ge=b["energy_top_n"][0], le=b["energy_top_n"][1])
        energy_cost_per_kwh: float | None = Field(None, ge=b["energy_cost_per_kwh"][0])
        energy_currency: str = Field("", max_length=MAX_CURRENCY, pattern=CURRENCY.pattern)
        names: dict[str, str] = Field(default_factory=dict)

        _names = field_validator("names")(classmethod(lambda cls, v: check_names(v)))
        _interval = field_validator("energy_interval_s")(classmethod(lambda cls, v: check_interval(v)))
        _listen = field_validator("metrics_listen")(classmethod(lambda cls, v: check_listen(v)))
        _bus = field_validator("bus")(classmethod(lambda cls, v: check_bus(v)))

    assert set(DaemonSettingsModel.model_fields) == set(FIELDS)
    _models.append(DaemonSettingsModel)
    return DaemonSettingsModel


def errors_at_sources(exc: SettingsInvalid, config: Path | None, marks: Mapping[str, tuple[int, int]],
            file_data: Mapping[str, Any], later: Mapping[str, Any], flags: Mapping[str, Any]) -> PolicyErrors:
    """Each error at its source: the file (FILE:LINE:COL) unless the environment or a flag overrode the
    key, the flag (``--tick``), or the environment variable."""
    errors: list[PolicyError] = []
    for err in exc.errors:
        loc = err.get("loc") or ()
        key = ".".join(str(p) for p in loc) or None
        top = str(loc[0]) if loc else ""
        message = _in_words(err)
        hint = None
        if err.get("type") == "extra_forbidden":
            close = _closest(top, FIELDS)
            hint = f"did you mean {close!r}?" if close else None
        if config is not None and top in file_data and top not in later:
            line, col = marks.get(".".join(str(p) for p in loc[:2]), marks.get(top, (None, None)))
            errors.append(PolicyError(str(config), message, line=line, col=col, key=key, hint=hint))
        else:
            source = FLAG_NAMES.get(top, "--" + top.replace("_", "-")) if top in flags \
                else f"{ENV_PREFIX}{top.upper()}"
            errors.append(PolicyError(source, message, key=key, hint=hint))
    return PolicyErrors(errors)


def _closest(word: str, choices: Sequence[str]) -> str | None:
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
    if kind == "string_type":
        return f"must be text (got {shown})"
    if kind == "finite_number":
        return f"must be a finite number (got {shown})"
    if kind == "value_error":  # a validator's own sentence, without pydantic's "Value error, "
        return str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return str(err.get("msg", "invalid"))
