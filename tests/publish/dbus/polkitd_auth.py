"""python-dbusmock's polkitd template, plus actions that need the user's password.

Real polkit answers an action whose implicit authorization is ``auth_self``/``auth_admin`` (as
``packaging/polkit`` gives the changing actions for an active local user) in one of two ways (polkit
reference manual, ``CheckAuthorization``): with the ``AllowUserInteraction`` flag it asks the caller's
authentication agent and answers ``(True, False, …)`` once the user has typed the password; without it, it
answers at once ``(False, True, …)``: not authorized, but a challenge would authorize. The stock template
never challenges; ``SetAuthRequired(actions)`` makes those actions behave as above, with an agent whose user
always answers.
"""

import dbus
from dbusmock import MOCK_IFACE
from dbusmock.templates import polkitd as _stock
from dbusmock.templates.polkitd import *  # noqa: F403  (the stock methods: SetAllowed, SimulateHang, …)

BUS_NAME = _stock.BUS_NAME
MAIN_OBJ = _stock.MAIN_OBJ
MAIN_IFACE = _stock.MAIN_IFACE
SYSTEM_BUS = True
ALLOW_USER_INTERACTION = 0x1


def load(mock, parameters):
    _stock.load(mock, parameters)
    mock.auth_required = []


@dbus.service.method(MAIN_IFACE, in_signature="(sa{sv})sa{ss}us", out_signature="(bba{ss})",
                     async_callbacks=("ok_cb", "err_cb"))
def CheckAuthorization(self, subject, action_id, details, flags, cancellation_id, ok_cb, err_cb):
    if action_id in self.auth_required:
        asked = bool(flags & ALLOW_USER_INTERACTION)
        ok_cb((asked, not asked, {}))
        return
    _stock.CheckAuthorization(self, subject, action_id, details, flags, cancellation_id, ok_cb, err_cb)


@dbus.service.method(MOCK_IFACE, in_signature="as", out_signature="")
def SetAuthRequired(self, actions):
    """Actions that need a password: challenged without AllowUserInteraction, granted with it."""
    self.auth_required = list(actions)
