# Private to this collection: may change in any release.
"""PCI devices that matter for placement, with their NUMA locality and PCIe upstream path."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Optional

from .cpulist import parse_cpulist, parse_cpumask
from .frozen import frozen_builder
from .sysfs import Reader
from .topology import as_plain

PCI_DIR = ("bus", "pci", "devices")
# PCI addresses: domain (16 bits usually, 32 bits on VMD/Hyper-V hosts), bus, device, function.
_ADDRESS_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\Z")
VENDOR_NVIDIA = "0x10de"
VENDOR_AMD = "0x1002"
# class code (base class + subclass, 4 hex digits) -> device kind; see the PCI Code and ID
# Assignment specification. GPU classes count only for GPU vendors.
_GPU_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")
_KIND_BY_CLASS = {
    "0x0200": "nic",  # Ethernet controller
    "0x0207": "nic",  # InfiniBand controller
    "0x0502": "cxl_memory",  # CXL memory device (prog-if 0x10)
}
_NVME_CLASS = "0x010802"
_BRIDGE_CLASS = "0x0604"


@dataclass(frozen=True)
class PciDevice:
    """One PCI function with its locality; ``numa_node`` is None when sysfs says -1."""

    address: str
    domain: int
    bus: int
    kind: Optional[str]
    class_code: Optional[str]
    vendor_id: Optional[str]
    device_id: Optional[str]
    numa_node: Optional[int]
    local_cpus: Optional[tuple]
    node: Optional[int]
    node_source: Optional[str]
    host_bridge: Optional[str]
    upstream: tuple
    root_port: Optional[str]
    switch: Optional[str]
    # The numa_node file as read (-1 included); None when it is missing or unreadable.
    numa_node_raw: Optional[int] = None


_device = frozen_builder(PciDevice)


def parse_address(text: str) -> tuple:
    """(domain, bus, device, function) of a PCI address like 0000:17:00.0; raises ValueError."""
    match = _ADDRESS_RE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a PCI address DDDD:BB:DD.F")
    return tuple(int(part, 16) for part in match.groups())


def classify(class_code: Optional[str], vendor_id: Optional[str]) -> Optional[str]:
    """Device kind (gpu, nic, nvme, cxl_memory) of a class code and vendor id, or None."""
    if not class_code:
        return None
    short = class_code[:6].lower()
    if short in _GPU_CLASSES and vendor_id in (VENDOR_NVIDIA, VENDOR_AMD):
        return "gpu"
    if class_code.lower() == _NVME_CLASS:
        return "nvme"
    return _KIND_BY_CLASS.get(short)


def infer_node(numa_node: Optional[int], local_cpus, node_cpus: dict) -> tuple:
    """(node, source) from sysfs numa_node, else from the device's local CPUs: "local_cpulist"
    when they equal exactly one node's CPUs, "local_cpulist_subset" when they are a proper,
    non-empty subset of exactly one node's CPUs (and of no other node's); else (None, None)."""
    if numa_node is not None:
        return numa_node, "numa_node"
    if local_cpus:
        wanted = set(local_cpus)
        matches = [nid for nid, cpus in node_cpus.items() if cpus and set(cpus) == wanted]
        if len(matches) == 1:
            return matches[0], "local_cpulist"
        if not matches:
            return subset_node(wanted, node_cpus)
    return None, None


def subset_node(wanted: set, node_cpus: dict) -> tuple:
    """(node, "local_cpulist_subset") when the non-empty CPU set ``wanted`` lies inside exactly
    one node's CPUs, else (None, None). Source: a device's local_cpulist (or local_cpus)."""
    if not wanted:
        return None, None
    holders = [nid for nid, cpus in node_cpus.items() if cpus and wanted.issubset(cpus)]
    if len(holders) == 1:
        return holders[0], "local_cpulist_subset"
    return None, None


def _upstream(reader: Reader, link: str, address: str, above: Optional[dict] = None) -> tuple:
    """(host bridge, upstream PCI addresses from the root down, excluding the device itself).

    ``above`` (a dict the caller keeps for one listing) remembers what each parent directory
    gave: devices behind one bridge share everything but their own name.
    """
    real = reader.realpath(link)
    parent, sep, name = real.rpartition(os.sep)
    if above is None or not sep or not parent:
        parts = real.split(os.sep)
        host_bridge = next((p for p in parts if p.startswith("pci") and ":" in p), None)
        chain = [part.lower() for part in parts if _ADDRESS_RE.match(part)]
    else:
        known = above.get(parent)
        if known is None:
            parts = parent.split(os.sep)
            known = above[parent] = (
                next((p for p in parts if p.startswith("pci") and ":" in p), None),
                [part.lower() for part in parts if _ADDRESS_RE.match(part)],
            )
        host_bridge, chain = known
        if host_bridge is None and name.startswith("pci") and ":" in name:
            host_bridge = name
        chain = chain + [name.lower()] if _ADDRESS_RE.match(name) else list(chain)
    if chain and chain[-1] == address:
        chain.pop()
    return host_bridge, tuple(chain), os.path.dirname(real)


def _class_above(reader: Reader, real_parent: str) -> Optional[str]:
    """Short class code (``0x0604``) of the device directory above ``real_parent``, or None."""
    text = reader.text(os.path.join(os.path.dirname(real_parent), "class"), optional=True)
    return text[:6].lower() if text else None


def _read_device(
    reader: Reader,
    base: str,
    address: str,
    parsed: tuple,
    node_cpus: dict,
    above: Optional[dict] = None,
) -> PciDevice:
    link = f"{base}/{address}"
    host_bridge, chain, real_parent = _upstream(reader, link, address, above)
    # The files are opened through the resolved directory (the same files, without the kernel
    # following the link for each one) and recorded under the link.
    real = reader.resolved(link)
    here = None if real is None else f"{real}/"
    # Every kernel writes class and vendor: without them a device cannot be classified.
    class_code = reader.text(f"{link}/class", False, here and f"{here}class")
    vendor_id = reader.text(f"{link}/vendor", False, here and f"{here}vendor")
    device_id = reader.text(f"{link}/device", True, here and f"{here}device")
    raw_node = reader.integer(f"{link}/numa_node", True, here and f"{here}numa_node")
    numa_node = raw_node if raw_node is not None and raw_node >= 0 else None
    local = reader.cpuset(
        f"{link}/local_cpulist", parse_cpulist, True, here and f"{here}local_cpulist"
    )
    if local is None:
        local = reader.cpuset(
            f"{link}/local_cpus", parse_cpumask, True, here and f"{here}local_cpus"
        )
    node, source = infer_node(numa_node, local, node_cpus)
    # The switch above a device is the upstream port whose downstream port leads to it:
    # chain = [root port, switch upstream, switch downstream, ...]. Only bridges count.
    switch = None
    if len(chain) >= 3 and _class_above(reader, real_parent) == _BRIDGE_CLASS:
        switch = chain[-2]
    domain, bus = parsed[:2]
    return _device(
        address=address,
        domain=domain,
        bus=bus,
        kind=classify(class_code, vendor_id),
        class_code=class_code,
        vendor_id=vendor_id,
        device_id=device_id,
        numa_node=numa_node,
        local_cpus=local,
        node=node,
        node_source=source,
        host_bridge=host_bridge,
        upstream=chain,
        root_port=chain[0] if chain else None,
        switch=switch,
        numa_node_raw=raw_node,
    )


def _read_all(reader: Reader, base: str) -> tuple:
    """(parsed address, device) of every PCI function under ``base``, by address.

    The devices' ``node`` is left to _with_node: it depends on the caller's ``node_cpus``.
    """
    devices = []
    above: dict = {}
    for name in reader.listdir(base, optional=True):
        try:
            parsed = parse_address(name)
        except ValueError as exc:
            reader.warn(f"{base}/{name}", str(exc))
            continue
        devices.append((parsed, _read_device(reader, base, name.lower(), parsed, {}, above)))
    devices.sort(key=lambda pair: pair[0])
    return tuple(device for dummy, device in devices)


def _with_node(device: PciDevice, node_cpus: dict) -> PciDevice:
    """``device`` with the node infer_node gives for ``node_cpus``.

    A ``numa_node`` that names no node of ``node_cpus`` (when it lists any) is unknown, as -1 is.
    """
    if device.numa_node is not None:  # infer_node takes it as it is
        if not node_cpus or device.numa_node in node_cpus:
            return device
        device = replace(device, numa_node=None, node=None, node_source=None)
    node, source = infer_node(None, device.local_cpus, node_cpus)
    if node is None:
        return device
    return replace(device, node=node, node_source=source)


def missing_node_findings(reader: Reader, devices: list, node_cpus: dict) -> list:
    """Consistency findings (kind ``device_on_missing_node``) of devices whose ``numa_node``
    names a node missing from ``node_cpus``; each is also a warning naming the file.

    ``devices`` are those read_pci_devices read (their ``numa_node`` as sysfs gave it); nothing
    is found when ``node_cpus`` is empty (a kernel without NUMA sysfs).
    """
    findings = []
    if not node_cpus:
        return findings
    known = ", ".join(str(nid) for nid in sorted(node_cpus))
    base = reader.sys(*PCI_DIR)
    for device in devices:
        claimed = device.numa_node
        if claimed is None or claimed in node_cpus:
            continue
        path = f"{base}/{device.address}/numa_node"
        reader.warn(
            path,
            f"names node {claimed}, which does not exist (nodes: {known}): locality taken as "
            "unknown, as for -1",
        )
        findings.append(
            {
                "kind": "device_on_missing_node",
                "cpus": [],
                "nodes": [claimed],
                "message": f"PCI device {device.address} ({device.kind or 'other'}) says it is "
                f"on node {claimed} ({path}), which does not exist (nodes: {known}); its "
                "locality is unknown, as for numa_node -1",
            }
        )
    return findings


def read_pci_devices(reader: Reader, node_cpus: dict, findings: Optional[list] = None) -> list:
    """Every PCI function under <sysfs_root>/bus/pci/devices, sorted by address.

    ``node_cpus`` maps node id -> CPUs and is used to infer an unknown node from local CPUs; a
    device whose ``numa_node`` names a node not in it is unknown (numa_node and node None), a
    warning naming its ``numa_node`` file, and with ``findings`` (a list) a consistency finding
    appended there. Entries whose name is not a PCI address become warnings. A reader made with
    ``remember`` reads the devices once for itself and its siblings (Reader.once).
    """
    base = reader.sys(*PCI_DIR)
    found = reader.once(("pci_devices", base), lambda: _read_all(reader, base))
    wanted = [device for device in found if device.kind is not None]
    missing = missing_node_findings(reader, wanted, node_cpus)
    if findings is not None:
        findings.extend(missing)
    return [_with_node(device, node_cpus) for device in found]


def placement_devices(devices: list) -> list:
    """The devices that matter for placement: GPUs, NICs, NVMe and CXL memory."""
    return [dev for dev in devices if dev.kind is not None]


def as_facts(devices: list) -> list:
    """JSON-ready list of PciDevice dicts (``ansible_facts.numa.pci_devices``)."""
    return [as_plain(dev) for dev in devices]
