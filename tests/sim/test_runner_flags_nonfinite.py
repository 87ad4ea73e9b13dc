"""``--duration nan`` ran for ever and ``--speedup nan`` ran unpaced: non-finite values are usage errors."""

from __future__ import annotations

import argparse

import pytest

from aithermd.sim import runner


def args(**kw):
    base = dict(sim_duration_s=None, sim_speedup=1.0, sim_trace=None, sim_gpu_profiles=[], sim_seed=0,
                state_dir=None, sim_json=False)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize(("bad", "message"), [
    (dict(sim_duration_s=float("nan")), "--duration must be a finite number > 0 s, not nan"),
    (dict(sim_duration_s=float("inf")), "--duration must be a finite number > 0 s, not inf"),
    (dict(sim_speedup=float("nan")), "--speedup must be a finite number >= 0, not nan"),
    (dict(sim_speedup=float("inf")), "--speedup must be a finite number >= 0, not inf"),
])
def test_non_finite_duration_and_speedup_are_refused(bad, message):
    with pytest.raises(ValueError) as info:
        runner.options_from_args(args(**bad))
    assert str(info.value) == message


@pytest.mark.parametrize(("flags", "expect"), [
    (["--duration", "600"], dict(sim_duration_s=600.0)),
    (["--duration", "10m"], dict(sim_duration_s=600.0)),
    (["--duration", "1h30m"], dict(sim_duration_s=5400.0)),
    (["--duration", "1h0m5s"], dict(sim_duration_s=3605.0)),
    (["--duration", "1.5m"], dict(sim_duration_s=90.0)),
    (["--duration", "90s", "--stagger", "2m"], dict(sim_duration_s=90.0, sim_stagger_s=120.0)),
    (["--cycle", "2m,22m,2m"], dict(sim_cycle=(120.0, 1320.0, 120.0))),
    (["--cycle", "120,1320,120"], dict(sim_cycle=(120.0, 1320.0, 120.0))),
])
def test_simulation_durations_take_the_same_units_as_fault_times(flags, expect):
    from aithermd.cli import build_parser

    parsed = build_parser("run").parse_args(["run", "--simulate", *flags])
    assert {k: getattr(parsed, k) for k in expect} == expect


@pytest.mark.parametrize("flags", [["--duration", "10x"], ["--duration", "nan"], ["--duration", "-5"],
                                   ["--duration", "1m1h"], ["--duration", "10m5m"], ["--duration", "1h1h"],
                                   ["--duration", "\u0661\u0660"], ["--duration", "1h30"],
                                   ["--stagger", "1d"], ["--cycle", "1,2"], ["--cycle", "1m,0,1m"],
                                   ["--cycle", "1,inf,1"]])
def test_a_malformed_simulation_duration_is_a_usage_error_naming_the_form(flags, capsys):
    from aithermd.cli import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser("run").parse_args(["run", "--simulate", *flags])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flags[0]}" in err and ("10m" in err or "2m,22m,2m" in err)


@pytest.mark.parametrize("flags", [["--duration", "-5m"], ["--stagger", "-1m"], ["--cycle", "-1,2,3"],
                                   ["--duration", "-.5"]])
def test_a_negative_duration_is_refused_by_its_own_check_not_taken_for_an_option(flags, capsys):
    from aithermd.cli import main

    with pytest.raises(SystemExit) as info:
        main(["run", "--simulate", *flags])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flags[0]}: '{flags[1]}'" in err and "expected one argument" not in err


def test_tokens_after_a_double_dash_are_not_joined():
    from aithermd.cli import join_negative_values

    assert join_negative_values(["run", "--duration", "-5m", "--", "--x", "-1"]) == \
        ["run", "--duration=-5m", "--", "--x", "-1"]
    assert join_negative_values(["--duration=-5m", "-5"]) == ["--duration=-5m", "-5"]
