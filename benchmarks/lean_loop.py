"""The lean reference controller of the whole-process benchmark: one Python loop doing the daemon's job on the
benchmark's reference workload with the same libraries, and nothing else.

What it does each second, like the daemon on the same tree: read every hwmon ``temp*_input`` and
``fan*_input`` (files opened once, ``os.pread``), the CPU's total utilisation (``psutil.cpu_times()``) and load
average, and with ``--gpus`` every GPU's temperature, power, energy, limits, utilisation, clocks, fans and
clocks-event reasons through ``pynvml`` (the same fake NVML as the daemon's run, :mod:`fakegpus`); the
reference policy of :mod:`bench_process` (a thermal state over a 30 s mean with a 10 s dwell, a points curve
with 3 °C hysteresis and ramps on ``pwm1``, a PID on the case sensors mixed by max on ``pwm2``/``pwm3``,
80 % GPU power limits while hot); a ``pwmN`` write only when the value changes (``pwmN_enable`` = 1 first,
originals put back on SIGTERM); Prometheus gauges for every value through ``prometheus_client``'s own
server; ``READY=1`` to ``$NOTIFY_SOCKET`` after the first tick. Like the daemon it reads its configuration
(the policy file, with ``ruamel.yaml``), logs its start with ``structlog`` and
opens NVML whether or not a driver answers, so its memory holds the libraries a controller of this job
loads. No history, no D-Bus, no journal, no log line per write.

    python benchmarks/lean_loop.py --sysfs-root DIR --policy FILE [--listen HOST:PORT] [--gpus N] [--seed S]
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import signal
import socket
import sys
import time

import fakegpus  # this script's directory is first on sys.path

def interpolate(points: list[tuple[float, float]], x: float) -> float:
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


class Pid:
    def __init__(self, setpoint: float, kp: float = 4.0, ki: float = 0.05, kd: float = 0.0) -> None:
        self.setpoint, self.kp, self.ki, self.kd = setpoint, kp, ki, kd
        self.integral = 0.0
        self.last: float | None = None

    def __call__(self, x: float, dt: float) -> float:
        err = x - self.setpoint
        self.integral = max(-500.0, min(500.0, self.integral + err * dt))
        deriv = 0.0 if self.last is None else (err - self.last) / dt
        self.last = err
        return max(0.0, min(100.0, self.kp * err + self.ki * self.integral + self.kd * deriv))


def notify(message: str) -> None:
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect("\0" + path[1:] if path.startswith("@") else path)
        s.send(message.encode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sysfs-root", required=True)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--listen", default="none")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tick", type=float, default=1.0)
    args = parser.parse_args()
    fakegpus.install(args.gpus, args.seed)
    import psutil
    import pynvml as nv
    import structlog
    from prometheus_client import Gauge, start_http_server
    from ruamel.yaml import YAML

    with open(args.policy) as f:
        curve = YAML(typ="safe").load(f)["curves"]["cpu"]
    points = [(float(x), float(y)) for x, y in curve["points"]]
    hysteresis_c = float(curve.get("hysteresis_c", 0.0))
    log = structlog.get_logger("lean")

    temps: list[tuple[str, str, str, int]] = []  # chip, attribute, label, fd
    fans: list[tuple[str, str, int]] = []
    pwms: dict[int, tuple[str, int]] = {}  # n → (pwm path, original enable)
    originals: dict[str, str] = {}
    for chip_dir in sorted(glob.glob(os.path.join(args.sysfs_root, "class", "hwmon", "hwmon*"))):
        with open(os.path.join(chip_dir, "name")) as f:
            chip = f.read().strip()
        for path in sorted(glob.glob(os.path.join(chip_dir, "temp*_input"))):
            attr = os.path.basename(path)[:-6]
            try:
                with open(os.path.join(chip_dir, attr + "_label")) as f:
                    label = f.read().strip()
            except OSError:
                label = attr
            temps.append((chip, attr, label, os.open(path, os.O_RDONLY)))
        for path in sorted(glob.glob(os.path.join(chip_dir, "fan*_input"))):
            fans.append((chip, os.path.basename(path)[:-6], os.open(path, os.O_RDONLY)))
        for path in sorted(glob.glob(os.path.join(chip_dir, "pwm[0-9]"))):
            n = int(re.sub(r"\D", "", os.path.basename(path)))
            for p in (path, path + "_enable"):
                with open(p) as f:
                    originals[p] = f.read()
            with open(path + "_enable", "w") as f:
                f.write("1\n")
            pwms[n] = (path, -1)

    def restore(*_: object) -> None:
        for p, v in originals.items():
            with open(p, "w") as f:
                f.write(v)
        sys.exit(0)

    signal.signal(signal.SIGTERM, restore)
    signal.signal(signal.SIGINT, restore)

    g_temp = Gauge("lean_temperature_celsius", "hwmon temperature", ["chip", "sensor", "label"])
    g_fan = Gauge("lean_fan_speed_rpm", "hwmon fan speed", ["chip", "sensor"])
    g_duty = Gauge("lean_fan_duty_ratio", "fan duty", ["pwm"])
    g_cpu = Gauge("lean_cpu_utilization_ratio", "CPU utilisation")
    g_gpu = {name: Gauge(f"lean_gpu_{name}", f"GPU {name}", ["gpu"]) for name in
             ("temperature_celsius", "power_watts", "energy_joules", "power_limit_watts",
              "enforced_power_limit_watts", "utilization_ratio", "sm_clock_hz", "memory_clock_hz",
              "fan_ratio", "clock_event_reasons")}
    temp_children = [g_temp.labels(c, a, lab) for c, a, lab, _ in temps]
    fan_children = [g_fan.labels(c, a) for c, a, _ in fans]
    if args.listen != "none":
        host, _, port = args.listen.rpartition(":")
        start_http_server(int(port), addr=host)

    gpus: list[tuple[object, int, int]] = []  # handle, default limit mW, fans
    try:
        nv.nvmlInit()
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError:
        count = 0
    if count:
        for i in range(count):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            gpus.append((h, nv.nvmlDeviceGetPowerManagementDefaultLimit(h), nv.nvmlDeviceGetNumFans(h)))
    log.info("start", temperatures=len(temps), fans=len(fans), pwm=len(pwms), gpus=len(gpus))
    gpu_children = {name: [g.labels(str(i)) for i in range(len(gpus))] for name, g in g_gpu.items()}
    limits = [d for _, d, _ in gpus]

    by_label = {lab: i for i, (_, _, lab, _) in enumerate(temps)}
    cpu_in = [by_label[x] for x in ("Tctl", "Tccd1")]
    case_in = [by_label[x] for x in ("SYSTIN", "AUXTIN0", "AUXTIN1")]
    window: collections.deque[tuple[float, float]] = collections.deque()
    hot, since = False, 0.0
    pid = Pid(45.0)
    cpu_duty: float | None = None
    cpu_hyst_in: float | None = None
    prev_cpu = psutil.cpu_times()
    tick_s = args.tick
    deadline = time.monotonic()
    first = True
    values = [0.0] * len(temps)
    while True:
        now = time.monotonic()
        for i, (_, _, _, fd) in enumerate(temps):
            values[i] = int(os.pread(fd, 32, 0)) / 1000.0
            temp_children[i].set(values[i])
        for i, (_, _, fd) in enumerate(fans):
            fan_children[i].set(int(os.pread(fd, 32, 0)))
        times = psutil.cpu_times()
        total = sum(times) - times.guest - times.guest_nice
        prev_total = sum(prev_cpu) - prev_cpu.guest - prev_cpu.guest_nice
        idle = times.idle + times.iowait - prev_cpu.idle - prev_cpu.iowait
        if total > prev_total:
            g_cpu.set(1.0 - idle / (total - prev_total))
        prev_cpu = times
        os.getloadavg()
        # thermal state: 30 s mean of Tctl and Tccd*, enter above 70, leave below 60, dwell 10 s
        window.append((now, sum(values[i] for i in cpu_in) / len(cpu_in)))
        while window[0][0] < now - 30.0:
            window.popleft()
        mean = sum(v for _, v in window) / len(window)
        if now - since >= 10.0 and (mean > 70.0 if not hot else mean < 60.0):
            hot, since = not hot, now
        # pwm1: points on max(Tctl, Tccd1) with 3 °C hysteresis, 20 % floor, ramps 10 up / 2 down %/s
        x = max(values[i] for i in cpu_in)
        if cpu_hyst_in is None or x > cpu_hyst_in or x < cpu_hyst_in - hysteresis_c:
            cpu_hyst_in = x
        want = max(20.0, interpolate(points, cpu_hyst_in))
        if cpu_duty is not None:
            want = min(cpu_duty + 10.0 * tick_s, max(cpu_duty - 2.0 * tick_s, want))
        cpu_duty = want
        case = pid(sum(values[i] for i in case_in) / len(case_in), tick_s)
        duties = {1: cpu_duty, 2: max(25.0, cpu_duty, case), 3: max(25.0, cpu_duty, case)}
        for n, duty in duties.items():
            if n in pwms:
                raw = round(duty * 2.55)
                path, last = pwms[n]
                if raw != last:
                    with open(path, "w") as f:
                        f.write(f"{raw}\n")
                    pwms[n] = (path, raw)
                g_duty.labels(f"pwm{n}").set(duty / 100.0)
        for i, (h, default_mw, nfans) in enumerate(gpus):
            c = {name: ch[i] for name, ch in gpu_children.items()}
            c["temperature_celsius"].set(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
            c["power_watts"].set(nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
            c["energy_joules"].set(nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0)
            c["power_limit_watts"].set(nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0)
            c["enforced_power_limit_watts"].set(nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
            c["utilization_ratio"].set(nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            c["sm_clock_hz"].set(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * 1e6)
            c["memory_clock_hz"].set(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM) * 1e6)
            for fan in range(nfans):
                c["fan_ratio"].set(nv.nvmlDeviceGetFanSpeed_v2(h, fan) / 100.0)
            c["clock_event_reasons"].set(nv.nvmlDeviceGetCurrentClocksEventReasons(h))
            want_mw = int(default_mw * 0.8) if hot else default_mw
            if want_mw != limits[i]:
                nv.nvmlDeviceSetPowerManagementLimit(h, want_mw)
                limits[i] = want_mw
        if first:
            notify("READY=1")
            first = False
        deadline += tick_s
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            deadline = time.monotonic()


if __name__ == "__main__":
    sys.exit(main())
