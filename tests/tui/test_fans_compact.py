"""The overview's compact fan panel (80×24 with two GPU cards): one fan whose source is spelled out
(``firmware (no pwm)``) made every cell as wide as its line, so the fans went one a line and pwm6 fell off
a 24-row screen. Each column is now as wide as its own widest entry."""

from __future__ import annotations

from aithermctl.document import BoardFanView
from aithermctl.widgets.fans import compact_layout, fans_text


def _fan(n: int, source: str = "board-fans", status: str = "ok", rpm: float | None = 800.0) -> BoardFanView:
    return BoardFanView(f"hwmon:nct6798-isa-0290/fan{n}", f"nct6798-isa-0290 fan{n}", rpm, 41.0, None, source,
                        status)


def test_a_long_source_widens_its_own_column_only():
    fans = [_fan(1), _fan(2), _fan(3), _fan(4), _fan(5), _fan(6, source="firmware (no pwm)", rpm=0.0),
            _fan(7, status="empty"), _fan(8, status="empty"),
            BoardFanView("gpu0/fan0", "gpu0 fan0", 1200.0, 34.0, "gpu0/fan0", "gpu-fans", "ok")]
    entries, widths = compact_layout(fans, 76)
    assert len(entries) == 8, "the GPU fan is on its card"
    assert len(widths) == 2 and sum(widths) + 3 <= 76
    lines = fans_text(fans, 76, compact=True).plain.splitlines()
    assert len(lines) == 4 and all(len(line) <= 76 for line in lines)
    assert lines[2] == "nct6798 fan5 800 RPM  41%   nct6798 fan6   0 RPM  41% firmware (no pwm)"
    assert [n for n in range(1, 9) if f"fan{n} " in " ".join(lines)] == list(range(1, 9))


def test_as_many_columns_as_fit():
    fans = [_fan(n) for n in range(1, 7)]
    assert compact_layout(fans, 80)[1] == [25, 25]  # 3 × 25 + 2 gaps of 3 = 81 > 80
    assert compact_layout(fans, 81)[1] == [25, 25, 25]
    assert len(fans_text(fans, 81, compact=True).plain.splitlines()) == 2
