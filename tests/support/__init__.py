"""What every test directory shares, written once: the simulated clock (:mod:`.clock`), the copier of
recorded machines (:mod:`.machines`), the private dbus-daemon (:mod:`.dbus`), the backend fakes
(:mod:`.fake_backend`) and the contract every backend and fake keeps (:mod:`.backend_contract`)."""
