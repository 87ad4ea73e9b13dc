"""Random YAML and random snapshots: no unhandled exception, and every value within its knob's limits."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from aithermd.errors import PolicyError, PolicyErrors
from aithermd.model import Status
from aithermd.policy.engine import evaluate, initial_state
from aithermd.policy.loader import load_policies, load_policy_file, load_policy_text
from aithermd.policy.schema import CONDITION_TAGS, METRICS
from tests.policy.machines import datacenter_gpu, gpu, k10temp, nct, rapl, tick, workstation

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["description", "safety", "margin_c", "curves", "machines", "rules", "name", "kind", "limit", "gpus",
         "when", "states", "enter", "exit", "min_dwell_s", "per", "points", "source", "fans", "curve", "duty_pct",
         "gpu_power_limit", "cpu_power_limit", "fan", "mix", "pid", "max", "min", "mean", "window_s",
         "sustain_s", "stat", "above", "below", "sensor", "schedule", "from", "to", "days", "pl1_w", "zones",
         "index", "model", "uuid", "chip", "label", "id", "default", "80%", "Tctl", "load.busy",
         *CONDITION_TAGS, *METRICS]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(WORDS), st.text(max_size=12))
keys = st.one_of(st.sampled_from(WORDS), st.text(min_size=1, max_size=8))
trees = st.recursive(scalars, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)), max_leaves=25)


def dump(tree) -> str:
    buf = io.StringIO()
    YAML().dump(tree, buf)
    return buf.getvalue()


def _check_outcome(text: str) -> None:
    try:
        policy = load_policy_text(text, name="fuzz")
    except PolicyErrors as exc:
        assert exc.errors and all(isinstance(e, PolicyError) and e.message for e in exc.errors)
        return
    devices = workstation(2)
    state = initial_state()
    for t in range(3):
        state = evaluate(policy, (), tick(devices, float(t), {"gpu0/utilization": 50.0}), state).state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys, trees, max_size=6))
def test_random_yaml_documents_validate_or_fail_cleanly(tree):
    _check_outcome(dump(tree))


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_random_text_validates_or_fails_cleanly(text):
    _check_outcome(text)


POLICIES = [*load_policies([ROOT / "policies"]).values(),
            *(load_policy_file(p) for p in sorted((ROOT / "tests/fixtures/policies/valid").glob("*.yaml")))]
DEVICES = (gpu(0), gpu(1, fans=2), datacenter_gpu(2), nct(), k10temp(crit=95.0), rapl(),
           *[d for d in workstation(0) if d.id == "cpu"])
CHANNELS = [c.id for d in DEVICES for c in d.channels]
KNOBS = {k.id: k for d in DEVICES for k in d.knobs}

values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-50, 150),
                   st.sampled_from(list(Status)), st.none())
ticks = st.lists(st.tuples(st.floats(0.0, 400.0), st.dictionaries(st.sampled_from(CHANNELS), values),
                           st.dictionaries(st.sampled_from(list(KNOBS)), st.floats(-10, 1000))),
                 min_size=1, max_size=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(POLICIES))), st.lists(st.sampled_from(range(len(POLICIES))), max_size=2), ticks,
       st.dictionaries(st.sampled_from(list(KNOBS) + ["gpu7/power_limit"]), st.floats(allow_nan=True)),
       st.frozensets(st.sampled_from(["torchrun", "python3 -m torch.distributed.run x", "bash"])))
def test_random_snapshots_never_crash_and_stay_in_limits(active, holds, series, overrides, procs):
    state = initial_state()
    t = 0.0
    for step, vals, knob_values in series:
        t += step
        res = evaluate(POLICIES[active], [POLICIES[h] for h in holds],
                       tick(DEVICES, t, vals, knobs=knob_values, processes=procs), state, overrides)
        state = res.state
        for knob_id, d in res.decisions.items():
            knob = KNOBS[knob_id]
            assert d.value is not None and d.value == d.value
            assert (knob.min is None or d.value >= knob.min) and (knob.max is None or d.value <= knob.max)


def _plain_docs():
    yaml = YAML(typ="safe")
    return [yaml.load(p.read_text()) for p in sorted((ROOT / "policies").glob("*.yaml"))
            + sorted((ROOT / "tests/fixtures/policies/valid").glob("*.yaml"))]


DOCS = _plain_docs()


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _replace(node, path, value):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {k: (_replace(v, rest, value) if k == head else v) for k, v in node.items()}
    return [(_replace(v, rest, value) if i == head else v) for i, v in enumerate(node)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_real_policies_validate_or_fail_cleanly(data):
    doc = data.draw(st.sampled_from(DOCS))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        path = data.draw(st.sampled_from(paths[1:]))
        doc = _replace(doc, path, data.draw(trees))
    _check_outcome(dump(doc))
