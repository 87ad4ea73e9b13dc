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
