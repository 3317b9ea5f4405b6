"""hwloc's expected output as an independent oracle for the sysfs readers (test helper).

hwloc's regression data (tests/unit/fixtures/sysfs/hwloc/) pairs each Linux sysfs dump with the
topology lstopo computed from it; qemu-2node-pxb comes with lstopo's view of the live guest.
This module

* parses that expected output: ``.xml`` (``parse_xml``) and ``.console`` (``parse_console``)
  into {NUMA node: CPUs} and {PCI bus id: CPUs local to it};
* reads the few hwloc *inputs* that are not in our facts (``read_hwloc_inputs``): the .test file's
  ``HWLOC_PCI_LOCALITY``, the NVIDIA driver's ``numa_status`` files, the nodes' HMAT
  ``access1``/``access0`` initiators and the process's cgroup cpuset;
* turns our raw sysfs facts into what hwloc would show (``normalise_for_hwloc``). That function
  applies hwloc's documented differences and nothing else; its docstring lists them.

``compare(machine)`` runs one comparison; ``python tests/unit/hwloc_oracle.py`` prints the
results table kept in tests/unit/fixtures/sysfs/README.md.
"""

from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

# Run as a script: find the collection (the checkout's symlink tree) and fixtures/trees.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / ".collections"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import pci
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.cpulist import parse_cpulist
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.facts import read_numa_facts
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
HWLOC_DIR = FIXTURES / "sysfs" / "hwloc"
QEMU_DIR = FIXTURES / "sysfs" / "qemu"

# ---------------------------------------------------------------- hwloc output


@dataclass(frozen=True)
class HwlocView:
    """What one hwloc output file says: node -> CPUs, PCI bus id -> local CPUs, all PUs."""

    source: str
    nodes: dict
    pci: dict
    pus: frozenset


def parse_bitmap(text: str) -> frozenset:
    """CPUs of an hwloc bitmap ("0x000000ff,0xffffffff"; an empty field is a zero word)."""
    words = text.strip().split(",")
    cpus = set()
    for position, word in enumerate(reversed(words)):
        word = word.strip()
        if word.lower().startswith("0x"):
            word = word[2:]
        if not word:
            continue
        if "f...f" in word:
            raise ValueError(f"infinite hwloc bitmap {text!r} is not a CPU set")
        value = int(word, 16)
        cpus.update(position * 32 + bit for bit in range(32) if value >> bit & 1)
    return frozenset(cpus)


def parse_xml(path) -> HwlocView:
    """HwlocView of an lstopo XML file (v2/v3 format)."""
    root = ET.parse(path).getroot()
    nodes: dict = {}
    locality: dict = {}
    machine = root.find("object")

    def walk(obj, inherited: frozenset) -> None:
        own = obj.get("cpuset")
        cpus = parse_bitmap(own) if own is not None else inherited
        kind = obj.get("type")
        if kind == "NUMANode":
            nodes[int(obj.get("os_index"))] = cpus
        if obj.get("pci_busid"):
            locality[obj.get("pci_busid").lower()] = inherited if own is None else cpus
        for child in obj.findall("object"):
            walk(child, cpus)

    walk(machine, frozenset())
    return HwlocView(Path(path).name, nodes, locality, parse_bitmap(machine.get("cpuset")))


_IO_TYPES = {
    "Bridge",
    "HostBridge",
    "PCIBridge",
    "PCI",
    "OSDev",
    "Block",
    "Net",
    "OpenFabrics",
    "DMA",
    "GPU",
    "CoProc",
    "Misc",
    "MemCache",
}
_PU_RE = re.compile(r"^PU (?:L#\d+ \()?P#(\d+)")
_NODE_RE = re.compile(r"^NUMANode(?:\([^)]*\))? (?:L#\d+ \()?P#(\d+)")
_SUMMARY_RE = re.compile(
    r"^(depth \d+:|Special depth|\d+ processors not represented|CPU kind|Topology infos|Relative)"
)
_BUSID_RE = re.compile(r"(?:busid=)?((?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])")


@dataclass
class _Line:
    segments: list
    parent: _Line | None
    children: list = field(default_factory=list)

    def kind(self) -> str:
        return re.split(r"[\s(\[]", self.segments[0], maxsplit=1)[0]

    def pus(self) -> set:
        found = {int(m.group(1)) for seg in self.segments if (m := _PU_RE.match(seg))}
        for child in self.children:
            found |= child.pus()
        return found


def parse_console(path) -> HwlocView:
    """HwlocView of lstopo console output (``-v`` or ``-p``; ``A + B`` chains are one line).

    A node's CPUs are the PU P# numbers under its parent object; a PCI device's are the PUs under
    its nearest ancestor that is not an I/O object (HostBridge, PCIBridge, ...).
    """
    text = Path(path).read_text()
    top = _Line(["<root>"], None)
    stack: list = [(-1, top)]
    for raw in text.splitlines():
        stripped = raw.strip()
        if _SUMMARY_RE.match(stripped):
            break
        if not stripped:
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        while stack[-1][0] >= indent:
            stack.pop()
        line = _Line([seg.strip() for seg in stripped.split(" + ")], stack[-1][1])
        stack[-1][1].children.append(line)
        stack.append((indent, line))

    nodes: dict = {}
    locality: dict = {}

    def visit(line: _Line) -> None:
        for index, seg in enumerate(line.segments):
            node = _NODE_RE.match(seg)
            if node:
                scope = line if index else line.parent
                nodes[int(node.group(1))] = frozenset(scope.pus())
            if seg.startswith(("PCI ", "PCIBridge L#")):
                bus = _BUSID_RE.search(seg)
                if bus:
                    busid = bus.group(1) if bus.group(1).count(":") == 2 else "0000:" + bus.group(1)
                    scope = line.parent
                    while scope.parent is not None and scope.kind() in _IO_TYPES:
                        scope = scope.parent
                    locality[busid] = frozenset(scope.pus())
        for child in line.children:
            visit(child)

    for child in top.children:
        visit(child)
    machine = top.children[0]
    return HwlocView(Path(path).name, nodes, locality, frozenset(machine.pus()))


# ---------------------------------------------------------------- hwloc inputs


@dataclass(frozen=True)
class HwlocInputs:
    """hwloc inputs that our facts do not carry (None/empty when the tree has none)."""

    pci_locality: tuple = ()  # ((domain, first bus, last bus, frozenset CPUs), ...)
    nvidia_gpu_nodes: frozenset = frozenset()
    initiators: dict = field(default_factory=dict)  # node -> frozenset of initiator nodes
    allowed_cpus: frozenset | None = None


def parse_test_file(path) -> dict:
    """{"source", "target", "options", "env": [...]} of an hwloc ``NAME.test`` file."""
    out: dict = {"env": []}
    for line in Path(path).read_text().splitlines():
        if line.startswith("#") or ":" not in line:
            continue
        key, value = (part.strip() for part in line.split(":", 1))
        if key == "env":
            out["env"].append(value)
        else:
            out[key] = value
    return out


def parse_pci_locality(value: str) -> tuple:
    """HWLOC_PCI_LOCALITY entries "DDDD[:BB[-BB]] CPUSET;..." ('#' entries are comments)."""
    entries = []
    for item in value.split(";"):
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        where, cpuset = item.split()
        domain_s, _sep, buses = where.partition(":")
        first_s, _dash, last_s = buses.partition("-")
        first = int(first_s, 16) if first_s else 0
        last = int(last_s, 16) if last_s else (first if first_s else 0xFF)
        entries.append((int(domain_s, 16), first, last, parse_bitmap(cpuset)))
    return tuple(entries)


def _read(path: Path):
    try:
        return path.read_text().replace("\0", "").strip()
    except OSError:
        return None


def read_hwloc_inputs(fsroot, test_file=None) -> HwlocInputs:
    """The hwloc inputs of one dump: files under ``fsroot`` and the .test file's env lines."""
    root = Path(fsroot)
    forced: tuple = ()
    if test_file is not None:
        for env in parse_test_file(test_file)["env"]:
            match = re.match(r'^HWLOC_PCI_LOCALITY="(.*)"$', env)
            if match:
                forced = parse_pci_locality(match.group(1))
    gpu_nodes = set()
    for status in sorted(root.glob("proc/driver/nvidia/gpus/*/numa_status")):
        match = re.search(r"^Node:\s*(-?\d+)", _read(status) or "", re.M)
        if match and int(match.group(1)) >= 0:
            gpu_nodes.add(int(match.group(1)))
    initiators = {}
    for node_dir in sorted(root.glob("sys/devices/system/node/node*")):
        if not re.fullmatch(r"node\d+", node_dir.name):
            continue
        for access in ("access1", "access0"):
            found = sorted(p.name for p in (node_dir / access / "initiators").glob("node*"))
            if found:
                initiators[int(node_dir.name[4:])] = frozenset(int(n[4:]) for n in found)
                break
    return HwlocInputs(forced, frozenset(gpu_nodes), initiators, _cgroup_cpus(root))


def _cgroup_cpus(root: Path):
    """CPUs the dumping process's cpuset cgroup allowed (v1 or v2), or None if not recorded."""
    cgroup = _read(root / "proc/self/cgroup") or ""
    for line in cgroup.splitlines():
        hier, controllers, path = line.split(":", 2)
        if "cpuset" in controllers.split(","):
            text = _read(root / "sys/fs/cgroup/cpuset" / path.lstrip("/") / "cpuset.cpus")
        elif hier == "0":
            text = _read(root / "sys/fs/cgroup" / path.lstrip("/") / "cpuset.cpus.effective")
            if text is None:
                text = _read(root / "sys/fs/cgroup/cpuset.cpus.effective")
        else:
            continue
        if text:
            return frozenset(parse_cpulist(text))
    return None


# ---------------------------------------------------------------- normalisation


@dataclass(frozen=True)
class Normalised:
    """Our facts as hwloc would show them, and which rules changed something."""

    nodes: dict
    pci: dict
    applied: tuple


def normalise_for_hwloc(facts: dict, devices: list, inputs: HwlocInputs) -> Normalised:
    """Our raw-sysfs facts as hwloc shows them; applies exactly these documented differences.

    From tests/unit/fixtures/sysfs/README.md ("How hwloc differs from raw sysfs"):

    1. offline: hwloc drops offline CPUs (and CPUs the dumping process's cpuset cgroup forbade,
       ``inputs.allowed_cpus``) from every set;
    2. nvidia-gpu-memory: hwloc hides NUMA nodes that the NVIDIA driver reports as GPU memory in
       /proc/driver/nvidia/gpus/*/numa_status (default of HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES);
    3. cpu-only-memoryless: hwloc hides CPU-only, memory-less nodes;
    4. overlapping: a node whose CPUs intersect a lower-numbered node's is dropped (hwloc keeps
       the first of identical buggy nodes);
    5. cpuless-initiators: a CPU-less memory node gets its HMAT initiators' CPUs (access1, else
       access0), else the CPUs of the strictly nearest nodes by distance (hwloc's rule: none when
       all other nodes tie), else hwloc attaches it to the machine: all CPUs;
    6. pci-per-host-bridge: a PCI device's locality is ``local_cpus`` of the first (lowest bus
       id) function of its host bridge, or the HWLOC_PCI_LOCALITY entry covering that function's
       bus (an hwloc input, not sysfs), or all CPUs when that is empty.
    """
    applied = []
    online = set(facts["cpus"]["online"])
    allowed = online if inputs.allowed_cpus is None else online & inputs.allowed_cpus
    if any(set(node["cpus"]) - allowed for node in facts["nodes"]):
        applied.append("offline")
    raw = {node["id"]: node for node in facts["nodes"]}

    kept = {}
    seen: set = set()
    for nid in sorted(raw):
        node = raw[nid]
        cpus = set(node["cpus"])
        if nid in inputs.nvidia_gpu_nodes:
            applied.append("nvidia-gpu-memory")
            continue
        if cpus and not node["memory_kb"]:
            applied.append("cpu-only-memoryless")
            continue
        if cpus & seen:
            applied.append("overlapping")
            continue
        seen |= cpus
        kept[nid] = cpus

    ids = sorted(raw)
    for nid in [n for n in kept if not kept[n]]:
        applied.append("cpuless-initiators")
        initiators = inputs.initiators.get(nid, frozenset()) - {nid}
        cpus = set().union(*(kept.get(i, set()) for i in initiators)) if initiators else set()
        if not cpus:
            cpus = _nearest_by_distance(nid, ids, raw, kept)
        kept[nid] = cpus or set(allowed)
    nodes = {nid: frozenset(cpus & allowed) for nid, cpus in kept.items()}

    groups: dict = {}
    for dev in devices:
        key = dev.host_bridge or f"pci{dev.domain:04x}:{dev.bus:02x}"
        groups.setdefault(key, []).append(dev)
    pci_out = {}
    for members in groups.values():
        first = min(members, key=lambda d: pci.parse_address(d.address))
        local = (set(first.local_cpus or ()) & allowed) or set(allowed)
        for dev in members:
            if ((set(dev.local_cpus or ()) & allowed) or allowed) != local:
                applied.append("pci-per-host-bridge")
        for domain, bus_first, bus_last, cpus in inputs.pci_locality:
            if first.domain == domain and bus_first <= first.bus <= bus_last:
                local = (set(cpus) & allowed) or set(allowed)
                applied.append("hwloc-pci-locality-env")
                break
        for dev in members:
            pci_out[dev.address] = frozenset(local)
    return Normalised(nodes, pci_out, tuple(sorted(set(applied))))


def _nearest_by_distance(nid: int, ids: list, raw: dict, kept: dict) -> set:
    """hwloc's fixup_cpuless_node_locality_from_distances: CPUs of the strictly nearest nodes."""
    row = raw[nid]["distances"]
    if len(row) != len(ids):
        return set()
    others = [(row[j], other) for j, other in enumerate(ids) if other != nid and other in kept]
    if not others:
        return set()
    nearest = min(distance for distance, dummy in others)
    ties = [other for distance, other in others if distance == nearest]
    if nearest <= row[ids.index(nid)] or len(ties) == len(ids) - 1:
        return set()
    return set().union(*(kept[other] for other in ties))


# ---------------------------------------------------------------- comparisons


@dataclass(frozen=True)
class Case:
    """One comparison: a machine, an hwloc output file, and the .test file that made it."""

    machine: str
    expected: Path
    test_file: Path | None


def cases() -> list:
    """Every hwloc .test target plus qemu-2node-pxb's XML and console views."""
    out = []
    for test in sorted(HWLOC_DIR.glob("*.test")):
        spec = parse_test_file(test)
        machine = spec["source"][: -len(".tar.bz2")]
        out.append(Case(machine, HWLOC_DIR / spec["target"], test))
    for suffix in ("lstopo.xml", "lstopo.console"):
        out.append(Case("qemu-2node-pxb", QEMU_DIR / f"qemu-2node-pxb.{suffix}", None))
    return out


@dataclass(frozen=True)
class Result:
    """Outcome of one Case; ``mismatches`` is empty when ours equals hwloc's."""

    case: Case
    nodes_compared: int
    cpus_compared: int
    pci_compared: int
    raw_equal: tuple  # (nodes, PCI devices) equal to hwloc's before any normalisation
    applied: tuple
    mismatches: tuple


def view_of(path: Path) -> HwlocView:
    """Parse an hwloc output file by its suffix."""
    return parse_xml(path) if path.suffix == ".xml" else parse_console(path)


def compare(case: Case, fsroot) -> Result:
    """Compare our facts for the tree at ``fsroot`` with hwloc's output for ``case``."""
    sysfs_root, procfs_root = os.path.join(fsroot, "sys"), os.path.join(fsroot, "proc")
    facts = read_numa_facts(Reader(sysfs_root, procfs_root))
    node_cpus = {node["id"]: tuple(node["cpus"]) for node in facts["nodes"]}
    devices = pci.read_pci_devices(Reader(sysfs_root, procfs_root), node_cpus)
    view = view_of(case.expected)
    ours = normalise_for_hwloc(facts, devices, read_hwloc_inputs(fsroot, case.test_file))
    mismatches = []
    if set(ours.nodes) != set(view.nodes):
        mismatches.append(f"node ids: ours {sorted(ours.nodes)}, hwloc {sorted(view.nodes)}")
    for nid in sorted(set(ours.nodes) & set(view.nodes)):
        if ours.nodes[nid] != view.nodes[nid]:
            mismatches.append(
                f"node {nid}: ours {sorted(ours.nodes[nid])}, hwloc {sorted(view.nodes[nid])}"
            )
    for busid in sorted(view.pci):
        if busid not in ours.pci:
            mismatches.append(f"PCI {busid}: hwloc shows it, sysfs has no such device")
        elif ours.pci[busid] != view.pci[busid]:
            mismatches.append(
                f"PCI {busid}: ours {sorted(ours.pci[busid])}, hwloc {sorted(view.pci[busid])}"
            )
    cpus = set().union(*view.nodes.values()) if view.nodes else set()
    raw_nodes = {node["id"]: frozenset(node["cpus"]) for node in facts["nodes"]}
    raw_pci = {dev.address: frozenset(dev.local_cpus or ()) for dev in devices}
    raw_equal = (
        sum(raw_nodes.get(nid) == cpus_of for nid, cpus_of in view.nodes.items()),
        sum(raw_pci.get(busid) == cpus_of for busid, cpus_of in view.pci.items()),
    )
    return Result(
        case,
        len(view.nodes),
        len(cpus),
        len(view.pci),
        raw_equal,
        ours.applied,
        tuple(mismatches),
    )


def results_table(results: list) -> str:
    """Markdown table of comparison results (the one in fixtures/sysfs/README.md)."""
    rows = [
        "| dump | hwloc output | nodes | CPUs | PCI devices | equal before normalising "
        "(nodes, PCI) | normalisation rules used | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        verdict = "match" if not res.mismatches else "MISMATCH: " + "; ".join(res.mismatches)
        rows.append(
            f"| {res.case.machine} | {res.case.expected.name} | {res.nodes_compared} | "
            f"{res.cpus_compared} | {res.pci_compared} | {res.raw_equal[0]}, {res.raw_equal[1]} "
            f"| {', '.join(res.applied) or 'none'} | {verdict} |"
        )
    return "\n".join(rows)


def main() -> int:
    import tempfile

    import trees

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        roots: dict = {}
        for case in cases():
            if case.machine not in roots:
                roots[case.machine] = trees.materialize(case.machine, Path(tmp) / case.machine)
            results.append(compare(case, roots[case.machine]))
    print(results_table(results))
    return 1 if any(res.mismatches for res in results) else 0


if __name__ == "__main__":
    sys.exit(main())
