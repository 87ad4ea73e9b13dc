"""``aithermctl run --progress-regex``: the rate read from a job's own output, and the GPUs it runs on."""

import asyncio
import io

import pytest

from aithermctl import progress
from aithermctl.cli import build_parser


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_rate_group_is_steps_per_second_as_printed():
    meter = progress.RateMeter(r"(?P<rate>[\d.]+)it/s")
    meter.feed("Epoch 0:  41%|████      | 820/2000 [04:15<06:07,  3.21it/s, loss=2.31]")
    assert meter.rate == pytest.approx(3.21)
    meter.feed("a line that says nothing")
    assert meter.rate == pytest.approx(3.21)


@pytest.mark.parametrize("text", ["nan", "inf", "1e999", "-3", "", "."])
def test_what_is_no_finite_rate_is_ignored(text):
    for group in ("rate", "secs", "step"):
        meter = progress.RateMeter(rf"(?P<{group}>\S*) marker")
        meter.feed(f"{text} marker")
        assert meter.rate is None and not meter.fresh()


def test_a_job_gone_quiet_is_no_longer_fresh():
    clock = Clock()
    meter = progress.RateMeter(r"(?P<rate>[\d.]+)it/s", clock)
    meter.feed("3.21it/s")
    clock.t = progress.QUIET_S
    assert meter.fresh()
    meter.feed("no match here")
    clock.t = progress.QUIET_S + 0.5
    assert not meter.fresh() and meter.rate == pytest.approx(3.21)


def test_a_secs_group_is_seconds_per_step():
    meter = progress.RateMeter(r"(?P<secs>[\d.]+)s/it")
    meter.feed(" 12%|█▏        | 12/100 [00:30<03:40,  2.50s/it]")
    assert meter.rate == pytest.approx(0.4)


def test_a_counter_is_its_rise_over_the_window_and_a_new_epoch_starts_again():
    clock = Clock()
    meter = progress.RateMeter(r"step (\d+)", clock)
    for i in range(0, 60):
        clock.t = i * 0.5
        meter.feed(f"step {100 + 2 * i}/5000 loss 1.9")
    assert meter.rate == pytest.approx(4.0)  # 2 steps every 0.5 s
    clock.t += 0.5
    meter.feed("step 3/5000")  # the counter went back: a new epoch
    assert meter.rate == pytest.approx(4.0)  # kept until the new window spans a second
    for i in range(1, 5):
        clock.t += 0.5
        meter.feed(f"step {3 + i}/5000")
    assert meter.rate == pytest.approx(2.0)


def test_the_counter_window_slides():
    clock = Clock()
    meter = progress.RateMeter(r"(?P<step>\d+)/\d+", clock)
    for i in range(100):
        clock.t = float(i)
        meter.feed(f"{i * (1 if i < 50 else 3)}/100000")
    assert meter.rate == pytest.approx(3.0)  # only the last 20 s count


def test_tqdm_redraws_with_carriage_returns_count_as_lines():
    meter = progress.RateMeter(r"(?P<rate>[\d.]+)it/s")
    out = io.BytesIO()

    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(b"  1%| 1/100 [00:01<01:39, 1.00it/s]\r  2%| 2/100 [00:01<00:50, 1.9")
        reader.feed_data(b"6it/s]\r  3%| 3/100 [00:02<00:40, 2.42it/s]")
        reader.feed_eof()
        await progress.pump(reader, out, meter)

    asyncio.run(go())
    assert meter.rate == pytest.approx(2.42)
    assert out.getvalue().count(b"\r") == 2  # passed through unchanged


def test_the_gpus_a_job_runs_on():
    devices = [{"id": "gpu0", "kind": "gpu", "info": {"index": 0, "uuid": "GPU-aa"}},
               {"id": "gpu1", "kind": "gpu", "info": {"index": 1, "uuid": "GPU-bb"}},
               {"id": "cpu", "kind": "cpu", "info": {}}]
    assert progress.gpus_from_env({"CUDA_VISIBLE_DEVICES": "1"}, devices) == ["gpu1"]
    assert progress.gpus_from_env({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, devices) == ["gpu0", "gpu1"]
    assert progress.gpus_from_env({"CUDA_VISIBLE_DEVICES": "MIG-xyz"}, devices) is None
    assert progress.gpus_from_env({}, devices) is None
    doc = {"gpus": {"gpu0": {"processes": [{"pid": 4242}]}, "gpu1": {"processes": [{"pid": 1}]}}}
    assert progress.gpus_of_tree(4242, doc) == ["gpu0"]
    # not root, the job not tied to a GPU: the GPUs where this user's compute processes alone run, the
    # ones aithermd takes a report for (not every GPU, refused as a whole)
    doc = {"gpus": {"gpu0": {"processes": [{"pid": 7, "user": "ann", "kinds": "C"},
                                           {"pid": 8, "user": "you", "kinds": "G"}]},
                    "gpu1": {"processes": [{"pid": 9, "user": "ann", "kinds": "C"},
                                           {"pid": 10, "user": "bob", "kinds": "C"}]},
                    "gpu2": {"processes": [{"pid": 11, "user": "you", "kinds": "G"}]}}}
    assert progress.gpus_of_user(doc, "ann") == ["gpu0"]
    assert progress.gpus_of_user(doc, "you") == []


@pytest.mark.parametrize("regex", ["([", "it/s"])
def test_a_regex_that_cannot_read_a_rate_is_a_usage_error(regex, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", "--progress-regex", regex, "--", "true"])
    assert exc.value.code == 2
    assert "--progress-regex" in capsys.readouterr().err
