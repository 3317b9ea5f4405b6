# Private to this collection: may change in any release.
"""Preflight of a pinned unit: does the host still look like the plan, right before it starts?

``numafleet-guard preflight [--mode enforce|warn] [--config PATH] <placement>`` runs as the
unit's ``ExecStartPre=``, so inside the unit's cgroup, with its CPU affinity. ``main`` parses
those arguments (the words after ``preflight``), finds the placement in the guard's config
(``/etc/numafleet/guard.json``: ``settings`` and the plan's ``placements``) and prints one line
per check result; ``check`` is the checks themselves, reading the host only through an injected
``read(path) -> text or None`` (``guard.read_path``), so tests run them on captured trees.

Checks (name: what is read; a fact the host does not show is ``skip``, never ``fail``):

- ``gpu``, per planned GPU (placement ``gpus[]``: ``address``, ``uuid``, ``node``):
  ``/sys/bus/pci/devices/<address>/numa_node`` equals the planned node (absent device: fail;
  ``-1``, the firmware gives no locality: skip). An NVIDIA GPU (PCI ``vendor`` 0x10de; without
  that file, a UUID of NVIDIA's form ``GPU-8-4-4-4-12`` hex digits) is also matched by UUID against
  ``/proc/driver/nvidia/gpus/<address>/information``, line ``GPU UUID: \t <uuid>`` (the driver
  names the directory ``%04x:%02x:%02x.%x``, lower case, and leaves the line out when it cannot
  read the UUID; no ``/proc/driver/nvidia``: skip). Per render node of ``device_allow`` (AMD
  GPUs selected by render node, ``/dev/dri/renderD<N>``): ``/sys/class/drm/renderD<N>`` exists
  and its device's ``numa_node`` (``renderD<N>/device/numa_node``, else the directory the class
  link resolves into, ``<device>/drm/renderD<N>``) is the planned node of that GPU, or one of
  the placement's nodes and memory nodes when the device is not one of its planned GPUs (a
  logical GPU of a partitioned GPU is a platform device ``amdgpu_xcp.<i>`` without
  ``numa_node``: skip).
- ``anchor`` (placement ``near``: the PCI device it is anchored on, ``address``, ``kind``,
  ``node``): ``/sys/bus/pci/devices/<address>/numa_node`` equals the node the plan read for it
  (absent device: fail; ``-1``: skip). A unit placed next to its NIC or NVMe does not start on
  the wrong node after the device moved or the firmware changed its locality.
- ``cpus``: the planned CPUs are in ``/sys/devices/system/cpu/online`` and in this process's
  affinity (``os.sched_getaffinity(0)``: systemd applies the unit's ``CPUAffinity=`` and its
  cgroup's ``AllowedCPUs=`` to ``ExecStartPre=`` too).
- ``memory``, per memory node of the placement (``mems``): its used ratio (``guard.read_nodes``:
  MemTotal - MemFree - file LRU pages) is below the act threshold (``settings.act_pct``), or its
  free + file pages (kB) hold the memory charged to it: all of ``memory_kb`` on ``memory_node``
  (the node the plan charges the budget to), else ``memory_kb`` split evenly over ``mems``.
- ``hugepages`` (placement ``hugepages``: ``size_kb``, ``count``, ``node``): the node's
  ``free_hugepages`` of that size is at least ``count``.

Exit status of ``main``: 0 when every check passed or was skipped, and in warn mode always; 1 when
a check failed in enforce mode; 2 for a usage or config error (unknown placement, malformed
config), in either mode.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, Optional

from .cpulist import format_cpulist, parse_cpulist
from .errors import CpulistError, GuardError, escape_controls
from .guard import NodeMemory, parse_thresholds, read_nodes, read_path

DEFAULT_CONFIG = "/etc/numafleet/guard.json"
CHECKS = ("gpu", "anchor", "cpus", "memory", "hugepages")
STATUSES = ("ok", "fail", "skip")
MODES = ("enforce", "warn")
SETTING_MODES = ("enforce", "warn", "off")
PROG = "numafleet-guard preflight"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# How each status is printed: a failure stands out in the journal.
_WORD = {"ok": "ok", "fail": "FAIL", "skip": "skip"}
_PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\Z")
_NVIDIA_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\Z")
NVIDIA_VENDOR = "0x10de"
_RENDER_NODE = re.compile(r"^/dev/dri/renderD([0-9]{1,6})\Z")
_REPLAN = "run site.yml to write the plan and the guard's config again"
_REFACT = "gather facts again and run site.yml (the plan is older than this hardware state)"

Reader = Callable[[str], Optional[str]]


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: name (gpu, cpus, memory, hugepages), status (ok, fail, skip) and a
    message naming the device, CPU set or node, the value found and, for a failure, the fix."""

    name: str
    status: str
    message: str

    def line(self, placement: str) -> str:
        """``numafleet-guard preflight <placement>: ok gpu ...`` (FAIL for fail)."""
        text = f"{PROG} {placement}: {_WORD[self.status]} {self.name} {self.message}"
        return escape_controls(text)  # one journal line, whatever a file held

    def as_dict(self) -> dict:
        """{name, status, message}."""
        return {"name": self.name, "status": self.status, "message": self.message}


# --- the placement entry ----------------------------------------------------------------------


def _ids(entry: dict, key: str, where: str) -> Optional[list]:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or any(
        isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in value
    ):
        raise GuardError(f"{where}.{key} is {value!r}, not a list of ids; {_REPLAN}")
    return sorted(set(value))


def _optional_int(entry: dict, key: str, where: str, low: int = 0) -> Optional[int]:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise GuardError(f"{where}.{key} is {value!r}, not an integer >= {low}; {_REPLAN}")
    return value


@dataclass(frozen=True)
class _Gpu:
    address: str
    uuid: Optional[str]
    node: Optional[int]


@dataclass(frozen=True)
class _Placement:
    name: str
    cpus: Optional[list]
    mems: Optional[list]
    nodes: list
    memory_node: Optional[int]
    memory_kb: int
    hugepages: Optional[tuple]  # (size_kb, count, node)
    gpus: tuple
    render_minors: tuple
    anchor: Optional[tuple] = None  # (address, kind, node) of near:


def parse_entry(entry: dict) -> _Placement:
    """The fields preflight reads of one config ``placements[]`` entry; raises GuardError naming
    the placement, the key and the fix (the role writes the config from the plan)."""
    if not isinstance(entry, dict):
        raise GuardError(
            f"a placements[] entry is {type(entry).__name__}, not a mapping; {_REPLAN}"
        )
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise GuardError(f"a placements[] entry has name {name!r}; {_REPLAN}")
    where = f"placement {name!r}"
    nodes = _ids(entry, "nodes", where) or []
    node = _optional_int(entry, "node", where)
    if node is not None and node not in nodes:
        nodes = sorted(nodes + [node])
    hugepages = entry.get("hugepages")
    pages = None
    if hugepages is not None:
        if not isinstance(hugepages, dict):
            raise GuardError(f"{where}.hugepages is {hugepages!r}, not a mapping; {_REPLAN}")
        size = _optional_int(hugepages, "size_kb", f"{where}.hugepages", 1)
        count = _optional_int(hugepages, "count", f"{where}.hugepages") or 0
        page_node = _optional_int(hugepages, "node", f"{where}.hugepages")
        if count and size is None:
            raise GuardError(f"{where}.hugepages has a count but no size_kb; {_REPLAN}")
        if count:
            pages = (size, count, page_node)
    gpus = []
    for index, gpu in enumerate(entry.get("gpus") or ()):
        gwhere = f"{where}.gpus[{index}]"
        if not isinstance(gpu, dict):
            raise GuardError(f"{gwhere} is {gpu!r}, not a mapping; {_REPLAN}")
        address = gpu.get("address")
        if not isinstance(address, str) or not _PCI_ADDRESS.match(address):
            raise GuardError(f"{gwhere}.address is {address!r}, not a PCI address; {_REPLAN}")
        uuid = gpu.get("uuid")
        if uuid is not None and (not isinstance(uuid, str) or not uuid.isprintable()):
            raise GuardError(f"{gwhere}.uuid is {uuid!r}; {_REPLAN}")
        gpus.append(_Gpu(address.lower(), uuid or None, _optional_int(gpu, "node", gwhere)))
    anchor = None
    near = entry.get("near")
    if near is not None:
        if not isinstance(near, dict):
            raise GuardError(f"{where}.near is {near!r}, not a mapping; {_REPLAN}")
        address = near.get("address")
        if not isinstance(address, str) or not _PCI_ADDRESS.match(address):
            raise GuardError(f"{where}.near.address is {address!r}, not a PCI address; {_REPLAN}")
        kind = near.get("kind")
        anchor = (
            address.lower(),
            kind if isinstance(kind, str) and kind.isprintable() else None,
            _optional_int(near, "node", f"{where}.near"),
        )
    minors = []
    devices = entry.get("device_allow")
    if devices is not None:
        if not isinstance(devices, list) or not all(isinstance(p, str) for p in devices):
            raise GuardError(f"{where}.device_allow is {devices!r}, not a list of paths; {_REPLAN}")
        for path in devices:
            match = _RENDER_NODE.match(path)
            if match:
                minors.append(int(match.group(1)))
            elif path != "/dev/kfd":
                raise GuardError(
                    f"{where}.device_allow has {path!r}, not /dev/kfd or /dev/dri/renderD<N>; "
                    f"{_REPLAN}"
                )
    return _Placement(
        name=name,
        cpus=_ids(entry, "cpus", where),
        mems=_ids(entry, "mems", where),
        nodes=nodes,
        memory_node=_optional_int(entry, "memory_node", where),
        memory_kb=_optional_int(entry, "memory_kb", where) or 0,
        hugepages=pages,
        gpus=tuple(gpus),
        render_minors=tuple(sorted(set(minors))),
        anchor=anchor,
    )


# --- the checks -------------------------------------------------------------------------------


def _node_value(text: Optional[str]) -> Optional[int]:
    """A sysfs numa_node text as an int (-1 stays -1); None when it is no integer."""
    if text is None:
        return None
    text = text.replace("\0", "").strip()
    try:
        return int(text)
    except ValueError:
        return None


def parse_nvidia_uuid(text: str) -> Optional[str]:
    """The ``GPU UUID:`` value of a /proc/driver/nvidia/gpus/<address>/information text, or None
    when the driver printed none (it leaves the line out when it cannot read the UUID)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "GPU UUID":
            return value.strip() or None
    return None


def _check_pci_node(
    name: str, address: str, node: Optional[int], what: str, read: Reader, sysfs_root: str
) -> CheckResult:
    """CheckResult ``name``: the PCI device ``address`` (a ``what``: GPU, anchor device) is on
    ``node`` by ``/sys/bus/pci/devices/<address>/numa_node``."""
    base = f"{sysfs_root}/bus/pci/devices/{address}"
    planned = "no planned node" if node is None else f"planned node {node}"
    text = read(f"{base}/numa_node")
    found = _node_value(text)
    if text is None and read(f"{base}/vendor") is None:
        return CheckResult(
            name,
            "fail",
            f"{address} is not on this host ({base} does not exist): the {what} fell off "
            f"the bus or was moved; {_REFACT}",
        )
    if text is None:
        return CheckResult(name, "skip", f"{address}: {base}/numa_node is absent "
                                         f"(kernel without NUMA); {planned}")  # fmt: skip
    if found is None:
        return CheckResult(name, "skip", f"{address}: {base}/numa_node reads "
                                         f"{text.strip()[:20]!r}; {planned}")  # fmt: skip
    if found < 0:
        return CheckResult(
            name,
            "skip",
            f"{address} shows no NUMA node (numa_node {found}: the firmware gives no "
            f"locality); {planned}",
        )
    if node is None:
        return CheckResult(name, "skip", f"{address} is on NUMA node {found}; {planned}")
    if found != node:
        return CheckResult(
            name, "fail", f"{address} is on NUMA node {found}, planned node {node}; {_REFACT}"
        )
    return CheckResult(name, "ok", f"{address} is on NUMA node {found} as planned")


def _check_pci_gpu(gpu: _Gpu, read: Reader, sysfs_root: str, procfs_root: str) -> list:
    base = f"{sysfs_root}/bus/pci/devices/{gpu.address}"
    result = _check_pci_node("gpu", gpu.address, gpu.node, "GPU", read, sysfs_root)
    out = [result]
    if result.status == "fail" and read(f"{base}/vendor") is None:
        return out
    if gpu.uuid is not None and _is_nvidia(gpu, read(f"{base}/vendor")):
        out.append(_check_nvidia_uuid(gpu, read, procfs_root))
    return out


def _is_nvidia(gpu: _Gpu, vendor: Optional[str]) -> bool:
    """Whether to match the GPU's UUID with the NVIDIA driver: its PCI vendor is NVIDIA's
    (0x10de); without a vendor file, its UUID has NVIDIA's form GPU-8-4-4-4-12 (AMD's is
    GPU-<16 hex digits>)."""
    if vendor is not None:
        return vendor.replace("\0", "").strip().lower() == NVIDIA_VENDOR
    return bool(_NVIDIA_UUID.match(gpu.uuid or ""))


def _check_nvidia_uuid(gpu: _Gpu, read: Reader, procfs_root: str) -> CheckResult:
    driver = f"{procfs_root}/driver/nvidia"
    path = f"{driver}/gpus/{gpu.address}/information"
    text = read(path)
    if text is None:
        if read(f"{driver}/version") is None:
            return CheckResult(
                "gpu", "skip", f"{gpu.address} UUID not checked: no {driver} (NVIDIA driver "
                "not loaded, or /proc not mounted here)"
            )  # fmt: skip
        return CheckResult(
            "gpu",
            "fail",
            f"{gpu.address} is not driven by the NVIDIA driver (no {path}; bound to another "
            "driver, or excluded with NVreg_ExcludedGpus); bind it to nvidia or "
            f"{_REFACT[0].lower()}{_REFACT[1:]}",
        )
    found = parse_nvidia_uuid(text)
    if found is None:
        return CheckResult("gpu", "skip", f"{gpu.address}: the driver shows no UUID in {path}")
    if found.lower() != gpu.uuid.lower():
        return CheckResult(
            "gpu",
            "fail",
            f"{gpu.address} is {found}, planned {gpu.uuid}: the GPU was replaced; {_REFACT}",
        )
    return CheckResult("gpu", "ok", f"{gpu.address} is {found} as planned")


def _render_device_node(minor: int, read: Reader, sysfs_root: str) -> tuple:
    """(device directory or None, numa_node text or None) of render node ``minor``."""
    link = f"{sysfs_root}/class/drm/renderD{minor}"
    text = read(f"{link}/device/numa_node")
    if text is not None:
        return os.path.realpath(f"{link}/device"), text
    # A tree without the device link (a capture): the class link resolves into
    # <device>/drm/renderD<N>, so the device is two levels up.
    device = os.path.dirname(os.path.dirname(os.path.realpath(link)))
    return device, read(f"{device}/numa_node")


def _check_render_node(
    minor: int, placement: _Placement, read: Reader, sysfs_root: str
) -> CheckResult:
    link = f"{sysfs_root}/class/drm/renderD{minor}"
    name = f"/dev/dri/renderD{minor}"
    if read(f"{link}/dev") is None:
        return CheckResult(
            "gpu",
            "fail",
            f"{name} does not exist (no {link}): its GPU or logical GPU is gone or the "
            f"compute partition changed; {_REFACT}",
        )
    device, text = _render_device_node(minor, read, sysfs_root)
    owner = os.path.basename(device)
    planned_gpu = next((g for g in placement.gpus if g.address == owner.lower()), None)
    if planned_gpu is not None and planned_gpu.node is not None:
        local = [planned_gpu.node]
    else:
        local = sorted(set(placement.nodes) | set(placement.mems or ()))
    planned = f"planned node {format_cpulist(local)}" if local else "no planned node"
    found = _node_value(text)
    if found is None or found < 0:
        return CheckResult(
            "gpu", "skip", f"{name} ({owner}) shows no NUMA node (a logical GPU's platform "
            f"device has none); {planned}"
        )  # fmt: skip
    if not local:
        return CheckResult("gpu", "skip", f"{name} ({owner}) is on NUMA node {found}; {planned}")
    if found not in local:
        return CheckResult(
            "gpu", "fail", f"{name} ({owner}) is on NUMA node {found}, {planned}; {_REFACT}"
        )
    return CheckResult("gpu", "ok", f"{name} ({owner}) is on NUMA node {found} as planned")


def check_gpus(placement: _Placement, read: Reader, sysfs_root: str, procfs_root: str) -> list:
    """CheckResults ``gpu`` of every planned GPU and render node; [] when none is planned."""
    out = []
    for gpu in placement.gpus:
        out.extend(_check_pci_gpu(gpu, read, sysfs_root, procfs_root))
    for minor in placement.render_minors:
        out.append(_check_render_node(minor, placement, read, sysfs_root))
    return out


def check_anchor(placement: _Placement, read: Reader, sysfs_root: str) -> list:
    """CheckResult ``anchor`` of the PCI device the placement is anchored on (``near``); []
    without one."""
    if placement.anchor is None:
        return []
    address, kind, node = placement.anchor
    what = f"anchor device ({kind})" if kind else "anchor device"
    return [_check_pci_node("anchor", address, node, what, read, sysfs_root)]


def _online_per_cpu(planned: set, read: Reader, sysfs_root: str) -> Optional[set]:
    """The planned CPUs that are online by their own cpu<N>/online file (kernels before the
    summary file, 2.6.x); None when a planned CPU has neither that file nor a cpu<N> directory
    (cpu0 often has no online file: it cannot go offline)."""
    online = set()
    for cpu in sorted(planned):
        base = f"{sysfs_root}/devices/system/cpu/cpu{cpu}"
        text = read(f"{base}/online")
        if text is not None:
            if text.replace("\0", "").strip() != "0":
                online.add(cpu)
        elif read(f"{base}/topology/core_id") is not None:
            online.add(cpu)
        else:
            return None
    return online


def check_cpus(
    placement: _Placement, read: Reader, affinity: Optional[set], sysfs_root: str
) -> list:
    """CheckResult ``cpus``: planned CPUs online and in ``affinity`` (None: not checked)."""
    if not placement.cpus:
        return []
    planned = set(placement.cpus)
    shown = format_cpulist(planned)
    online_path = f"{sysfs_root}/devices/system/cpu/online"
    text = read(online_path)
    problems, unknown = [], []
    if text is None:
        online = _online_per_cpu(planned, read, sysfs_root)
        if online is None:
            unknown.append(f"{online_path} is absent")
        elif planned - online:
            problems.append(
                f"CPUs {format_cpulist(planned - online)} are offline (their "
                f"cpu<N>/online reads 0); bring them online or {_REFACT}"
            )
    else:
        try:
            online = set(parse_cpulist(text))
        except CpulistError as exc:
            online = None
            unknown.append(f"{online_path}: {exc}")
        if online is not None and planned - online:
            problems.append(
                f"CPUs {format_cpulist(planned - online)} are offline (online: "
                f"{format_cpulist(online)}); bring them online or {_REFACT}"
            )
    if affinity is not None and planned - set(affinity):
        problems.append(
            f"CPUs {format_cpulist(planned - set(affinity))} are outside this process's CPU "
            f"affinity {format_cpulist(affinity) or '(none)'} (the unit's AllowedCPUs= / "
            "CPUAffinity= or a cpuset above it differ from the plan); run site.yml"
        )
    if problems:
        return [CheckResult("cpus", "fail", f"{shown}: " + "; ".join(problems))]
    if unknown:
        return [CheckResult("cpus", "skip", f"{shown}: " + "; ".join(unknown))]
    where = "online and in this process's affinity" if affinity is not None else "online"
    return [CheckResult("cpus", "ok", f"{shown} {where}")]


def _mib(kb: int) -> str:
    return f"{kb // 1024} MiB"


def _charged_kb(placement: _Placement) -> dict:
    """{node: kB of memory_kb charged to it}."""
    mems = placement.mems or []
    if not mems or not placement.memory_kb:
        return {}
    if placement.memory_node is not None:
        return {placement.memory_node: placement.memory_kb}
    share = -(-placement.memory_kb // len(mems))
    return dict.fromkeys(mems, share)


def check_memory(placement: _Placement, nodes: dict, act_pct: float, sysfs_root: str) -> list:
    """CheckResults ``memory``, one per memory node; nodes: {id: NodeMemory} (guard.read_nodes)."""
    charged = _charged_kb(placement)
    out = []
    for node_id in placement.mems or ():
        node: Optional[NodeMemory] = nodes.get(node_id)
        if node is None:
            out.append(
                CheckResult(
                    "memory",
                    "skip",
                    f"node {node_id}: no {sysfs_root}/devices/system/node/node{node_id}/meminfo "
                    "(node offline, or not shown here)",
                )
            )
            continue
        if node.used_ratio is None:
            out.append(CheckResult("memory", "skip", f"node {node_id} has no memory (MemTotal 0)"))
            continue
        pct = node.used_ratio * 100
        head = f"node {node_id} is {pct:.1f}% used (act {act_pct:g}%)"
        room_kb = node.free_kb + node.file_kb
        need = charged.get(node_id, 0)
        if pct < act_pct:
            out.append(CheckResult("memory", "ok", head))
        elif room_kb >= need:
            planned = f"the {_mib(need)} planned here" if need else "no memory budget planned here"
            out.append(
                CheckResult(
                    "memory", "ok", f"{head}, but its {_mib(room_kb)} free or page cache hold "
                    f"{planned}"
                )
            )  # fmt: skip
        else:
            out.append(
                CheckResult(
                    "memory",
                    "fail",
                    f"{head} and has {_mib(room_kb)} free or page cache, less than the "
                    f"{_mib(need)} planned here: the service would spill to another node or be "
                    "reclaimed; free memory on the node (stop or move a service), or lower "
                    "memory_kb",
                )
            )
    return out


def check_hugepages(placement: _Placement, nodes: dict, sysfs_root: str) -> list:
    """CheckResult ``hugepages``: free pages of the planned size on the planned node >= count."""
    if placement.hugepages is None:
        return []
    size_kb, count, node_id = placement.hugepages
    if node_id is None:
        node_id = placement.memory_node
    if node_id is None and placement.mems and len(placement.mems) == 1:
        node_id = placement.mems[0]
    if node_id is None:
        return [CheckResult("hugepages", "skip", f"{count} x {size_kb} kB: no planned node")]
    pool_dir = f"{sysfs_root}/devices/system/node/node{node_id}/hugepages/hugepages-{size_kb}kB"
    node = nodes.get(node_id)
    pool = None if node is None else next((p for p in node.hugepages if p.size_kb == size_kb), None)
    if pool is None:
        return [
            CheckResult(
                "hugepages",
                "fail",
                f"node {node_id} has no {size_kb} kB pool ({pool_dir} absent), the placement "
                f"needs {count} pages; run site.yml (hugepages layer)",
            )
        ]
    if pool.free < count:
        return [
            CheckResult(
                "hugepages",
                "fail",
                f"node {node_id} has {pool.free} free {size_kb} kB pages of {pool.total}, the "
                f"placement needs {count}: another service holds them, or files left in a "
                "hugetlbfs mount do; run site.yml (hugepages layer) or free them",
            )
        ]
    return [
        CheckResult(
            "hugepages",
            "ok",
            f"node {node_id} has {pool.free} free {size_kb} kB pages of {pool.total}, "
            f"{count} needed",
        )
    ]


def check(
    spec_entry: dict,
    settings: dict,
    read: Reader,
    affinity: Optional[set],
    sysfs_root: str = "/sys",
    procfs_root: str = "/proc",
) -> list:
    """CheckResults of one config placement (gpu, anchor, cpus, memory, hugepages; a check that does not
    apply gives none). ``settings``: the config's settings (``act_pct``, default 90);
    ``affinity``: this process's CPU set, None to leave it out. Raises GuardError for a malformed
    entry or settings; a file that cannot be read (``read`` raised GuardError) fails its check."""
    placement = parse_entry(spec_entry)
    act_pct = _act_pct(settings)
    out = []
    out.extend(_guarded("gpu", lambda: check_gpus(placement, read, sysfs_root, procfs_root)))
    out.extend(_guarded("anchor", lambda: check_anchor(placement, read, sysfs_root)))
    out.extend(_guarded("cpus", lambda: check_cpus(placement, read, affinity, sysfs_root)))
    sizes = (placement.hugepages[0],) if placement.hugepages else ()
    try:
        nodes, dummy = read_nodes(read, sysfs_root, sizes)
    except GuardError as exc:
        return out + [
            CheckResult(name, "fail", f"cannot read the node memory: {exc}")
            for name in ("memory", "hugepages")
            if name == "memory" or placement.hugepages
        ]
    by_id = {node.id: node for node in nodes}
    out.extend(check_memory(placement, by_id, act_pct, sysfs_root))
    out.extend(check_hugepages(placement, by_id, sysfs_root))
    return out


def _guarded(name: str, run: Callable[[], list]) -> list:
    try:
        return run()
    except GuardError as exc:
        return [CheckResult(name, "fail", f"cannot read: {exc}")]


def _act_pct(settings) -> float:
    if not isinstance(settings, dict):
        raise GuardError(f"settings are {type(settings).__name__}, not a mapping; {_REPLAN}")
    values = {key: settings[key] for key in ("warn_pct", "act_pct") if key in settings}
    return parse_thresholds(values).act_pct


# --- the command ------------------------------------------------------------------------------


class _UsageError(Exception):
    """argparse's usage error or exit, turned into a return value (never a SystemExit)."""

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _UsageError(EXIT_USAGE, f"{self.format_usage().strip()}\n{PROG}: error: {message}")

    def exit(self, status=0, message=None):
        raise _UsageError(status, message or "")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Check, before a pinned unit starts, that its planned GPUs, CPUs, memory "
        "nodes and hugepages are there (run as the unit's ExecStartPre=).",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="enforce: exit 1 when a check fails (the unit does not start); warn: report and "
        "exit 0. Default: the config's settings.preflight, else warn.",
    )
    parser.add_argument(
        "--config",
        default=None,
        help=f"the guard's config (default {DEFAULT_CONFIG}); read only when the caller did not "
        "pass the config already",
    )
    parser.add_argument("placement", help="the placement's name (or its unit's name)")
    return parser


def load_config(path: str) -> dict:
    """The guard's config at ``path`` as a dict; raises GuardError naming the path and the fix."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise GuardError(f"{path}: {exc.strerror or 'cannot be read'}; {_REPLAN}") from None
    except ValueError as exc:
        raise GuardError(f"{path} is not JSON ({exc}); {_REPLAN}") from None
    if not isinstance(data, dict):
        raise GuardError(f"{path} holds {type(data).__name__}, not a mapping; {_REPLAN}")
    return data


def find_placement(config: dict, name: str, config_path: str) -> dict:
    """The config's placements[] entry named ``name`` (or whose unit is ``name``); raises
    GuardError naming the config's placements when there is none."""
    entries = config.get("placements") if isinstance(config, dict) else None
    if not isinstance(entries, list):
        raise GuardError(f"{config_path} has no placements list; {_REPLAN}")
    named = [e for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)]
    for key in ("name", "unit"):
        for entry in named:
            if entry.get(key) == name:
                return entry
    known = ", ".join(sorted(e["name"] for e in named)) or "none"
    raise GuardError(
        f"no placement named {name!r} in {config_path} (its placements: {known}); use one of "
        f"them, or {_REPLAN} when the placement is new"
    )


def _default_affinity() -> Optional[set]:
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        return None
    try:
        return set(getter(0))
    except OSError:
        return None


def _stdout(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(
    argv: list,
    config: Optional[dict],
    read: Optional[Reader] = None,
    affinity: Optional[set] = None,
    out: Optional[Callable[[str], None]] = None,
    *,
    sysfs_root: str = "/sys",
    procfs_root: str = "/proc",
) -> int:
    """Run ``preflight`` with ``argv`` (the words after ``preflight``) and print one line per
    check result through ``out`` (default: stdout); returns the exit status (0, 1, 2).

    ``config``: the loaded guard config, or None to load ``--config`` (default
    /etc/numafleet/guard.json). ``read`` defaults to guard.read_path, ``affinity`` to
    os.sched_getaffinity(0). Usage and config errors are a line ``numafleet-guard preflight:
    error: ...`` naming the fix, and exit 2; never a traceback.
    """
    write = out or _stdout

    def emit(text: str) -> None:
        write(escape_controls(text))  # one line per record, whatever the config or a file held

    try:
        args = _parser().parse_args(list(argv))
    except _UsageError as exc:
        if exc.message:
            for line in exc.message.rstrip("\n").splitlines():
                emit(line)
        return exc.status
    config_path = args.config or DEFAULT_CONFIG
    try:
        if config is None:
            config = load_config(config_path)
        entry = find_placement(config, args.placement, config_path)
        name = entry["name"]
        settings = config.get("settings") or {}
        if not isinstance(settings, dict):
            raise GuardError(f"{config_path}: settings is not a mapping; {_REPLAN}")
        mode = args.mode or settings.get("preflight") or "warn"
        if mode not in SETTING_MODES:
            raise GuardError(
                f"{config_path}: settings.preflight is {mode!r}; set numafleet_preflight to one "
                f"of {', '.join(SETTING_MODES)} and {_REPLAN}"
            )
        if mode == "off":
            emit(f"{PROG} {name}: skip all (numafleet_preflight is off)")
            return EXIT_OK
        if affinity is None:
            affinity = _default_affinity()
        results = check(
            entry, settings, read or read_path, affinity, sysfs_root=sysfs_root,
            procfs_root=procfs_root,
        )  # fmt: skip
    except GuardError as exc:
        host = config.get("host") if isinstance(config, dict) else None
        where = f" (host {host})" if isinstance(host, str) and host else ""
        emit(f"{PROG}: error{where}: {exc}")
        return EXIT_USAGE
    for result in results:
        write(result.line(name))
    failed = [r for r in results if r.status == "fail"]
    counts = ", ".join(f"{sum(r.status == s for r in results)} {s}" for s in STATUSES)
    if not failed:
        emit(f"{PROG} {name}: passed ({counts})")
        return EXIT_OK
    if mode == "enforce":
        emit(f"{PROG} {name}: {len(failed)} failed ({counts}); enforce mode: the unit does not "
             "start (numafleet_preflight: warn starts it anyway)")  # fmt: skip
        return EXIT_FAILED
    emit(f"{PROG} {name}: {len(failed)} failed ({counts}); warn mode: the unit starts anyway")
    return EXIT_OK


__all__ = [
    "CHECKS",
    "DEFAULT_CONFIG",
    "CheckResult",
    "check",
    "check_cpus",
    "check_gpus",
    "check_hugepages",
    "check_memory",
    "find_placement",
    "load_config",
    "main",
    "parse_entry",
    "parse_nvidia_uuid",
]
