"""backends.pick_backend: the library first, then the tool, as ``backend`` allows."""

from __future__ import annotations

import pytest

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.backends import (
    Way,
    pick_backend,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError


class Refused(NumaTuneError):
    pass


def refuse(found):
    raise Refused(f"{found}: cannot initialise")


LIB = Way("lib", lambda: "module", lambda found: ("lib", found), "no library")
NO_LIB = Way("lib", lambda: None, lambda found: ("lib", found), "no library")
BAD_LIB = Way("lib", lambda: "module", refuse, "no library")
TOOL = Way("tool", lambda: "/usr/bin/tool", lambda found: ("tool", found), "no tool")
NO_TOOL = Way("tool", lambda: None, lambda found: ("tool", found), "no tool")


@pytest.mark.parametrize(
    ("choice", "ways", "backend", "reasons"),
    [
        ("auto", (LIB, TOOL), ("lib", "module"), []),
        ("auto", (NO_LIB, TOOL), ("tool", "/usr/bin/tool"), ["no library"]),
        ("auto", (BAD_LIB, TOOL), ("tool", "/usr/bin/tool"), ["module: cannot initialise"]),
        ("auto", (NO_LIB, NO_TOOL), None, ["no library", "no tool"]),
        ("tool", (LIB, TOOL), ("tool", "/usr/bin/tool"), []),
        ("tool", (LIB, NO_TOOL), None, ["no tool"]),
        ("lib", (BAD_LIB, TOOL), None, ["module: cannot initialise"]),
        ("other", (LIB, TOOL), None, []),
    ],
)
def test_pick_backend(choice, ways, backend, reasons):
    assert pick_backend(choice, ways, (Refused,)) == (backend, reasons)


def test_errors_not_listed_propagate():
    with pytest.raises(Refused, match="cannot initialise"):
        pick_backend("auto", (BAD_LIB, TOOL), (KeyError,))
