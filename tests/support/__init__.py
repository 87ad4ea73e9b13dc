"""What every test directory shares, written once: the simulated clock (:mod:`.clock`), the copier of
recorded machines (:mod:`.machines`) and the private dbus-daemon (:mod:`.dbus`)."""
