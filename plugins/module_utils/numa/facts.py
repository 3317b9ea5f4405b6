# Private to this collection: may change in any release.
"""The whole of ansible_facts.numa: topology, PCI locality and the reader's warnings.

gather_facts() is numa_facts' one run: ansible_facts.numa, and on request the host's GPUs
(ansible_facts.gpu_topology, as gpu_topology_facts gives it) and which of the collection's state
files exist (ansible_facts.numafleet_state_paths) and what the last apply recorded
(ansible_facts.numafleet_recorded), so that a play needs one module execution.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from . import allowed, pci, topology
from .errors import NumaTuneError
from .sysfs import Reader


class StatePathError(NumaTuneError):
    """An entry of numa_facts' state_paths is not an absolute path."""


# The format of ansible_facts.numa: bumped whenever a release adds keys that the controller needs
# (2: allowed, pid1, kernel.osrelease, nodes_per_package, snc_like, numa_node_raw, memory tiers;
# 3: kernel.cmdline, kernel.nohz_full_supported; 4: the GPU entries' amd records and the
# amdsmi key of gpu_topology, which the planner needs for AMD partitions).
# numa_facts' reuse_cached answers only with cached facts of this format, so that facts a fact
# cache kept from an older release are gathered again instead of silently lacking those keys.
FACTS_VERSION = 4


def read_numa_facts(reader: Reader) -> dict:
    """JSON-ready ansible_facts.numa for the host behind ``reader``; bad files become warnings.

    Raises TopologyError when the roots are not a sysfs/procfs tree at all (Reader.check_roots).
    """
    reader.check_roots()
    topo = topology.read_topology(reader)
    node_cpus = {node.id: node.cpus for node in topo.nodes}
    findings: list = []
    devices = pci.read_pci_devices(reader, node_cpus, findings)
    facts = topology.as_facts(topo)
    facts["consistency"].extend(findings)
    facts["pci_devices"] = pci.as_facts(pci.placement_devices(devices))
    facts["sysfs_root"] = reader.sysfs_root
    facts["procfs_root"] = reader.procfs_root
    pid1 = allowed.read_pid1(reader)
    facts["allowed"] = allowed.read_allowed(
        reader, topo.cpus["online"], list(topo.node_ids), topo.cpus["isolated"], pid1
    )
    facts["pid1"] = pid1
    facts["warnings"] = sorted(reader.warnings, key=lambda w: (w["path"], w["reason"]))
    facts["facts_version"] = FACTS_VERSION
    return facts


def check_state_paths(paths: list) -> list:
    """``paths`` as a list of strings; raises StatePathError for an entry that is not absolute."""
    checked = []
    for index, path in enumerate(paths):
        if not isinstance(path, str) or not os.path.isabs(path):
            raise StatePathError(
                f"state_paths[{index}]: {path!r} is not an absolute path; list each state file "
                "from / on the host, for example /etc/numafleet/mig.json"
            )
        checked.append(path)
    return checked


# The state files of the MIG and MPS layers below a root: whether they exist tells the controller
# whether those layers have anything to look after on a host (numa_facts state_root, host_apply).
STATE_FILES = ("/etc/numafleet/mig.json", "/etc/numafleet/mps-units.json")


def state_files_below(root: str) -> list:
    """STATE_FILES below root (an absolute path; "/" for the host itself), as host paths."""
    base = root.rstrip("/")
    return [base + path for path in STATE_FILES]


def read_state_paths(paths: list) -> list:
    """The entries of ``paths`` that exist (os.path.lexists: a dangling link counts), in order.

    Raises StatePathError for an entry that is not absolute.
    """
    return [path for path in check_state_paths(paths) if os.path.lexists(path)]


def gather_facts(
    params: dict,
    check_mode: bool,
    runner: Callable,
    which: Callable,
    load_nvml: Callable,
    load_amdsmi: Optional[Callable] = None,
) -> tuple:
    """(ansible_facts, whether gpu_snapshot_out was written) of numa_facts for its ``params``.

    Raises StatePathError, TopologyError, and with ``gpu`` whatever gather_gpu_topology raises.
    ``runner``, ``which``, ``load_nvml`` and ``load_amdsmi`` are used only with ``gpu``; see
    gather_gpu_topology.
    The GPU pass reads through a sibling reader: the files the NUMA pass read are not read
    again, and its warnings are only the GPU pass's own, as gpu_topology_facts reports them.
    """
    state_paths = check_state_paths(params.get("state_paths") or [])
    recorded_root = params.get("recorded_root")
    if recorded_root is not None and not os.path.isabs(recorded_root):
        raise StatePathError(
            f"recorded_root: {recorded_root!r} is not an absolute path; give / (the host) or "
            "the absolute render root"
        )
    reader = Reader(params["sysfs_root"], params["procfs_root"], remember=bool(params.get("gpu")))
    facts = {"numa": read_numa_facts(reader)}
    written = False
    if params.get("gpu"):
        from . import gpu  # imported only when asked for: it is the largest file of the run

        facts["gpu_topology"], written = gpu.gather_gpu_topology(
            reader.sibling(),
            runner,
            which,
            load_nvml,
            nvidia_smi_mode=params["nvidia_smi"],
            nvidia_smi_timeout=params["nvidia_smi_timeout"],
            snapshot=params.get("gpu_snapshot"),
            snapshot_out=params.get("gpu_snapshot_out"),
            check_mode=check_mode,
            load_amdsmi=load_amdsmi,
        )
    if state_paths:
        facts["numafleet_state_paths"] = read_state_paths(state_paths)
    if recorded_root is not None:
        from .recorded import read_recorded

        facts["numafleet_recorded"] = read_recorded(recorded_root)
    return facts, written
