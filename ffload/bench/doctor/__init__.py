"""``ffload doctor DATASET``: what limits loading a dataset on this machine, measured in one run.

* :mod:`.probes`: the limits (disk read rates on the file, one core's decode rate, the memory
  bandwidth of a batch copy) and the loader's rate at a few worker counts;
* :mod:`.startup`: time to the first batch, warm and cold, several ranks at once, a read-only package
  (where numba's cache then goes);
* :mod:`.verdict`: fractions of each limit, the binding one, recommended settings (pure functions);
* :mod:`.run`: one run of all of them into the report (schema ``ffload.doctor/1``, documented in
  :func:`.run.diagnose`);
* :mod:`.report`: the report as text, and its plot;
* :mod:`.cli`: the command.
"""

from __future__ import annotations

from .cli import doctor_command
from .verdict import LIMIT_NAMES, analyse, limit

__all__ = ["LIMIT_NAMES", "analyse", "doctor_command", "limit"]
