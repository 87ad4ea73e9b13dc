import pytest

from aithermctl.durations import format_duration, parse_duration, parse_value


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0),
                                               ("1.5h", 5400.0), ("7d", 604800.0), (" 30 S ", 30.0)])
def test_durations_people_type(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "-5", "5x", "0", "0s", "1e9999", "\u0661\u0660m"])
def test_bad_durations_are_refused_with_examples(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(("text", "value"), [("250", 250.0), ("250W", 250.0), ("60%", 60.0), ("72.5", 72.5),
                                             ("1500MHz", 1500.0), ("1500 mhz", 1500.0)])
def test_values(text, value):
    assert parse_value(text) == value


@pytest.mark.parametrize("text", ["", "fast", "1.5 GHz", "250 kHz", "nan"])
def test_bad_values(text):
    with pytest.raises(ValueError):
        parse_value(text)


def test_format_duration():
    assert [format_duration(s) for s in (4.25, 42, 95, 3725)] == ["4.2s", "42s", "1m 35s", "1h 02m"]
