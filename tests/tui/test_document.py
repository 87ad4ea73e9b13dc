"""The snapshot document turned into what people look at: GPU cards, CPU packages, board fans."""

from conftest import load

from aithermctl.document import all_knobs, board_fans, cpu_packages, fmt, overview, reason_of, rule_of


def test_gpu_cards_carry_temperature_power_limit_fans_reasons_and_rule(snapshot_doc):
    gpu0, gpu1 = overview(snapshot_doc).gpus
    assert (gpu0.id, gpu0.name) == ("gpu0", "NVIDIA GeForce RTX 4090")
    assert (gpu0.temp_c, gpu0.slowdown_c, gpu0.power_w, gpu0.util_pct) == (71.0, 88.0, 498.3, 99.0)
    assert (gpu0.limit_w, gpu0.limit_min_w, gpu0.limit_max_w, gpu0.default_w) == (520.0, 150.0, 600.0, 450.0)
    assert [(f.id, f.pct) for f in gpu0.fans] == [("gpu0/fan0", 62.0), ("gpu0/fan1", 62.0)]
    assert gpu0.reasons == ("sw_power_cap",)
    assert gpu0.rule == "ai-training/raise-under-load"
    assert gpu0.reason.startswith("gpu0 utilization ≥ 90 %")
    assert gpu0.problems == ()  # not_supported memory temperature is a capability, not a problem
    assert (gpu1.limit_w, gpu1.rule, gpu1.reasons) == (200.0, "ai-training/relax-when-idle", ("idle",))


def test_cpu_package_power_against_pl1_pl2_with_coretemp_package_temperature(snapshot_doc):
    (pkg,) = cpu_packages(snapshot_doc)  # powercap:dram is a zone, not a package
    assert (pkg.id, pkg.power_w, pkg.pl1_w, pkg.pl2_w, pkg.temp_c) == ("powercap:package-0", 87.4, 125.0,
                                                                      241.0, 64.0)


def test_cpu_package_temperature_falls_back_to_k10temp_tctl(snapshot_doc):
    for device in snapshot_doc["devices"]:
        if device["id"] == "hwmon:coretemp-isa-0000":
            device["chip"], device["channels"][0]["label"] = "k10temp-pci-00c3", "Tctl"
    assert cpu_packages(snapshot_doc)[0].temp_c == 64.0


def test_board_fans_pair_fanN_with_pwmN_and_name_their_source(snapshot_doc):
    fans = {f.id.rsplit("/", 1)[1]: f for f in board_fans(snapshot_doc)}
    assert list(fans) == ["fan1", "fan2", "fan3", "fan4", "fan5"]
    assert (fans["fan1"].rpm, fans["fan1"].duty_pct, fans["fan1"].source) == (678.0, 40.0,
                                                                              "ai-training/case-fans")
    assert fans["fan3"].source == "firmware"  # a writable pwm nobody drives
    assert fans["fan4"].source == "firmware (read-only)"
    assert (fans["fan5"].knob_id, fans["fan5"].source) == (None, "firmware (no pwm)")


def test_failed_fan_reading_keeps_its_status():
    fans = {f.id: f for f in board_fans(load("snapshot_nogpu.json"))}
    assert fans["hwmon:nct6798-isa-0290/fan2"].status == "failed"
    assert fans["hwmon:nct6798-isa-0290/fan2"].rpm is None
    assert overview(load("snapshot_nogpu.json")).gpus == ()


def test_rule_comes_from_the_rule_member_or_the_reason_prefix():
    assert rule_of({"rule": "quiet/caps", "reason": "x"}) == "quiet/caps"
    assert rule_of({"reason": "balanced/idle: gpu0 idle for 300 s"}) == "balanced/idle"
    assert rule_of({"reason": "auto (driver)"}) == ""
    assert rule_of(None) == ""
    assert reason_of({"reason": "balanced/idle: gpu0 idle"}) == "gpu0 idle"


def test_holds_and_policy_in_overview(snapshot_doc):
    ov = overview(snapshot_doc)
    assert ov.active_policy == "ai-training"
    assert [h["cookie"] for h in ov.holds] == [17]
    assert ov.states == {"ai-training": {"gpu0": "training", "gpu1": "idle"}}
    assert "powercap:package-0/pl1" in all_knobs(snapshot_doc)


def test_fmt():
    assert fmt(71.04, "°C") == "71 °C"
    assert fmt(62.0, "%") == "62%"
    assert fmt(None, "W") == "—"
    assert fmt(87.44, "W", 1) == "87.4 W"
