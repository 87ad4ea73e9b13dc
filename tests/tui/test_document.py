"""The snapshot document turned into what people look at: GPU cards, CPU packages, board fans."""

from fake_client import load

from aithermctl.document import all_knobs, board_fans, cpu_packages, fmt, overview, reason_of, rule_of


def _device(doc, device_id):
    return next(d for d in doc["devices"] if d["id"] == device_id)


def test_gpu_cards_carry_temperature_slowdown_power_limit_fans_reasons_and_rule(snapshot_doc):
    gpu0, gpu1 = overview(snapshot_doc).gpus
    assert (gpu0.id, gpu0.name) == ("gpu0", "NVIDIA GeForce RTX 4090")
    assert (gpu0.temp_c, gpu0.slowdown_c, gpu0.power_w, gpu0.util_pct) == (54.0, 85.0, 358.222, 100.0)
    assert (gpu0.limit_w, gpu0.limit_min_w, gpu0.limit_max_w, gpu0.default_w) == (360.0, 10.0, 600.0, 450.0)
    assert [(f.id, f.pct) for f in gpu0.fans] == [("gpu0/fan0", 34.0)]
    assert gpu0.reasons == ("sw_power_cap",)
    assert gpu0.rule == "quiet/busy-limit"  # the held policy's rule
    assert gpu0.reason == "gpu0 in load.busy: 80% of the default (360 W)"
    assert gpu0.problems == ()
    assert (gpu1.slowdown_c, gpu1.limit_w, gpu1.rule, gpu1.reasons) == (93.0, 240.0, "quiet/busy-limit",
                                                                        ("sw_power_cap",))


def test_a_gpu_problem_is_a_failed_reading_not_an_unsupported_one(snapshot_doc):
    channels = {c["attribute"]: c for c in _device(snapshot_doc, "gpu0")["channels"]}
    channels["memory_clock"].update(value=None, status="not_supported")  # a capability, not a problem
    channels["power"].update(value=None, status="failed")
    assert overview(snapshot_doc).gpus[0].problems == ("power: failed",)


def test_cpu_package_power_against_pl1_pl2_with_k10temp_tctl_temperature(snapshot_doc):
    (pkg,) = cpu_packages(snapshot_doc)  # powercap:core is a zone, not a package
    assert (pkg.id, pkg.power_w, pkg.pl1_w, pkg.pl2_w, pkg.temp_c) == ("powercap:package-0", 70.06394, 95.0,
                                                                      118.75, 49.5)


def test_cpu_package_temperature_prefers_coretemp_package_id(snapshot_doc):
    k10 = _device(snapshot_doc, "hwmon:k10temp-pci-00c3")
    k10["chip"] = "coretemp-isa-0000"
    k10["channels"][2]["label"] = "Package id 0"  # temp3 (Tccd1 on this board)
    assert cpu_packages(snapshot_doc)[0].temp_c == k10["channels"][2]["value"] == 59.5


def test_board_fans_pair_fanN_with_pwmN_and_name_their_source(snapshot_doc):
    fans = {f.id: f for f in board_fans(snapshot_doc) if f.id.startswith("hwmon:")}
    nct = "hwmon:nct6798-isa-0290"
    assert list(fans) == ["hwmon:amdgpu-pci-0700/fan1", *(f"{nct}/fan{n}" for n in range(1, 7))]
    assert (fans[f"{nct}/fan1"].rpm, round(fans[f"{nct}/fan1"].duty_pct, 2), fans[f"{nct}/fan1"].source) == (
        494.0, 26.67, "quiet/board-fans")
    assert fans["hwmon:amdgpu-pci-0700/fan1"].source == "firmware"  # a writable pwm nobody drives


def _board(doc):
    return [f for f in board_fans(doc) if f.id.startswith("hwmon:")]


def test_board_fans_without_a_writable_pwm_are_the_firmwares(snapshot_doc):
    amdgpu = _device(snapshot_doc, "hwmon:amdgpu-pci-0700")
    amdgpu["knobs"][0].update(writable=False, why_not="pwm1 not writable (needs root)")
    assert _board(snapshot_doc)[0].source == "firmware (read-only)"
    amdgpu["knobs"] = []
    assert (_board(snapshot_doc)[0].knob_id, _board(snapshot_doc)[0].source) == (None, "firmware (no pwm)")


def test_gpu_fans_are_listed_like_board_fans(snapshot_doc):
    gpu = [f for f in board_fans(snapshot_doc) if f.id.startswith("gpu")]
    assert [(f.id, f.label, f.duty_pct, f.knob_id) for f in gpu] == [
        ("gpu0/fan0", "gpu0 fan0", 34.0, "gpu0/fan0"), ("gpu1/fan0", "gpu1 fan0", 32.0, "gpu1/fan0")]


def test_detected_fans_follow_their_pwm_and_alarms_replace_the_status(snapshot_doc):
    nct = next(d for d in snapshot_doc["devices"] if d["id"] == "hwmon:nct6798-isa-0290")
    pwm = {k["id"].rsplit("/", 1)[1]: k for k in nct["knobs"]}
    pwm["pwm1"]["fan"] = {"tachs": ["hwmon:nct6798-isa-0290/fan1", "hwmon:nct6798-isa-0290/fan5"],
                          "start_pct": 30.2, "stop_pct": 20.0, "max_rpm": {}, "levels": 0, "calibrated": True}
    pwm["pwm2"]["fan"] = {"tachs": [], "start_pct": None, "stop_pct": None, "max_rpm": {}, "levels": 0,
                          "calibrated": False}
    pwm["pwm2"]["label"] = "rear exhaust"
    snapshot_doc["alarms"] = {"hwmon:nct6798-isa-0290/fan1": {"kind": "stalled",
                                                               "message": "fan1 has stalled"}}
    fans = {f.id.rsplit("/", 1)[1]: f for f in board_fans(snapshot_doc) if f.id.startswith("hwmon:")}
    assert fans["fan5"].knob_id == "hwmon:nct6798-isa-0290/pwm1"  # not "no pwm": detection says pwm1
    assert (fans["fan1"].status, fans["fan1"].alarm) == ("stalled", "fan1 has stalled")
    assert (fans["fan1"].start_pct, fans["fan1"].stop_pct) == (30.2, 20.0)
    assert fans["fan2"].knob_id is None  # its pwm drives nothing: the header is empty
    assert fans["pwm2"].label.endswith("rear exhaust") and fans["pwm2"].rpm is None


def test_failed_fan_reading_keeps_its_status():
    doc = load("snapshot_nogpu.json")
    fans = {f.id: f for f in board_fans(doc)}
    assert fans["hwmon:nct6798-isa-0290/fan2"].status == "failed"
    assert fans["hwmon:nct6798-isa-0290/fan2"].rpm is None
    assert overview(doc).gpus == ()
    assert overview(doc).degraded == ("hwmon:nct6798-isa-0290/fan2",)


def test_rule_comes_from_the_rule_member_or_the_reason_prefix():
    assert rule_of({"rule": "quiet/caps", "reason": "x"}) == "quiet/caps"
    assert rule_of({"reason": "balanced/idle: gpu0 idle for 300 s"}) == "balanced/idle"
    assert rule_of({"reason": "auto (driver)"}) == ""
    assert rule_of(None) == ""
    assert reason_of({"reason": "balanced/idle: gpu0 idle"}) == "gpu0 idle"


def test_holds_and_policy_in_overview(snapshot_doc):
    ov = overview(snapshot_doc)
    assert ov.active_policy == "ai-training"
    assert [(h["cookie"], h["policy"], h["detached"]) for h in ov.holds] == [(17, "quiet", True)]
    assert ov.states == {"ai-training": {"gpu0": "training", "gpu1": "training"},
                         "quiet": {"gpu0": "busy", "gpu1": "busy"}}
    assert "powercap:package-0/pl1" in all_knobs(snapshot_doc)


def test_fmt():
    assert fmt(71.04, "°C") == "71 °C"
    assert fmt(62.0, "%") == "62%"
    assert fmt(None, "W") == "—"
    assert fmt(87.44, "W", 1) == "87.4 W"
