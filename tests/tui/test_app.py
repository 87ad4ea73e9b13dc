"""Pilot tests of the TUI against a scripted fake client: what each screen shows, at 80×24 and wider,
how it follows new snapshots, reconnects, and how changes and their refusals are shown."""

import copy
import json
import time

from fake_client import FakeClient, load
from screen_text import screen_text
from textual.widgets import Checkbox, Input, Select, Static

from aithermctl import errors
from aithermctl.app import AithermApp
from aithermctl.screens.dialogs import HelpScreen, HoldDialog, OverrideDialog
from aithermctl.widgets.gpu_card import GpuCard
from aithermctl.widgets.trace_plot import TracePlot

FAST = {"retry_s": (0.01, 0.02), "poll_s": 60.0}


async def settle(pilot, n: int = 3) -> None:
    for _ in range(n):
        await pilot.pause()


async def test_overview_at_80x24_shows_gpu_cards_cpu_package_and_status_line():
    app = AithermApp(FakeClient(), **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        lines = text.splitlines()
        assert len(lines) == 24 and max(len(line) for line in lines) <= 80
        assert "● policy ai-training · in force: quiet (held, cookie 17)" in lines[0]
        assert "gpu0 · NVIDIA GeForce RTX 4090" in text
        assert "358/360 W" in text and "10–600 W" in text and "slowdown 85 °C" in text
        assert "fans 34%" in text
        assert "limit quiet/busy-limit  −90 W vs default" in text
        assert "clocks sw_power_cap" in text
        assert "gpu1 · NVIDIA RTX 6000 Ada Generation" in text and "slowdown 93 °C" in text
        assert "−60 W vs default" in text
        assert "package-0    70.1 W" in text and "PL1 95 W  PL2 119 W  50 °C" in text
        assert "q Quit" in lines[-1]


async def test_overview_at_80x24_shows_every_board_fan():
    """Two GPU cards, the CPU package and seven fans in 24 rows: the cards take two gauges a line, the fans
    several a line (the fifth fan and those after it were cut off)."""
    client = FakeClient()
    fans = [d for d in client.doc["devices"] for c in d["channels"] if c["attribute"].startswith("fan")
            and d["kind"] == "hwmon"]
    assert len(fans) == 7  # the recorded board's six nct6798 fans and the Radeon's
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        for n in range(1, 7):
            assert f"nct6798 fan{n} " in text
        assert "amdgpu fan1  833 RPM  40% firmware" in text  # its source differs from the title's
        assert "Fans · quiet/board-fans" in text
        assert "358/360 W" in text and "mem 19.8/24.0G" in text and "2 processes" in text
        assert "q Quit" in text.splitlines()[-1]


async def test_overview_at_140x40_plots_power_in_the_room_left():
    app = AithermApp(FakeClient(), **FAST)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot, 5)
        lines = screen_text(app).splitlines()
        assert not [i for i, line in enumerate(lines) if not line.strip()]  # no empty row
        trends = app.screen.query_one("#trends")
        assert [p.id for p in trends.query(TracePlot)] == ["plot-gpu0-power", "plot-gpu1-power",
                                                            "plot-powercap-package-0-power"]
        assert trends.region.bottom == 39  # down to the footer
        assert "nct6798-isa-0290 fan6  ! empty" in "\n".join(lines)  # the full fan table, one a line
        await pilot.resize_terminal(80, 24)
        await settle(pilot)
        assert not trends.display


async def test_every_screen_keeps_quit_in_the_footer_at_80_columns():
    """Keys a screen's own panels name (zoom, filter, activate, release, sort) stay out of the footer."""
    app = AithermApp(FakeClient(), **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        for key in ("2", "3", "4", "5", "1"):
            await pilot.press(key)
            await settle(pilot)
            assert screen_text(app).splitlines()[-1].rstrip().endswith("? Help q Quit"), key


async def test_board_fans_table_lists_speed_duty_and_source():
    app = AithermApp(FakeClient(), **FAST)
    async with app.run_test(size=(100, 50)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "nct6798-isa-0290 fan1  494 RPM  27%   quiet/board-fans" in text
        assert "amdgpu-pci-0700 fan1   833 RPM  40%   firmware" in text


async def test_new_snapshot_updates_the_card_and_a_vanished_gpu_loses_its_card():
    client = FakeClient()
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        doc = copy.deepcopy(client.doc)
        gpu0 = next(d for d in doc["devices"] if d["id"] == "gpu0")
        gpu0["channels"][0]["value"] = 83.0  # temperature
        gpu0["attrs"]["clock_event_reasons"] = ["sw_thermal_slowdown"]
        client.push(doc)
        await settle(pilot)
        text = screen_text(app)
        assert "83 °C" in text and "sw_thermal_slowdown" in text
        doc = copy.deepcopy(doc)
        doc["devices"] = [d for d in doc["devices"] if d["id"] != "gpu1"]
        client.push(doc)
        await settle(pilot)
        assert [c.view.id for c in app.screen.query(GpuCard)] == ["gpu0"]
        assert "gpu1 ·" not in screen_text(app)


async def test_no_gpu_machine_says_so_and_shows_a_failed_fan():
    app = AithermApp(FakeClient(load("snapshot_nogpu.json")), **FAST)
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "No GPU: the daemon sees no NVIDIA driver" in text
        assert "! failed" in text
        assert "degraded 1" in text.splitlines()[0]


async def test_resizing_puts_gpu_cards_side_by_side_when_wide():
    app = AithermApp(FakeClient(), **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        cards = list(app.screen.query(GpuCard))
        assert cards[0].region.y != cards[1].region.y
        await pilot.resize_terminal(140, 40)
        await settle(pilot)
        assert app.screen.query_one("#gpus").has_class("wide")
        cards = list(app.screen.query(GpuCard))
        assert cards[0].region.y == cards[1].region.y and cards[0].region.x < cards[1].region.x


async def test_plots_show_temperature_power_and_the_limit_from_history():
    app = AithermApp(FakeClient(), **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("2")
        await settle(pilot)
        plots = {p.id: p for p in app.screen.query(TracePlot)}
        assert set(plots) == {"plot-gpu0-temp", "plot-gpu0-power", "plot-gpu1-temp", "plot-gpu1-power",
                              "plot-powercap-package-0-power"}
        power = plots["plot-gpu0-power"]
        assert power.border_title.startswith("gpu0 power ") and "limit 360 W ━" in power.border_title
        assert power.border_subtitle.endswith("· 5 min · +/- zoom")
        assert "━" in screen_text(app)  # the limit line is drawn
        await pilot.press("minus")
        await settle(pilot)
        assert power.border_subtitle.endswith("· 10 min · +/- zoom")
        await pilot.press("plus", "plus", "plus")
        await settle(pilot)
        assert power.border_subtitle.endswith("· 1 min · +/- zoom")
        assert power.content_size.height == 5 and plots["plot-gpu0-temp"].region.y < power.region.y
        ids = [p.id for p in app.screen.query(TracePlot)]  # one a row: each GPU's plots together
        assert ids == ["plot-gpu0-temp", "plot-gpu0-power", "plot-gpu1-temp", "plot-gpu1-power",
                       "plot-powercap-package-0-power"]
        await pilot.resize_terminal(140, 40)  # wide and tall: a row per kind of plot, a column per GPU
        await settle(pilot)
        plots = {p.id: p for p in app.screen.query(TracePlot)}
        t0, t1, p0, p1 = (plots[f"plot-{g}-{k}"].region for k in ("temp", "power") for g in ("gpu0", "gpu1"))
        assert t0.y == t1.y and t0.x < t1.x  # the temperatures side by side
        assert p0.y == p1.y > t0.y and (p0.x, p1.x) == (t0.x, t1.x)  # the powers below, GPU under GPU
        for kind in ("util", "mem"):  # tall: utilization and memory, in the same columns
            u0, u1 = plots[f"plot-gpu0-{kind}"].region, plots[f"plot-gpu1-{kind}"].region
            assert u0.y == u1.y > p0.y and (u0.x, u1.x) == (t0.x, t1.x)
        ids = [p.id for p in app.screen.query(TracePlot)]
        assert ids.index("plot-powercap-package-0-power") == len(ids) - 1  # the CPU package last


async def test_policy_screen_shows_policies_holds_states_and_why():
    client = FakeClient()
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(100, 60)) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot, 5)
        text = screen_text(app)
        assert "active ai-training   in force quiet (held)" in text
        assert "balanced" in text and "Lower limits (60 % of the default idle" in text
        assert "17" in text and "meeting in the lab" in text
        hold_row = next(line for line in text.splitlines() if "meeting in the lab" in line)
        assert hold_row.split("│")[1].split()[-2:] == ["until", "released"]  # detached, no timeout
        assert "ai-training gpu0: training" in text and "quiet gpu1: busy" in text
        assert "gpu0/power_limit  quiet/busy-limit" in text
        assert ("list_policies", ()) in client.calls and ("explain", ("",)) in client.calls
        app.screen.query_one("#policies").focus()
        await pilot.press("down", "a")  # the second policy: balanced
        await settle(pilot)
        assert ("set_active_policy", ("balanced",)) in client.calls
        app.screen.query_one("#holds").focus()
        await pilot.press("r")
        await settle(pilot)
        assert ("release_policy", (17,)) in client.calls


def engine_inputs_3s_after_the_load_stopped() -> dict:
    """gpu0/power_limit's Explain inputs from the policy engine itself, 3 s after a GPU's load stopped: its
    busy state's exit window (every sample of 10 s below 10 %) has held 3 s of its 10 s."""
    from tests.policy.test_explain_progress import MACHINE, inputs_over

    inputs = inputs_over(MACHINE.replace("DWELL", "0"), [90.0] * 12 + [0.0] * 3)[-1]
    return json.loads(json.dumps(inputs))  # as Explain sends it


async def test_policy_screen_draws_the_engines_windows_as_they_come():
    """A window's progress (``{"elapsed_s", "need_s"}`` in the Explain inputs) is drawn as the engine
    computed it: the screen computes no time of its own."""
    client = FakeClient()
    client.explained = {"gpu0/power_limit": {
        "value": 600.0, "requested": 600.0, "layer": "policy", "rule": "t/busy", "reason": "gpu0 in load.busy",
        "inputs": engine_inputs_3s_after_the_load_stopped()}}
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(100, 60)) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot, 5)
        line = next(x for x in screen_text(app).splitlines() if "max_10s < 10 " in x)
        assert line.rstrip(" │").endswith(" 3.0s of 10s")
        client.explained["gpu0/power_limit"]["inputs"] = {"dwell:load": {"elapsed_s": 45, "need_s": 60}}
        app.refresh_policy_info()
        await settle(pilot, 5)
        assert "dwell:load" in screen_text(app) and "45s of 1m 00s" in screen_text(app)


async def test_events_screen_logs_signals_and_filters_by_kind():
    """The Event signals the daemon sent (fixtures/events.json): fan and power-limit actuations and
    decisions on the workstation, a failed fan on the board."""
    client = FakeClient()
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        for kind, event in load("events.json"):
            client.emit(kind, event)
        await pilot.press("4")
        await settle(pilot)
        text = screen_text(app)
        assert "gpu0/power_limit: 450 → 360 W (ai-training/idle-limit)" in text
        assert "gpu0 in load.idle: 80% of the default (360 W)" in text
        assert "curve board → 36 %" in text
        assert "hwmon:nct6798-isa-0290/fan2 failed: EIO: Input/output error" in text
        await pilot.press("f")  # all → limits: power limits only, no fan decisions
        await settle(pilot)
        text = screen_text(app)
        assert "Events (limits" in text and "gpu0/power_limit: 450 → 360 W" in text
        assert "gpu0 in load.idle: 80% of the default (360 W)" in text
        assert "failed: EIO" not in text and "pwm1" not in text and "curve board" not in text
        await pilot.press("f", "f", "f", "f")  # → actuation → decision → alarm → fault
        await settle(pilot)
        text = screen_text(app)
        assert "Events (fault" in text and "fan2 failed: EIO" in text and "gpu0/power_limit" not in text


async def test_reconnects_when_the_daemon_restarts():
    client = FakeClient()
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert screen_text(app).startswith(" ● policy")
        client.kill()
        await settle(pilot, 5)
        top = " ".join(line.strip() for line in screen_text(app).splitlines()[:2])
        assert "○ aithermd is not running on the system bus (start it: systemctl start aithermd)" in top
        # the last values stay on screen, marked stale with their time, and dimmed
        stamp = time.strftime("%H:%M:%S", time.localtime(app.state.doc["t_wall"]))
        assert f"STALE: values below are from {stamp}" in top and app.screen.has_class("stale")
        connects = client.connects
        await pilot.pause(0.1)
        assert client.connects > connects  # it keeps trying
        client.revive()
        await pilot.pause(0.1)
        await settle(pilot)
        assert screen_text(app).startswith(" ● policy") and not app.screen.has_class("stale")
        assert [m for k, e in app.state.events if k == "connection" for m in [e["message"]]][-1] == \
            "reconnected to aithermd"
        assert sum(1 for name, _ in client.calls if name == "get_history") >= 2  # plots re-seeded


async def test_override_dialog_sends_the_override():
    client = FakeClient()
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("v")
        await settle(pilot)
        dialog = app.screen
        assert isinstance(dialog, OverrideDialog)
        dialog.query_one("#knob", Select).value = "gpu0/power_limit"
        dialog.query_one("#value", Input).value = "400W"
        dialog.query_one("#for", Input).value = "15m"
        await pilot.click("#apply")
        await settle(pilot)
        assert ("set_override", ("gpu0/power_limit", 400.0, 900.0)) in client.calls
        assert not isinstance(app.screen, OverrideDialog)


async def test_override_refused_by_polkit_is_shown_plainly_in_the_dialog():
    client = FakeClient()
    client.refuse["set_override"] = errors.NotAuthorized("override a knob", "polkit said no",
                                                         "io.github.aithermd.override")
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("v")
        await settle(pilot)
        dialog = app.screen
        dialog.query_one("#knob", Select).value = "gpu0/power_limit"
        dialog.query_one("#value", Input).value = "400"
        await pilot.click("#apply")
        await settle(pilot)
        assert app.screen is dialog
        assert "not authorized to override a knob" in screen_text(app)
        assert str(dialog.query_one("#error", Static).content) == (
            "not authorized to override a knob: polkit said no (run it with sudo, or ask an administrator to "
            "allow io.github.aithermd.override in polkit)")


async def test_override_dialog_checks_input_before_asking():
    client = FakeClient()
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("v")
        await settle(pilot)
        await pilot.click("#apply")
        await settle(pilot)
        assert "choose a knob" in screen_text(app)
        app.screen.query_one("#knob", Select).value = "gpu0/power_limit"
        app.screen.query_one("#value", Input).value = "lots"
        await pilot.pause(0.3)  # a button ignores clicks while it shows the last one
        await pilot.click("#apply")
        await settle(pilot)
        assert "not a value: 'lots' (examples: 250, 250W, 60%, 1500MHz)" in screen_text(app)
        assert not [c for c in client.calls if c[0] == "set_override"]
        await pilot.pause(0.3)
        await pilot.click("#clear")
        await settle(pilot)
        assert ("clear_override", ("gpu0/power_limit",)) in client.calls


async def test_hold_dialog_holds_a_policy():
    client = FakeClient()
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot, 5)
        await pilot.press("h")
        await settle(pilot)
        dialog = app.screen
        assert isinstance(dialog, HoldDialog)
        dialog.query_one("#policy", Select).value = "quiet"
        dialog.query_one("#reason", Input).value = "meeting"
        dialog.query_one("#timeout", Input).value = "1h"
        dialog.query_one("#detached", Checkbox).value = True
        await pilot.click("#hold")
        await settle(pilot)
        assert ("hold_policy", ("quiet", "meeting", 3600.0, True)) in client.calls
        assert not isinstance(app.screen, HoldDialog)


async def test_hold_refused_by_polkit_is_shown_plainly_in_the_dialog():
    client = FakeClient()
    client.refuse["hold_policy"] = errors.NotAuthorized("hold a policy", "", "io.github.aithermd.hold-policy")
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("h")
        await settle(pilot)
        dialog = app.screen
        assert isinstance(dialog, HoldDialog)
        # opened from the overview, before the policy list was ever fetched: it arrives into the dialog
        dialog.query_one("#policy", Select).value = "quiet"  # raises if "quiet" is not offered
        dialog.query_one("#reason", Input).value = "meeting"
        await pilot.click("#hold")
        await settle(pilot)
        assert app.screen is dialog  # it stays open, with the refusal under the form
        assert str(dialog.query_one("#error", Static).content) == (
            "not authorized to hold a policy (run it with sudo, or ask an administrator to allow "
            "io.github.aithermd.hold-policy in polkit)")


async def test_activating_a_policy_refused_by_polkit_is_notified():
    client = FakeClient()
    client.refuse["set_active_policy"] = errors.NotAuthorized("change the active policy", "",
                                                              "io.github.aithermd.set-policy")
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot, 5)
        app.screen.query_one("#policies").focus()
        await pilot.press("down", "a")
        await settle(pilot, 5)
        assert ("set_active_policy", ("balanced",)) in client.calls
        assert [(n.title, n.severity) for n in app._notifications] == [("refused", "error")]
        assert "allow io.github.aithermd.set-policy in polkit" in list(app._notifications)[0].message


async def test_help_opens_and_closes():
    app = AithermApp(FakeClient(), **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        assert "override a knob, or clear an override" in screen_text(app)
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, HelpScreen)


async def test_reload_refusal_is_notified():
    client = FakeClient()
    client.refuse["reload"] = errors.DaemonError("policies/x.yaml:3: unknown key 'rulez'")
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+r")
        await settle(pilot, 5)
        assert [(n.title, n.message, n.severity) for n in app._notifications] == [
            ("refused", "policies/x.yaml:3: unknown key 'rulez'", "error")]


async def test_quitting_closes_the_client():
    client = FakeClient()
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("q")
    assert ("close", ()) in client.calls


async def test_before_the_first_snapshot_it_says_it_is_waiting():
    client = FakeClient()
    client.down = True
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, 5)
        text = screen_text(app)
        assert "○ aithermd is not running on the system bus" in text
        assert "Waiting for aithermd" in text and "CPU packages" not in text
        client.revive()
        await pilot.pause(0.1)
        await settle(pilot)
        assert "CPU packages" in screen_text(app) and "Waiting" not in screen_text(app)


def _with_processes(tmp_path):
    """The fixture snapshot plus the process document the real accounting produces (two jobs on gpu0)."""
    from tests.accounting.bench import Bench

    bench = Bench(tmp_path)
    energy = bench.start_daemon(None)
    bench.job(5001, 101, {0: 3.0}, memory_mib=9000)
    bench.job(5002, 102, {0: 1.0, 1: 1.0}, memory_mib=2000)
    for i in (0, 1):
        bench.util[i], bench.power[f"gpu{i}"] = 100.0, 400.0
    bench.run(10)
    doc = load("snapshot.json")
    doc["processes"] = json.loads(energy.processes_text())
    return doc, energy


async def test_gpu_cards_show_memory_and_the_processes_screen_sorts(tmp_path):
    doc, energy = _with_processes(tmp_path)
    client = FakeClient(doc)
    client.report = energy.report(0.0, "job")
    app = AithermApp(client, **FAST)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "mem 10.7/24.0G" in text and "2 processes" in text  # gpu0: 9000 + 2000 MiB and the driver's
        await pilot.press("5")
        await settle(pilot)
        text = screen_text(app)
        assert "gpu0 10.7 / 24.0 GiB (utilization)" in text
        rows = [line for line in text.splitlines() if "train.py" in line]
        assert "5001" in rows[0] and "75%" in rows[0] and "slurm:101" in rows[0]  # the most watts first
        assert "slurm:101" in text and "Energy today by job" in text
        await pilot.press("s")  # by energy so far
        await pilot.press("s")  # by GPU memory
        await settle(pilot)
        assert "sorted by memory" in screen_text(app)


async def test_a_snapshot_arriving_while_a_screen_is_half_built_or_torn_down_draws_nothing_and_raises_nothing():
    """Seen in CI: a snapshot arrived while the overview was mounted without its widgets (app shutting
    down), and the query for the status line raised NoMatches out of the message handler."""
    from aithermctl.widgets.status_line import StatusLine

    app = AithermApp(FakeClient(), **FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = app.screen
        await screen.query_one("#gpus").remove()  # the body half gone, the status line still there
        app._render()
        await screen.query_one(StatusLine).remove()  # nothing left to draw into
        app._render()
        assert screen.is_mounted and not screen.query(StatusLine)
