# Copyright: numafleet.tuning contributors
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.numafleet.tuning.plugins.plugin_utils import _module_inputs
from ansible_collections.numafleet.tuning.plugins.plugin_utils._controller import plain


def module_input_problems(args, module, host, numa=None):
    """Messages for the module arguments the module's own core checks would refuse; [] if none."""
    if module not in _module_inputs.MODULES:
        raise AnsibleFilterError(
            f"numafleet.tuning.module_input_problems: module is {module!r}; use one of "
            f"{', '.join(_module_inputs.MODULES)}"
        )
    return _module_inputs.problems(
        module, plain(args), str(host), None if numa is None else plain(numa)
    )


class FilterModule:
    """The apply modules' input checks, on the controller."""

    def filters(self):
        return {"module_input_problems": module_input_problems}
