"""The machine's fans as they really are: which tachometer follows which pwm, each pwm's RPM curve, start and
stop duty (:mod:`aithermd.fans.detect`, :mod:`aithermd.fans.calibrate`, run safely by
:mod:`aithermd.fans.lab`), kept in the state directory (:mod:`aithermd.fans.store`)."""
