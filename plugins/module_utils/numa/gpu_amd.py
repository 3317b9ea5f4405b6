# Private to this collection: may change in any release.
"""AMD Instinct GPUs: identity, partitions and logical GPUs (XCPs) from sysfs, enriched by amdsmi.

sysfs first, for every AMD GPU that gpu.read_gpus found under bus/pci/devices:

- the PCI directory ``<sysfs>/bus/pci/devices/<address>/``: ``current_compute_partition`` /
  ``available_compute_partition`` (SPX, DPX, TPX, QPX, CPX), ``current_memory_partition`` /
  ``available_memory_partition`` (NPS1, NPS2, NPS4, NPS8; gpu.read_amd_partitions reads those),
  ``mem_info_vram_total`` (bytes), and, where the driver has the XCP configuration interface,
  ``compute_partition_config/supported_nps_configs`` (the memory partitions the compute
  partition named in ``compute_partition_config/xcp_config`` allows: the current one unless
  root selected another there; ``Not supported`` when the driver cannot switch NPS);
- the KFD topology ``<sysfs>/class/kfd/kfd/topology/nodes/<N>/{gpu_id,properties}``: one node per
  logical GPU (XCP) of a partitioned GPU, all with the GPU's ``domain`` and ``location_id`` =
  PCI bus << 8 | devfn, ORed with the partition's node id (kfd_topology_add_device: in the low
  bits since Linux 6.5-6.6, in bits 28-31 before), their own ``unique_id`` (decimal, 64 bit),
  ``drm_render_minor`` and ``num_xcc`` (XCDs of that XCP). Nodes are matched to the PCI GPU by
  domain, bus and device number (the function bits carry the partition id). CPU nodes have
  ``gpu_id`` 0. A GPU's logical GPUs are its nodes in node-id order (the driver adds them in
  partition order); partition 0 is the first.
- the DRM class ``<sysfs>/class/drm/card*``: the card whose device is the PCI function (the
  logical GPUs after the first are ``amdgpu_xcp`` platform devices, known here by their render
  minor only).

The UUID is the form ROCR_VISIBLE_DEVICES accepts and rocminfo prints: ``GPU-`` and the 16
lower-case hex digits of the KFD unique_id (ROCr's agent UUID); a unique_id of 0 means the
driver gives none (None).

amdsmi (the ``amdsmi`` Python module, passed in by ``load_amdsmi() -> (module, None) or (None,
reason)`` and loaded only when an AMD GPU is present) adds the model (asic market_name), VRAM,
partition modes and the process list, and becomes the record's ``source``.
"""

from __future__ import annotations

import copy
import re
from typing import Callable, Optional

from .sysfs import Reader

SOURCE_SYSFS = "sysfs"
SOURCE_AMDSMI = "amdsmi"
SOURCE_SNAPSHOT = "snapshot"
COMPATIBLE_TABLE = "table"
# AMD's MI300-series pairs (compute partition -> memory partitions it allows): no more memory
# partitions than logical GPUs; QPX with NPS4 as amd-smi's profile table lists it (ROCm 7.0.2).
# Used only when neither the driver (supported_nps_configs) nor amd-smi says.
MI300_COMPATIBLE = {
    "SPX": ("NPS1",),
    "DPX": ("NPS1",),
    "QPX": ("NPS1", "NPS4"),
    "CPX": ("NPS1", "NPS4"),
}
_MI300_GFX = 904  # KFD gfx_target_version 9.4.x (gfx940-gfx942: MI300A, MI300X, MI325X)
_MIB = 1 << 20
_MODES_RE = re.compile(r"[\s,]+")
_NPS_NAMES = ("NPS1", "NPS2", "NPS3", "NPS4", "NPS6", "NPS8")  # amdgpu_xcp.c nps_desc
_XCP_NAMES = ("SPX", "DPX", "TPX", "QPX", "CPX")


def gpu_uuid(unique_id: Optional[int]) -> Optional[str]:
    """``GPU-<16 hex>`` of a KFD unique_id, the form ROCR_VISIBLE_DEVICES accepts; None for 0/None."""
    if not unique_id:
        return None
    return f"GPU-{unique_id & 0xFFFFFFFFFFFFFFFF:016x}"


def render_node(minor: int) -> str:
    """The device path of DRM render minor ``minor`` (``/dev/dri/renderD<minor>``), the node a
    logical GPU's KFD ``drm_render_minor`` names."""
    return f"/dev/dri/renderD{minor}"


def logical_uuid_counts(records) -> dict:
    """{UUID (lower case): how many logical GPUs carry it} over ``records``, the ``amd`` records
    of a host's GPUs. More than one: the driver gave the logical GPUs of a partitioned GPU the
    GPU's unique_id, and ROCR_VISIBLE_DEVICES cannot select any of them by it (ROCr refuses a
    UUID that matches two or more agents)."""
    counts: dict = {}
    for record in records:
        for logical in (record or {}).get("logical_gpus") or ():
            if isinstance(logical, dict) and logical.get("uuid"):
                uuid = str(logical["uuid"]).lower()
                counts[uuid] = counts.get(uuid, 0) + 1
    return counts


def _properties(text: Optional[str]) -> dict:
    found: dict = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                found[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return found


def read_kfd_nodes(reader: Reader) -> dict:
    """{(domain, bus<<5|device): [KFD node record, ...]} of GPU nodes, node-id order.

    Record: {"kfd_node": int, "gpu_id": int, "unique_id": int|None, "render_minor": int|None,
    "num_xcc": int|None, "gfx_target_version": int|None, "partition_id": int|None,
    "hive_id": int|None (the XGMI hive; None when 0, a GPU in no hive)}. Source:
    class/kfd/kfd/topology/nodes/<N>/gpu_id and properties; nodes with gpu_id 0 (CPUs) skipped.
    """
    base = reader.sys("class", "kfd", "kfd", "topology", "nodes")
    found: dict = {}
    names = [n for n in reader.listdir(base, optional=True) if n.isdigit()]
    for name in sorted(names, key=int):
        gpu_id = reader.integer(f"{base}/{name}/gpu_id", optional=True)
        if not gpu_id:
            continue
        props = _properties(reader.text(f"{base}/{name}/properties", optional=True))
        location = props.get("location_id")
        if location is None:
            continue
        key = (props.get("domain", 0), (location & 0xFFFF) >> 3)
        part = (location >> 28) & 0xF or location & 0x7
        found.setdefault(key, []).append(
            {
                "kfd_node": int(name),
                "gpu_id": gpu_id,
                "unique_id": props.get("unique_id") or None,
                "render_minor": props.get("drm_render_minor"),
                "num_xcc": props.get("num_xcc"),
                "gfx_target_version": props.get("gfx_target_version"),
                "partition_id": part if part else None,
                "hive_id": props.get("hive_id") or None,
            }
        )
    return found


def _pci_key(address: str) -> tuple:
    domain, bus, rest = address.split(":")
    dev = rest.split(".")[0]
    return int(domain, 16), (int(bus, 16) << 5) | int(dev, 16)


def _drm_card(reader: Reader, address: str) -> Optional[str]:
    for name in reader.listdir(
        f"{reader.sys('bus', 'pci', 'devices', address)}/drm", optional=True
    ):
        if re.match(r"^card[0-9]+\Z", name):
            return name
    return None


def _modes(text: Optional[str]) -> list:
    return [token.upper() for token in _MODES_RE.split(text or "") if token]


def _nps_modes(text: Optional[str]) -> list:
    """Memory partition names of a driver list (``NPS1, NPS4``); ``Not supported`` gives []."""
    return [mode for mode in _modes(text) if mode in _NPS_NAMES]


def compatible_memory_partitions(
    compute: Optional[dict],
    memory: Optional[dict],
    supported_nps: Optional[list],
    gfx: Optional[int],
    selected: Optional[str] = None,
) -> tuple:
    """({compute mode: [memory modes]} or None, source "sysfs" | "table" | None).

    The table (MI300_COMPATIBLE, for KFD gfx_target_version 9.4.x) limited to the GPU's
    available modes; the driver's ``supported_nps_configs`` replaces the row of the compute
    mode it describes and makes the source "sysfs": ``selected``, the mode
    ``compute_partition_config/xcp_config`` names (the driver describes the configuration
    selected there; it is the current mode until root writes another), else the current mode.
    """
    if not compute or not compute.get("available"):
        return None, None
    available_nps = (memory or {}).get("available") or []
    result: Optional[dict] = None
    source = None
    if gfx is not None and gfx // 100 == _MI300_GFX:
        result = {
            mode: [nps for nps in MI300_COMPATIBLE.get(mode, ()) if nps in available_nps]
            for mode in compute["available"]
        }
        source = COMPATIBLE_TABLE
    described = selected or compute.get("current")
    if supported_nps and described:
        result = result or {}
        result[described] = list(supported_nps)
        source = SOURCE_SYSFS
    return result, source


def read_amd_gpu(reader: Reader, address: str, partition: Optional[dict], kfd: dict) -> dict:
    """The contract's ``amd`` record of one AMD GPU from sysfs (source "sysfs").

    ``partition``: gpu.read_amd_partitions' {compute, memory} (or None); ``kfd``: read_kfd_nodes'.
    Missing files give None values, never an error.
    """
    device = reader.sys("bus", "pci", "devices", address)
    nodes = kfd.get(_pci_key(address), [])
    compute = copy.deepcopy((partition or {}).get("compute"))
    memory = copy.deepcopy((partition or {}).get("memory"))
    supported = _nps_modes(
        reader.text(f"{device}/compute_partition_config/supported_nps_configs", optional=True)
    )
    selected = [
        mode
        for mode in _modes(
            reader.text(f"{device}/compute_partition_config/xcp_config", optional=True)
        )
        if mode in _XCP_NAMES
    ]
    gfx = nodes[0]["gfx_target_version"] if nodes else None
    compatible, compatible_source = compatible_memory_partitions(
        compute, memory, supported or None, gfx, selected[0] if selected else None
    )
    vram = reader.integer(f"{device}/mem_info_vram_total", optional=True)
    logical, xcd = [], 0
    for index, node in enumerate(nodes):
        count = node["num_xcc"] or 0
        logical.append(
            {
                "index": index,
                "uuid": gpu_uuid(node["unique_id"]),
                "unique_id": hex(node["unique_id"]) if node["unique_id"] else None,
                "kfd_node": node["kfd_node"],
                "gpu_id": node["gpu_id"],
                "render_minor": node["render_minor"],
                "xcds": list(range(xcd, xcd + count)),
            }
        )
        xcd += count
    first = logical[0] if logical else {}
    return {
        "model": None,
        "kfd_node": first.get("kfd_node"),
        "gpu_id": first.get("gpu_id"),
        "unique_id": first.get("unique_id"),
        "uuid": first.get("uuid"),
        "hive_id": hex(nodes[0]["hive_id"]) if nodes and nodes[0].get("hive_id") else None,
        "drm_card": _drm_card(reader, address),
        "render_minor": first.get("render_minor"),
        "vram_total_mib": vram // _MIB if vram else None,
        "compute_partition": compute,
        "memory_partition": memory,
        "compatible_memory_partitions": compatible,
        "compatible_source": compatible_source,
        "xcd_count": xcd or None,
        "logical_gpus": logical,
        "processes": None,
        "source": SOURCE_SYSFS,
    }


def _call(module, name: str, *args):
    fn = getattr(module, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:  # the library's AmdSmiException family; one field lost, not the run
        return None


def _version(module) -> Optional[str]:
    info = _call(module, "amdsmi_get_lib_version")
    if isinstance(info, dict):
        return ".".join(str(info[k]) for k in ("major", "minor", "release") if k in info) or None
    return None


def enrich_amdsmi(module, records: dict) -> dict:
    """Add amdsmi values to ``records`` ({PCI address: amd record}, changed in place).

    Calls amdsmi_init, amdsmi_get_processor_handles, per handle amdsmi_get_gpu_device_bdf,
    amdsmi_get_gpu_asic_info (market_name -> model), amdsmi_get_gpu_vram_info (vram_size MB ->
    vram_total_mib), amdsmi_get_gpu_compute_partition / amdsmi_get_gpu_memory_partition
    (current modes), amdsmi_get_gpu_process_list ([{pid, name}]), then amdsmi_shut_down. A
    record amdsmi reports gets source "amdsmi". Returns the top-level ``amdsmi`` fact
    {available, reason, version}; an exception of the library makes available False with its
    text as reason (records keep their sysfs values).
    """
    try:
        module.amdsmi_init(module.AmdSmiInitFlags.INIT_AMD_GPUS)
    except Exception as exc:
        return {"available": False, "reason": f"amdsmi_init failed: {exc}", "version": None}
    try:
        version = _version(module)
        handles = module.amdsmi_get_processor_handles()
        for handle in handles:
            bdf = _call(module, "amdsmi_get_gpu_device_bdf", handle)
            record = records.get(str(bdf).lower()) if bdf else None
            if record is None:
                continue
            asic = _call(module, "amdsmi_get_gpu_asic_info", handle) or {}
            vram = _call(module, "amdsmi_get_gpu_vram_info", handle) or {}
            if asic.get("market_name"):
                record["model"] = str(asic["market_name"])
            if isinstance(vram.get("vram_size"), int) and vram["vram_size"] > 0:
                record["vram_total_mib"] = vram["vram_size"]
            for key, call in (
                ("compute_partition", "amdsmi_get_gpu_compute_partition"),
                ("memory_partition", "amdsmi_get_gpu_memory_partition"),
            ):
                mode = _call(module, call, handle)
                if mode and record[key] is not None:
                    record[key]["current"] = str(mode).upper()
                elif mode:
                    record[key] = {"current": str(mode).upper(), "available": []}
            procs = _call(module, "amdsmi_get_gpu_process_list", handle)
            if isinstance(procs, list):
                record["processes"] = [
                    {"pid": p.get("pid"), "name": p.get("name")}
                    for p in procs
                    if isinstance(p, dict)
                ]
            record["source"] = SOURCE_AMDSMI
    except Exception as exc:
        return {"available": False, "reason": f"amdsmi failed: {exc}", "version": None}
    finally:
        _call(module, "amdsmi_shut_down")
    return {"available": True, "reason": None, "version": version}


def recorded(facts: dict) -> Optional[dict]:
    """What a GPU snapshot keeps of AMD facts: {"amdsmi": fact, "gpus": {address: record}}.

    None when the facts have no AMD GPU (a snapshot of an NVIDIA host stays as before).
    """
    gpus = {e["address"]: copy.deepcopy(e["amd"]) for e in facts["gpus"] if e.get("amd")}
    if not gpus:
        return None
    return {"amdsmi": dict(facts["amdsmi"]), "gpus": gpus}


def annotate(
    reader: Reader, entries: list, load_amdsmi: Optional[Callable], replay: Optional[dict] = None
) -> dict:
    """Give every facts GPU entry its ``amd`` key; returns the top-level ``amdsmi`` fact.

    AMD entries get read_amd_gpu's record (enriched by amdsmi when ``load_amdsmi`` yields a
    module) and their ``uuid``, ``name`` and ``memory_total_mib`` from it; others get None.
    ``load_amdsmi`` is called only when an AMD GPU is present. ``replay`` (recorded() read back
    from a snapshot) replaces the record of each GPU it has, with source "snapshot", and the
    amdsmi fact; amdsmi is not loaded then.
    """
    amd = [entry for entry in entries if entry.get("vendor") == "amd"]
    for entry in entries:
        entry["amd"] = None
    if not amd:
        return {"available": False, "reason": "no AMD GPU", "version": None}
    kfd = read_kfd_nodes(reader)
    records = {
        e["address"]: read_amd_gpu(reader, e["address"], e.get("partition"), kfd) for e in amd
    }
    fact = {"available": False, "reason": "amdsmi not requested", "version": None}
    if replay is not None:
        fact = dict(replay["amdsmi"])
        for address, record in replay["gpus"].items():
            if address in records:
                records[address] = dict(copy.deepcopy(record), source=SOURCE_SNAPSHOT)
    elif load_amdsmi is not None:
        module, reason = load_amdsmi()
        fact = (
            enrich_amdsmi(module, records)
            if module is not None
            else {"available": False, "reason": reason, "version": None}
        )
    for entry in amd:
        apply_record(entry, records[entry["address"]])
    return fact


def apply_record(entry: dict, record: dict) -> None:
    """Set ``entry['amd']`` and the entry's uuid/name/memory_total_mib (credited in sources)."""
    entry["amd"] = record
    sources = entry.setdefault("sources", {})
    for key, value in (
        ("uuid", record["uuid"]),
        ("name", record["model"]),
        ("memory_total_mib", record["vram_total_mib"]),
    ):
        if value is not None and key in entry:
            entry[key] = value
            sources[key] = record["source"]
    entry["sources"] = dict(sorted(sources.items()))


__all__ = [
    "annotate",
    "apply_record",
    "compatible_memory_partitions",
    "enrich_amdsmi",
    "gpu_uuid",
    "read_amd_gpu",
    "read_kfd_nodes",
    "recorded",
]
