"""The fast lane thread's wake-up: an Event's set/clear/wait on one lock."""

from __future__ import annotations

import threading

from aithermd.watchers.alarm import Alarm


def test_an_alarm_stays_set_until_cleared_and_setting_it_twice_is_harmless():
    alarm = Alarm()
    assert alarm.is_set() is False and alarm.wait(0) is False
    alarm.set()
    alarm.set()
    assert alarm.is_set() and alarm.wait(0) is True and alarm.wait(0.0) is True
    alarm.clear()
    alarm.clear()
    assert alarm.is_set() is False and alarm.wait(0) is False


def test_a_set_from_another_thread_wakes_a_wait_without_timeout():
    alarm, woke = Alarm(), []
    waiter = threading.Thread(target=lambda: woke.append(alarm.wait()))
    waiter.start()
    alarm.set()
    waiter.join(10.0)
    assert woke == [True] and not waiter.is_alive()
