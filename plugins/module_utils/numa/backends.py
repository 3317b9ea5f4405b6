# Private to this collection: may change in any release.
"""The choice of a GPU backend shared by the gpu, mig and amd layers.

Each layer reaches its GPUs through a vendor library passed in by the module (pynvml, amdsmi:
the core imports neither) or a command-line tool found on the PATH (nvidia-smi, amd-smi), and
its ``backend`` option names one of them or ``auto`` (the library first, then the tool). The
layers keep what differs: the snapshot and sysfs backends, the fallback of ``auto`` and the
refusal that names every reason.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

# Why the NVIDIA ways are missing (the gpu and mig layers).
NVML_MISSING = "nvidia-ml-py (import pynvml) is not installed for the target's Python"
SMI_MISSING = "nvidia-smi is not on the PATH"


class Way(NamedTuple):
    """One way to the GPUs: ``name`` is its ``backend`` option value; ``get()`` gives the
    library module or the tool's path, None when absent (``missing`` is the reason then);
    ``build(found)`` gives the backend or raises one of the errors passed to pick_backend (its
    text is the reason)."""

    name: str
    get: Callable[[], Optional[object]]
    build: Callable[[object], object]
    missing: str


def pick_backend(choice: str, ways: tuple, errors: tuple) -> tuple:
    """(backend, reasons): the first of ``ways`` (Way, in order) that ``choice`` (a name or
    ``auto``) allows and that works; backend None when none does, with ``reasons`` (a list of
    texts) saying why each tried way did not. Raises what ``build`` raises outside ``errors``."""
    reasons: list = []
    for way in ways:
        if choice not in ("auto", way.name):
            continue
        found = way.get()
        if found is None:
            reasons.append(way.missing)
            continue
        try:
            return way.build(found), reasons
        except errors as exc:
            reasons.append(str(exc))
    return None, reasons
