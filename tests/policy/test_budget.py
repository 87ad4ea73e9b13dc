"""The node power budget through the real engine: who is charged what, what it writes, how explain reads.

A small plant stands in for the machine: each GPU draws min(its job's demand, its limit), the CPU package
min(its demand, PL1); the limits the engine decides are "written" at once."""

from dataclasses import replace

import pytest

from aithermd.model import Layer
from aithermd.policy.engine import evaluate, initial_state
from aithermd.policy.loader import load_policy_text
from aithermd.policy.power_budget import devices_budget_w
from aithermd.policy.schema_machine import Budget
from tests.policy.machines import PKG, gpu, tick, workstation

RAISE = """
rules:
  - {name: up, kind: gpu_power_limit, limit: max}
"""


def policy(text: str, name: str = "b"):
    return load_policy_text(text, name=name)


class Plant:
    def __init__(self, n: int, demand_w: float = 500.0, cpu_demand_w: float = 90.0) -> None:
        self.devices = workstation(n)
        self.n = n
        self.limits = {f"gpu{i}/power_limit": 450.0 for i in range(n)}
        self.limits.update({f"{PKG}/pl1": 125.0, f"{PKG}/pl2": 180.0})
        self.demand = [demand_w] * n
        self.cpu_demand = cpu_demand_w
        self.state = initial_state()
        self.t = 0.0
        self.result = None

    def in_force(self) -> float:
        return sum(self.limits[f"gpu{i}/power_limit"] for i in range(self.n)) + \
            max(self.limits[f"{PKG}/pl1"], self.limits[f"{PKG}/pl2"])

    def step(self, pol, *, holds=(), overrides=None, t_wall=None):
        vals = {}
        for i in range(self.n):
            busy = self.demand[i] > 50
            vals[f"gpu{i}/power"] = min(self.demand[i], self.limits[f"gpu{i}/power_limit"])
            vals[f"gpu{i}/utilization"] = 98.0 if busy else 0.0
            vals[f"gpu{i}/temperature"] = 60.0
        vals[f"{PKG}/power"] = min(self.cpu_demand, self.limits[f"{PKG}/pl1"])
        vals["cpu/utilization"] = 40.0
        inp = tick(self.devices, self.t, vals, knobs=self.limits, t_wall=t_wall)
        self.result = evaluate(pol, holds, inp, self.state, overrides or {})
        self.state = self.result.state
        writable = {k.id for d in self.devices for k in d.knobs if k.writable}
        for k in self.limits:
            d = self.result.decisions.get(k)
            if d is not None and d.value is not None and k in writable:
                self.limits[k] = d.value
        self.t += 1.0
        return self.result


def test_wall_budget_is_the_psu_output_it_allows_less_the_rest_of_the_machine():
    assert devices_budget_w(Budget(wall_w=1500, psu_efficiency=0.92, other_w=75))[0] == pytest.approx(1305.0)
    curve = Budget(wall_w=1440, psu_efficiency=[[20, 0.90], [50, 0.92], [100, 0.89]], psu_rated_w=1600, other_w=75)
    dc, how = devices_budget_w(curve)
    # at ~1280 W DC (80 % load) the curve gives ~0.902, but 100 % load's 0.89 is the lowest from there up
    assert dc == pytest.approx(1440 * 0.89 - 75, abs=0.5) and "0.89" in how
    rated = Budget(wall_w=3000, psu_efficiency=0.94, psu_rated_w=1600, other_w=100)
    assert devices_budget_w(rated)[0] == pytest.approx(1500.0)


def test_the_limits_in_force_stay_within_the_budget_and_idle_gpus_give_theirs_back():
    pol = policy("budget: {wall_w: 1500, psu_efficiency: 0.92, other_w: 75}\n" + RAISE)
    plant = Plant(4)
    for _ in range(30):
        plant.step(pol)
        assert plant.in_force() <= 1305.0
    busy_before = plant.limits["gpu0/power_limit"]
    plant.demand[3] = 25.0  # its job ended
    for _ in range(30):
        plant.step(pol)
        assert plant.in_force() <= 1305.0
    assert plant.limits["gpu3/power_limit"] == 150.0  # its minimum: 3 × 25 W is less
    assert plant.limits["gpu0/power_limit"] >= busy_before + 40  # the others took what it gave back


def test_explain_says_how_the_budget_was_split():
    pol = policy("budget: {wall_w: 1500, psu_efficiency: 0.92, other_w: 75}\n" + RAISE)
    plant = Plant(2)
    for _ in range(12):
        r = plant.step(pol)
    d = r.decisions["gpu0/power_limit"]
    assert d.rule == "b/budget" and d.layer == Layer.POLICY
    assert d.reason.startswith("budget 1305 W (1500 W at the wall × 0.92 efficiency − 75 W for the rest of the "
                               "machine = 1305 W): gpu0 busy")
    assert d.inputs["ask_w"] == 600.0 and set(d.inputs["split_w"]) == {"gpu0", "gpu1", PKG}
    assert sum(d.inputs["split_w"].values()) <= 1305.0
    assert r.budget["budget_w"] == 1305.0 and r.budget["devices"]["gpu1"]["state"] == "busy"


def test_an_ample_budget_changes_nothing_a_rule_asks():
    pol = policy("budget: {devices_w: 5000}\n" + RAISE)
    plant = Plant(2)
    for _ in range(5):
        plant.step(pol)
    assert plant.limits["gpu0/power_limit"] == plant.limits["gpu1/power_limit"] == 600.0
    assert (plant.limits[f"{PKG}/pl1"], plant.limits[f"{PKG}/pl2"]) == (125.0, 180.0)


def test_a_knob_no_rule_decides_keeps_the_limit_it_was_found_at_as_its_ask():
    pol = policy("budget: {devices_w: 5000}\nrules: []\n")
    plant = Plant(2)
    plant.limits["gpu1/power_limit"] = 320.0
    for _ in range(3):
        plant.step(pol)
    assert plant.limits["gpu1/power_limit"] == 320.0  # never raised above what it was found at


def test_the_cpu_package_gives_pl2_its_share_and_pl1_no_more():
    pol = policy("budget: {devices_w: 700}\n" + RAISE)
    plant = Plant(2)
    for _ in range(12):
        plant.step(pol)
    pl1, pl2 = plant.limits[f"{PKG}/pl1"], plant.limits[f"{PKG}/pl2"]
    assert pl1 <= pl2 < 180.0 and plant.in_force() <= 700.0


def test_without_cpu_the_package_is_charged_at_its_pl2_and_left_alone():
    pol = policy("budget: {devices_w: 1000, cpu: false}\n" + RAISE)
    plant = Plant(2)
    for _ in range(12):
        r = plant.step(pol)
    assert (plant.limits[f"{PKG}/pl1"], plant.limits[f"{PKG}/pl2"]) == (125.0, 180.0)
    assert r.budget["devices"][PKG]["state"] == "fixed" and plant.in_force() <= 1000.0


def test_an_operator_override_is_charged_and_the_others_share_the_rest():
    pol = policy("budget: {devices_w: 1000, cpu: false}\n" + RAISE)
    plant = Plant(2)
    for _ in range(12):
        plant.step(pol, overrides={"gpu0/power_limit": 550.0})
    assert plant.limits["gpu0/power_limit"] == 550.0
    assert plant.limits["gpu1/power_limit"] == 1000.0 - 180.0 - 550.0


def test_a_gpu_that_cannot_be_written_is_charged_at_its_limit():
    pol = policy("budget: {devices_w: 1000, cpu: false}\n" + RAISE)
    plant = Plant(2)
    plant.devices = (replace(gpu(0), knobs=tuple(replace(k, writable=False) if k.kind == "power_limit" else k
                                                   for k in gpu(0).knobs)), *plant.devices[1:])
    for _ in range(12):
        r = plant.step(pol)
    assert "gpu0/power_limit" not in r.decisions or r.decisions["gpu0/power_limit"].rule != "b/budget"
    assert r.budget["devices"]["gpu0"]["state"] == "fixed"
    assert plant.limits["gpu1/power_limit"] == 1000.0 - 180.0 - 450.0


def test_a_hold_with_a_budget_overrides_the_active_policys():
    active = policy("budget: {devices_w: 3000}\n" + RAISE, "active")
    held = policy("budget: {devices_w: 900}\nrules: []\n", "held")
    plant = Plant(2)
    for _ in range(12):
        r = plant.step(active, holds=(held,))
    assert r.budget["policy"] == "held" and plant.in_force() <= 900.0


def test_a_budget_switches_with_its_schedule():
    pol = policy("""
timezone: Europe/Berlin
schedules:
  night: [{from: "22:00", to: "07:00"}]
budget:
  - {when: {schedule: night}, devices_w: 800}
  - {devices_w: 1400}
""" + RAISE)
    plant = Plant(2)
    noon, midnight = 1_767_265_200.0, 1_767_308_400.0  # 2026-01-01 12:00 and 2026-01-02 00:00 in Berlin
    plant.step(pol, t_wall=noon)
    assert plant.result.budget["budget_w"] == 1400.0
    plant.step(pol, t_wall=midnight)
    assert plant.result.budget["budget_w"] == 800.0


def test_a_budget_whose_when_does_not_hold_decides_nothing():
    pol = policy("""
schedules:
  never: [{days: [holiday], from: "00:00", to: "00:01"}]
budget: {when: {schedule: never}, devices_w: 500}
""" + RAISE)
    plant = Plant(2)
    r = plant.step(pol)
    assert not r.budget and r.decisions["gpu0/power_limit"].value == 600.0


def test_a_budget_below_the_devices_lowest_limits_holds_each_at_its_minimum_and_says_it_cannot_hold():
    from aithermd.policy.devicecheck import check_devices

    pol = policy("budget: {devices_w: 300}\n" + RAISE)  # 2 × 150 W GPU minimum + 45 W CPU = 345 W
    plant = Plant(2)
    for _ in range(3):
        r = plant.step(pol)
    assert [plant.limits[f"gpu{i}/power_limit"] for i in range(2)] == [150.0, 150.0]
    assert plant.limits[f"{PKG}/pl2"] == 45.0 and r.budget["short_w"] == 45.0
    assert "the budget is 45 W below the lowest limits of its devices (345 W)" in r.decisions["gpu0/power_limit"].reason
    (err,) = check_devices(pol, plant.devices)
    assert "budget.devices_w: gives the devices 300 W, below the sum of their lowest limits (345 W: gpu0 150 W, " \
           f"gpu1 150 W, {PKG} 45 W): it can never hold" in err.format()
    assert check_devices(policy("budget: {devices_w: 345}\n" + RAISE), plant.devices) == []
    ample = plant.step(policy("budget: {devices_w: 400}\n" + RAISE))
    assert "short_w" not in ample.budget


@pytest.mark.parametrize(("text", "expected"), [
    ("budget:\n  wall_w: 1440\n  psu_efficiency: [[20, 1.5]]\n",
     ["b.yaml:3:25: error: budget.psu_efficiency[0][1]: should be less than or equal to 1"]),
    ("budget:\n  - wall_w: 1440\n    othr_w: 50\n",
     ["b.yaml:3:5: error: budget[0].othr_w: unknown key (hint: did you mean 'other_w'?)"]),
    ("budget:\n  wall_w: 100\n  other_w: 500\n",
     ["b.yaml:2:3: error: budget: 100 W at the wall × 0.9 efficiency − 500 W for the rest of the machine = 0 W: "
      "nothing is left for the GPUs and CPU packages; raise wall_w or lower other_w"]),
    ("quiet:\n  fans:\n    - {fans: {chip: nct6798}, max_duty_pct: 140}\n",
     ["b.yaml:3:45: error: quiet.fans[0].max_duty_pct: should be less than or equal to 100"]),
])
def test_a_broken_budget_or_quiet_block_is_one_error_at_its_key(text, expected):
    """`budget` and `quiet` take one block or a list: each error was reported for both shapes, under
    pydantic's internal names (`budget.function-after[_shape(), Budget]: ...`), all at the block's first
    line; a budget that leaves the devices nothing passed `check` and held every device at its minimum."""
    from aithermd.errors import PolicyErrors

    with pytest.raises(PolicyErrors) as info:
        load_policy_text(text, name="b", path="b.yaml")
    assert [e.format() for e in info.value.errors] == expected
