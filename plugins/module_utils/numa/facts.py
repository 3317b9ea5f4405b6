# Private to this collection: may change in any release.
"""The whole of ansible_facts.numa: topology, PCI locality and the reader's warnings."""

from __future__ import annotations

from . import pci, topology
from .sysfs import Reader


def read_numa_facts(reader: Reader) -> dict:
    """JSON-ready ansible_facts.numa for the host behind ``reader``; bad files become warnings.

    Raises TopologyError when the roots are not a sysfs/procfs tree at all (Reader.check_roots).
    """
    reader.check_roots()
    topo = topology.read_topology(reader)
    node_cpus = {node.id: node.cpus for node in topo.nodes}
    devices = pci.read_pci_devices(reader, node_cpus)
    facts = topology.as_facts(topo)
    facts["pci_devices"] = pci.as_facts(pci.placement_devices(devices))
    facts["sysfs_root"] = reader.sysfs_root
    facts["procfs_root"] = reader.procfs_root
    facts["warnings"] = sorted(reader.warnings, key=lambda w: (w["path"], w["reason"]))
    return facts
