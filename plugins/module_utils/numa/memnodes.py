# Private to this collection: may change in any release.
"""What the memory of each NUMA node is: normal memory, a GPU's memory, its tier, DAX or CXL.

Every source is optional (older kernels, no NVIDIA driver, no CXL): a missing file is no
warning and leaves the value None; a malformed one is a warning of the reader, as everywhere.

* ``/sys/devices/system/node/has_normal_memory`` (drivers/base/node.c, a nodelist such as
  ``0,8``): the nodes with ZONE_NORMAL memory. Memory a driver onlines as movable only - the GPU
  memory the NVIDIA driver onlines on POWER9+V100 and Grace Hopper, DAX memory onlined movable -
  is in ``has_memory`` but not here.
* ``/proc/driver/nvidia/gpus/<PCI address>/numa_status`` (NVIDIA driver,
  ``kernel-open/nvidia/nv-procfs.c``, ``nv_procfs_read_numa_status``)::

      Node:      255
      Status:    online
      Address:   40000000000
      Size:      3f0000000

  ``Node:`` is the NUMA node of the GPU's own memory (-1 when the platform has none);
  ``Address:``/``Size:`` follow only once the GPU is initialised. hwloc reads the same file to hide
  these nodes (``HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES``).
* ``/sys/devices/virtual/memory_tiering/memory_tierN/nodelist`` (Linux 6.1+,
  Documentation/ABI/testing/sysfs-kernel-mm-memory-tiers): the nodes of memory tier N, where N
  comes from the abstract distance; a smaller N is a faster tier (DRAM is usually tier 4, DAX
  kmem memory tier 22).
* ``/sys/bus/dax/devices/daxX.Y/target_node`` (Linux 5.1+, Documentation/ABI/testing/
  sysfs-bus-dax): the node a device-DAX range becomes when it is onlined as System RAM (dax kmem).
  A DAX device whose resolved path lies below a CXL region
  (``/sys/bus/cxl/devices/regionZ``, Documentation/ABI/testing/sysfs-bus-cxl) is CXL memory.
"""

from __future__ import annotations

import re
from typing import Optional

from .cpulist import format_cpulist, parse_cpulist
from .sysfs import Reader

BACKING_DAX = "dax"
BACKING_CXL = "cxl"
_TIER_RE = re.compile(r"^memory_tier([0-9]+)\Z")
_DAX_RE = re.compile(r"^dax[0-9]+\.[0-9]+\Z")
_REGION_RE = re.compile(r"^region[0-9]+\Z")
_PCI_RE = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\Z")
_NODE_LINE_RE = re.compile(r"^Node:\s*(-?[0-9]+)\s*$", re.M)
_STATUS_LINE_RE = re.compile(r"^Status:\s*(\S+)\s*$", re.M)


def parse_numa_status(text: str) -> dict:
    """{"node": int (-1: none), "status": str or None} of an NVIDIA numa_status file; raises ValueError."""
    match = _NODE_LINE_RE.search(text)
    if match is None:
        raise ValueError("no 'Node: <id>' line")
    status = _STATUS_LINE_RE.search(text)
    return {"node": int(match.group(1)), "status": status.group(1) if status else None}


def read_normal_memory(reader: Reader) -> Optional[frozenset]:
    """Node ids of /sys/devices/system/node/has_normal_memory; None when the file is missing."""
    nodes = reader.parsed(
        reader.sys("devices", "system", "node", "has_normal_memory"), parse_cpulist, optional=True
    )
    return None if nodes is None else frozenset(nodes)


def read_gpu_memory_nodes(reader: Reader) -> dict:
    """{node id: PCI address} of the GPUs whose memory the NVIDIA driver exposes as a node.

    From /proc/driver/nvidia/gpus/<address>/numa_status (``Node:`` >= 0); {} without the driver.
    Addresses are lower case; a node two GPUs name keeps the lowest address, with a warning.
    """
    base = reader.proc("driver", "nvidia", "gpus")
    owners: dict = {}
    for name in reader.listdir(base, optional=True):
        if not _PCI_RE.match(name):
            continue
        path = f"{base}/{name}/numa_status"
        status = reader.parsed(path, parse_numa_status, optional=True)
        if status is None or status["node"] < 0:
            continue
        node, address = status["node"], name.lower()
        if node in owners:
            reader.warn(path, f"names node {node}, already GPU memory of {owners[node]}: not used")
            continue
        owners[node] = address
    return owners


def drop_cpu_gpu_owners(reader: Reader, kinds: dict, node_cpus: dict) -> dict:
    """``kinds`` without the GPU owners of nodes that have CPUs; a warning for each one dropped.

    A GPU's memory node is CPU-less on every platform that exposes one (POWER9 + V100,
    GH200, GB200), so a numa_status file naming a node with CPUs (``node_cpus``: {node: CPUs})
    is wrong; trusting it would keep placements' memory off a real CPU node.
    """
    owners = dict(kinds["gpu"])
    base = reader.proc("driver", "nvidia", "gpus")
    for node, address in sorted(kinds["gpu"].items()):
        cpus = node_cpus.get(node)
        if cpus:
            reader.warn(
                f"{base}/{address}/numa_status",
                f"names node {node}, which has CPUs {format_cpulist(cpus)}: a GPU's memory node "
                "has no CPUs; not used",
            )
            del owners[node]
    return dict(kinds, gpu=owners)


def read_memory_tiers(reader: Reader) -> dict:
    """{node id: memory tier id} of /sys/devices/virtual/memory_tiering/memory_tier*/nodelist.

    {} on kernels without memory tiers (before 6.1, or no tiering). A node listed by two tiers
    (the kernel never does that) keeps the faster, lower one.
    """
    base = reader.sys("devices", "virtual", "memory_tiering")
    tiers: dict = {}
    found = []
    for name in reader.listdir(base, optional=True):
        match = _TIER_RE.match(name)
        if match:
            found.append(int(match.group(1)))
    for tier in sorted(found):
        nodes = reader.parsed(f"{base}/memory_tier{tier}/nodelist", parse_cpulist, optional=True)
        for node in nodes or ():
            tiers.setdefault(node, tier)
    return tiers


def read_dax_backing(reader: Reader) -> dict:
    """{node id: "cxl" or "dax"} of the nodes a device-DAX range targets (daxX.Y/target_node).

    "cxl" when the DAX device sits below a CXL region (/sys/bus/cxl/devices/regionZ, resolved),
    else "dax" (persistent memory, EFI soft-reserved or HBM ranges). A node that a CXL and a
    non-CXL device both target is "cxl". {} without /sys/bus/dax.
    """
    dax_dir = reader.sys("bus", "dax", "devices")
    names = [name for name in reader.listdir(dax_dir, optional=True) if _DAX_RE.match(name)]
    if not names:
        return {}
    cxl_dir = reader.sys("bus", "cxl", "devices")
    regions = [
        reader.realpath(f"{cxl_dir}/{name}")
        for name in reader.listdir(cxl_dir, optional=True)
        if _REGION_RE.match(name)
    ]
    backing: dict = {}
    for name in names:
        device = f"{dax_dir}/{name}"
        node = reader.integer(f"{device}/target_node", optional=True)
        if node is None or node < 0:
            continue
        real = reader.realpath(device)
        under_cxl = any(real.startswith(region.rstrip("/") + "/") for region in regions)
        if under_cxl or node not in backing:
            backing[node] = BACKING_CXL if under_cxl else BACKING_DAX
    return backing


def memory_kinds(reader: Reader) -> dict:
    """{"normal": set or None, "gpu": {node: address}, "tier": {node: id}, "backing": {node: str}}."""
    return {
        "normal": read_normal_memory(reader),
        "gpu": read_gpu_memory_nodes(reader),
        "tier": read_memory_tiers(reader),
        "backing": read_dax_backing(reader),
    }


def node_memory_fields(kinds: dict, node_id: int) -> dict:
    """The NumaNode fields normal_memory, gpu_owner, memory_tier, memory_backing of one node."""
    normal = kinds["normal"]
    return {
        "normal_memory": None if normal is None else node_id in normal,
        "gpu_owner": kinds["gpu"].get(node_id),
        "memory_tier": kinds["tier"].get(node_id),
        "memory_backing": kinds["backing"].get(node_id),
    }
