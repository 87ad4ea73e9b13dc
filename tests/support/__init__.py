"""What every test directory shares, written once: the simulated clock (:mod:`.clock`), the copier of
recorded machines (:mod:`.machines`), the private dbus-daemon (:mod:`.dbus`), the backend fakes
(:mod:`.fake_backend`), the contract every backend and fake keeps (:mod:`.backend_contract`) and the
daemon's own documents for the tests of aithermctl (:mod:`.documents`)."""
