# Private to this collection: may change in any release.
"""The planner's shared constants and message helpers. Pure, no I/O."""

from __future__ import annotations

from operator import itemgetter

PLAN_VERSION = 1
CI_SLICES = (1, 2, 3, 4, 6, 7, 8)
CPU_KINDS = ("cpu+memory", "cpu-only")
MEMORY_KINDS = ("cpu+memory", "memory-only")
MPS_PIPE_ROOT = "/run/nvidia-mps"
MPS_LOG_ROOT = "/var/log/nvidia-mps"
DEFAULT_SLICE = "numafleet.slice"
BY_ADDRESS = itemgetter("address")
# How messages name a PCI device kind of ansible_facts.numa.pci_devices.
KIND_NAMES = {"gpu": "GPU", "nic": "NIC", "nvme": "NVMe drive", "cxl_memory": "CXL memory device"}
KNOWN_DEVICES_SHOWN = 5


def counted(number: int, noun: str, with_number: bool = True) -> str:
    """'1 GPU', '2 GPUs' (or just the noun in the right number)."""
    word = noun if number == 1 else noun + "s"
    return f"{number} {word}" if with_number else word


def short_address(address: str) -> str:
    return address[5:] if address.startswith("0000:") else address


def device_label(device: dict) -> str:
    """'NIC 0000:4b:00.0': a PCI device of the facts as messages name it."""
    kind = device.get("kind")
    return f"{KIND_NAMES.get(kind, kind or 'device')} {device['address']}"


def device_hint(device: dict) -> str:
    """'0000:4b:00.0 (nic, node 0)': address, kind and node of a PCI device for a known: list."""
    node = device.get("node")
    return f"{device['address']} ({device.get('kind')}, node {'unknown' if node is None else node})"


def int_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    )


def size_text(kb: int) -> str:
    """A size value that writes kb exactly: 64G, 1536M or 100K."""
    for suffix, scale in (("T", 1 << 30), ("G", 1 << 20), ("M", 1 << 10)):
        if kb % scale == 0:
            return f"{kb // scale}{suffix}"
    return f"{kb}K"
