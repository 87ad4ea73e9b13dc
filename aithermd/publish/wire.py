"""D-Bus names, signatures and error names of ``io.github.aithermd.Daemon1``.

Dependency-free on purpose: ``aithermctl`` imports this module (and only this one) from the daemon's
package. Documents travel as JSON strings (signature ``s``); their shapes are described here.
"""

from __future__ import annotations

BUS_NAME = "io.github.aithermd.Daemon1"
OBJECT_PATH = "/io/github/aithermd/Daemon1"
INTERFACE = "io.github.aithermd.Daemon1"

# polkit actions, one per privileged method family
ACTION_SET_POLICY = "io.github.aithermd.set-policy"
ACTION_HOLD_POLICY = "io.github.aithermd.hold-policy"
ACTION_OVERRIDE = "io.github.aithermd.override"
ACTION_RELOAD = "io.github.aithermd.reload"

# D-Bus error names
ERROR_PREFIX = "io.github.aithermd.Error"
ERROR_NOT_AUTHORIZED = f"{ERROR_PREFIX}.NotAuthorized"
ERROR_UNKNOWN_KNOB = f"{ERROR_PREFIX}.UnknownKnob"
ERROR_UNKNOWN_POLICY = f"{ERROR_PREFIX}.UnknownPolicy"
ERROR_OUT_OF_RANGE = f"{ERROR_PREFIX}.OutOfRange"
ERROR_INVALID_ARGUMENT = f"{ERROR_PREFIX}.InvalidArgument"
ERROR_UNKNOWN_COOKIE = f"{ERROR_PREFIX}.UnknownCookie"
ERROR_UNKNOWN_WINDOW = f"{ERROR_PREFIX}.UnknownWindow"
ERROR_WRONG_WINDOW = f"{ERROR_PREFIX}.WrongWindow"
ERROR_LIMIT_EXCEEDED = f"{ERROR_PREFIX}.LimitExceeded"
ERROR_POLICY_INVALID = f"{ERROR_PREFIX}.PolicyInvalid"
ERROR_BUSY = f"{ERROR_PREFIX}.Busy"

# Methods: name → (in signature, out signature). JSON documents are strings.
METHODS: dict[str, tuple[str, str]] = {
    # JSON: sensors document + per knob "requested", "reason"; "policy": {...}; "processes": the GetProcesses
    # document where the daemon accounts energy per process
    "GetSnapshot": ("", "s"),
    # seconds → JSON {"t": [wall s...], "series": {channel_or_knob_id: [v|null...]}, "units": {id: unit}}
    "GetHistory": ("d", "s"),
    "Explain": ("s", "s"),  # knob id ("" = all) → JSON {knob_id: {"value","requested","rule","reason","inputs"}}
    "ListPolicies": ("", "s"),  # JSON [{"name","path","description","active"}]
    # name → JSON {"name","path","source" (YAML text),"description","warnings" (what selects nothing here)}
    "GetPolicy": ("s", "s"),
    "StartEnergyWindow": ("sd", "t"),  # name, timeout_s (0 = one day) → window id
    "StopEnergyWindow": ("t", "s"),  # id → JSON {"id","name","duration_s","joules": {device_id: J},"total_j"}
    # name, timeout_s, scope ("job:N", "unit:NAME", "container:ID", "cgroup:/PATH", "pid:N", "") → window id
    "StartScopedEnergyWindow": ("sds", "t"),
    # id, name ("" = any; else it must match) → JSON as StopEnergyWindow + "scope","attributed","restarts"
    "StopEnergyWindowNamed": ("ts", "s"),
    "ListEnergyWindows": ("", "s"),  # JSON [window document so far], the caller's own (root: all)
    # JSON {"enabled","t_wall","interval_s","gpus": {gpuN: {"uuid","memory_used_bytes","memory_total_bytes",
    # "basis","idle_floor_w","processes_error","utilization_error","processes": [{"pid","user","command",
    # "comm","kinds","memory_bytes","sm_pct","watts","joules","visible","unit","job"?,"container"?}]}},
    # "processes": [{"pid","start","user","comm","command","alive","unit",...,"joules": {device: J},
    # "watts","basis","total_j"}], "groups": {"unit"|"job"|"container": {name: {device: J, "total_j",
    # "users"}}}, "devices": {device: {"total_j","idle_j","unattributed_j"}}}
    "GetProcesses": ("", "s"),
    # since (wall s), by ("unit"|"job"|"container"|"process"|"day") → JSON {"since","first_day","by",
    # "currency","cost_per_kwh","rows": [{"name","joules","total_j","kwh","cost"?,...}],"total","idle",
    # "unattributed"}
    "GetEnergyReport": ("ds", "s"),
    "SetActivePolicy": ("s", ""),
    "HoldPolicy": ("ssdb", "u"),  # policy, reason, timeout_s (0 = none), detached → cookie
    "ReleasePolicy": ("u", ""),
    "SetOverride": ("sdd", ""),  # knob id, value (daemon units), seconds (0 = until cleared)
    "ClearOverride": ("s", ""),
    "Reload": ("", ""),
}

# Properties (read-only): name → signature
PROPERTIES: dict[str, str] = {
    "Version": "s",
    "ActivePolicy": "s",
    "Holds": "s",  # JSON [{"cookie","policy","reason","owner","detached","expires","uid","created"}]
    "PolicyStates": "s",  # JSON {policy: {scope: state}}
    "DegradedDevices": "as",
    "DryRun": "b",
}

# Signals: name → signature
SIGNALS: dict[str, str] = {
    "SnapshotUpdated": "t",  # seq; rate-limited
    "Event": "ss",  # kind ("decision"|"drift"|"fault"|"hotplug"|...), JSON of the event
}

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3
EXIT_NOT_AUTHORIZED = 4
