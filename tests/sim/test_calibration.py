"""The simulator's calibration against the measurements it was fitted on (aithermd/sim/CALIBRATION.md).

The fit itself runs offline (``scripts/fit-sim-law``, numpy/scipy); these tests recompute, in plain Python,
what the shipped constants claim: each job's own (λ, s) is the best for its sweep, the global constants are
a minimum of the pooled loss, the held-out error is what the docs say, the law answers the measured
slowdown and work-per-joule gain, and the thermal constants reproduce the recorded temperatures.
"""

import math
import statistics
from pathlib import Path

import pytest

from aithermd.policy.trace import parse_trace, read_trace_text
from aithermd.sim import law, law_fit, zeus
from aithermd.sim.gpu_sim import SimGpu, step_card
from aithermd.sim.jobs import TRAINING, Job
from aithermd.sim.profiles import shipped_profiles
from aithermd.sim.workload import GpuLoad

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SWEEPS = zeus.load(FIXTURES / "zeus-power-limit")
BINDING = [s for s in SWEEPS if s.binds]


def lam_loss(sw, lam):
    return sum(abs(law.throughput_ratio(u, lam) - r)
               for x, u, r in zip(sw.x, sw.u, sw.r, strict=True) if x < 1.5)


def s_loss(sw, s):
    return sum(abs(law.drawn_ratio(x, s) - u) for x, u in zip(sw.x, sw.u, strict=True) if 0.6 <= x < 1.5)


def test_the_sweeps_load_as_documented():
    assert len(SWEEPS) == 173 and len(BINDING) == 119
    assert sum(s.held_out for s in BINDING) == 32
    by_key = {s.key: s for s in SWEEPS}
    sw = by_key["a40/cifar100/shufflenetv2/1024/adadelta"]
    assert sw.limits_w[0] == 100 and sw.max_limit_w == 300
    # the own draw is the median over the limits that cannot bind (≥ 1.25 × the top draw: 275 and 300 W)
    assert sw.draw_w == pytest.approx(statistics.median([216.883170103347, 218.86556488095516]))
    assert sw.r[-1] == pytest.approx(statistics.median([8.605, 8.525000000000002]) / 8.525000000000002)


def test_each_jobs_lambda_and_s_are_its_own_best_fit():
    table = {key: (lam, s) for key, lam, s, _d, _h in law_fit.JOBS}
    assert set(table) == {s.key for s in BINDING}
    for sw in BINDING:
        lam, s = table[sw.key]
        assert lam == pytest.approx(zeus.best_1d(lambda v, sw=sw: lam_loss(sw, v), 0.0, 5.0), abs=2e-3)
        assert s == pytest.approx(zeus.best_1d(lambda v, sw=sw: s_loss(sw, v), 0.4, 1.3), abs=2e-3)


def test_the_global_constants_are_a_minimum_of_the_pooled_loss(monkeypatch):
    train = [s for s in BINDING if not s.held_out]
    points = [(u, r) for sw in train for x, u, r in zip(sw.x, sw.u, sw.r, strict=True) if x < 1.5]

    def loss() -> float:
        return sum(abs(law.throughput_ratio(u, 1.0) - r) for u, r in points) / len(points)

    best = loss()
    for name in ("A", "U_KNEE", "B"):
        for factor in (0.9, 1.1):
            monkeypatch.setattr(law, name, getattr(law_fit, name) * factor)
            assert loss() > best, f"{name} × {factor} fits the fitted configurations better"
            monkeypatch.setattr(law, name, getattr(law_fit, name))


def test_the_held_out_error_is_the_documented_one():
    errors = []
    for sw in (s for s in BINDING if s.held_out):
        for x, r in zip(sw.x, sw.r, strict=True):
            if x < 1.3:
                errors.append(abs(law.throughput_ratio(law.drawn_ratio(x, law_fit.S_MEDIAN), 1.0) - r))
    rmse = math.sqrt(sum(e * e for e in errors) / len(errors))
    assert rmse == pytest.approx(law_fit.HELDOUT_RMSE_POPULATION, abs=2e-4)
    assert statistics.median(errors) == pytest.approx(law_fit.HELDOUT_MEDIAN_ABS_POPULATION, abs=2e-4)
    assert rmse < 0.08 and statistics.median(errors) < 0.025  # what CALIBRATION.md states


@pytest.mark.parametrize("x", [1.0, 0.9])
def test_the_law_answers_what_the_sweeps_measured(x):
    """A cap at the job's own draw: measured 2.5 % slower for +8.8 % work per joule (median); at 0.9 ×,
    5.2 % for +16.5 %. The law, over the same jobs, within a point of the slowdown and four points of the
    gain (it is conservative: its gain is lower)."""
    measured = zeus.measured_at(BINDING, x)
    model = law.population_at(x, law.fitted_jobs())
    assert model["slowdown_median"] == pytest.approx(measured["slowdown_median"], abs=0.01)
    assert measured["gain_median"] - 0.04 < model["gain_median"] <= measured["gain_median"]


def test_the_drawn_power_law_is_unbiased_near_the_own_draw_on_held_out_jobs():
    """The law's gain near the own draw falls short of the sweeps' (above) not because it draws too much
    power under a cap: on the held-out configurations, at the swept limits 0.85-1.15 × the own draw, its u
    is within half a point of the measured mean power (mean and median, each job's own s). The shortfall
    is in r: a few jobs it makes slower there than they were (CALIBRATION.md)."""
    table = {key: (lam, s) for key, lam, s, _d, _h in law_fit.JOBS}
    du, dr = [], []
    for sw in (s for s in BINDING if s.held_out):
        lam, s = table[sw.key]
        for x, u, r in zip(sw.x, sw.u, sw.r, strict=True):
            if 0.85 <= x < 1.15:
                um = law.drawn_ratio(x, s)
                du.append(um - u)
                dr.append(law.throughput_ratio(um, lam) - r)
    assert len(du) == 79
    assert abs(statistics.fmean(du)) < 0.005 and abs(statistics.median(du)) < 0.005
    assert statistics.fmean(dr) < -0.005 < statistics.median(dr) <= 0.0


def test_no_gain_above_the_own_draw():
    for job in law.fitted_jobs():
        for x in (2.0, 5.0):
            u, r = job.at_cap(x)
            assert u <= 1.0 and r <= 1.0 and r >= 0.995


def test_the_knee_at_deep_caps():
    job = law.JobLaw()
    slope = [(math.log(job.throughput(u2)) - math.log(job.throughput(u1))) / math.log(u2 / u1)
             for u1, u2 in ((0.85, 0.95), (0.45, 0.55))]
    assert slope[0] == pytest.approx(law_fit.A, rel=1e-6) and slope[1] == pytest.approx(law_fit.B, rel=1e-6)
    assert slope[1] > 4 * slope[0]


def _trace_columns(name):
    trace = parse_trace(read_trace_text(FIXTURES / "traces" / name), name)
    return [(s.t, s.gpus[0].values) for s in trace.samples]


def simulate_card(profile, rows, air_c=30.0):
    """One card driven by recorded (t, values) rows: demand = the trace's power.draw; returns the
    simulated (power, temperature) per row."""
    gpu = SimGpu.create(profile, profile.default_power_limit_w)
    job = Job(TRAINING, 0.7)
    out = []
    prev_t = rows[0][0]
    for t, v in rows:
        dt = max(1e-3, t - prev_t)
        prev_t = t
        busy = v["utilization.gpu"] > 0
        load = GpuLoad(v["utilization.gpu"], job if busy else None, draw_w=v["power.draw"])
        o, _ = step_card(gpu.params, gpu.cooling, gpu.card, load, limit_w=gpu.params.default_w, lock_mhz=None,
                         fan_duties=[None] * gpu.fans, case_duty_pct=40.0, air_c=air_c, dt_s=dt,
                         target_temp_c=profile.target_temp_c or 84.0)
        out.append((o.power_w, gpu.card.temp_c))
    return out


def test_demand_and_temperatures_follow_the_recorded_4090_training_trace():
    rows = _trace_columns("windows-training-padded-10min-idle.csv")
    sim = simulate_card(shipped_profiles()["rtx4090"], rows)
    busy = [(v, s) for (_t, v), s in zip(rows, sim, strict=True) if v["power.draw"] > 150]
    idle = [(v, s) for (t, v), s in zip(rows, sim, strict=True) if v["power.draw"] < 25 and t > 2000]
    # the demand is the trace's own draw: nothing binds at the 450 W default
    assert all(s[0] == pytest.approx(v["power.draw"], rel=0.01) for v, s in busy)
    recorded = statistics.median(v["temperature.gpu"] for v, _ in busy)
    simulated = statistics.median(s[1] for _, s in busy)
    assert abs(simulated - recorded) < 3.0, (simulated, recorded)
    idle_sim = statistics.median(s[1] for _, s in idle)
    assert abs(idle_sim - statistics.median(v["temperature.gpu"] for v, _ in idle)) < 4.0


def test_four_h100s_at_gpu_burn_run_near_the_recorded_59_to_65_c():
    h100 = shipped_profiles()["h100"]
    rows = [(float(t), {"utilization.gpu": 100.0, "power.draw": 630.0}) for t in range(1200)]
    sim = simulate_card(h100, rows, air_c=30.0)
    steady = [temp for _, temp in sim[-300:]]
    assert 56.0 < statistics.median(steady) < 66.0


def test_what_the_sweeps_allow_without_a_simulator():
    """CALIBRATION.md §1's table of static caps on the measured points alone (r / u is work per joule against
    the unbound run), on the 119 configurations a cap reaches."""
    def p95(v):
        return sorted(v)[min(len(v) - 1, int(0.95 * len(v)))]

    def nearest(s, x):
        i = min(range(len(s.x)), key=lambda i: abs(s.x[i] - x))
        return 1 / s.r[i] - 1, s.r[i] / s.u[i] - 1

    def best(s, budget):
        ok = [(1 / r - 1, r / u - 1) for r, u in zip(s.r, s.u, strict=True) if 1 / r - 1 <= budget]
        return max(ok, key=lambda p: p[1])

    rows = {"own": [nearest(s, 1.0) for s in BINDING], "1.05": [nearest(s, 1.05) for s in BINDING],
            "3": [best(s, 0.03) for s in BINDING], "5": [best(s, 0.05) for s in BINDING]}
    got = {k: (round(100 * statistics.median(a for a, _ in v), 1), round(100 * p95([a for a, _ in v]), 1),
               round(100 * statistics.median(g for _, g in v), 1)) for k, v in rows.items()}
    assert got == {"own": (2.6, 10.6, 10.0), "1.05": (1.6, 6.6, 6.6), "3": (1.7, 2.8, 7.1), "5": (3.0, 4.8, 13.0)}
