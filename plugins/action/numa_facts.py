# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of numafleet.tuning.numa_facts: reuse a fact cache's facts, else run the module.

With ``reuse_cached: true`` and facts in the host's fact cache that answer the same question (the
same sysfs and procfs roots, GPU facts when asked for, the collection's recorded state below the
same root), no module is sent: the task returns those facts. Otherwise, and always without the
option, the module runs on the host as usual. The collection's own state is never trusted from
the cache alone: host_apply compares it with the host under its lock before it changes anything
(option recorded_digest) and returns it afresh afterwards. Documentation:
``plugins/modules/numa_facts.py``.
"""

from __future__ import annotations

import posixpath

from ansible.plugins.action import ActionBase

from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import FACTS_VERSION
from ansible_collections.numafleet.tuning.plugins.plugin_utils._controller import plain


def _base(root) -> str:
    """A root as numa_facts compares it: no trailing slash ('/' stays '/')."""
    text = str(root)
    return text.rstrip("/") or "/"


def cached_facts(args: dict, facts: dict):
    """The facts numa_facts would publish for args, from facts (a fact cache's), or None.

    None when the cached facts are of another format (``numa.facts_version`` is not
    facts.FACTS_VERSION: gathered by an older release, without keys this one needs), or when
    anything the task asks for is missing or was read elsewhere: other sysfs or procfs
    roots, no GPU facts with ``gpu``, no recorded state (or one below another root) with
    ``state_root`` or ``recorded_root``, no state paths with ``state_root``. ``gpu_snapshot_out``
    and explicit ``state_paths`` always run the module (they ask for a fresh read or a file).
    """
    numa = facts.get("numa")
    if not isinstance(numa, dict) or args.get("gpu_snapshot_out") or args.get("state_paths"):
        return None
    if numa.get("facts_version") != FACTS_VERSION:
        return None  # cached by an older release: it lacks keys this one needs, gather again
    sysfs = args.get("sysfs_root") or "/sys"
    procfs = args.get("procfs_root") or "/proc"
    if (numa.get("sysfs_root"), numa.get("procfs_root")) != (
        posixpath.normpath(str(sysfs)),
        posixpath.normpath(str(procfs)),
    ) and (numa.get("sysfs_root"), numa.get("procfs_root")) != (str(sysfs), str(procfs)):
        return None
    found = {"numa": numa}
    if args.get("gpu"):
        if not isinstance(facts.get("gpu_topology"), dict):
            return None
        found["gpu_topology"] = facts["gpu_topology"]
    state_root = args.get("state_root")
    recorded_root = args.get("recorded_root")
    if state_root is not None and not str(state_root).startswith("/"):
        return None  # numa_plan refuses it, naming the variable: let the module run as asked
    root = recorded_root if recorded_root is not None else state_root
    if root is not None:
        recorded = facts.get("numafleet_recorded")
        if not isinstance(recorded, dict) or _base(recorded.get("root", "")) != _base(root):
            return None
        found["numafleet_recorded"] = recorded
    if state_root is not None:
        if not isinstance(facts.get("numafleet_state_paths"), list):
            return None
        found["numafleet_state_paths"] = facts["numafleet_state_paths"]
    return found


class ActionModule(ActionBase):
    """numa_facts: the cached facts when they answer the task (reuse_cached), else the module."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if args.get("reuse_cached") in (True, "true", "True", "yes", "1", 1):
            found = cached_facts(args, plain(task_vars.get("ansible_facts") or {}))
            if found is not None:
                result.update(changed=False, cached=True, ansible_facts=found)
                return result
        result.update(
            self._execute_module(
                module_name="numafleet.tuning.numa_facts", module_args=args, task_vars=task_vars
            )
        )
        result.setdefault("cached", False)
        return result
