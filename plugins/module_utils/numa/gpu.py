# Private to this collection: may change in any release.
"""GPUs on PCI with their NUMA locality, enriched from NVML, ``nvidia-smi -q -x`` or a snapshot.

sysfs is the inventory and the only source of locality: a GPU is reported because it sits under
``/sys/bus/pci/devices``, and its node comes from there. NVML (through a pynvml-like object the
caller passes in), nvidia-smi's XML or a recorded snapshot only add what sysfs cannot know: UUID,
name, memory, modes, MIG layout, processes and NVLink peers. NVML's own NUMA id (the node of the
GPU's memory on coherent systems such as GH200) is kept apart as ``nvml_numa_node``.

NVML's reader is in gpu_nvml.py, nvidia-smi's in gpu_smi.py and snapshots in gpu_snapshot.py; each
is imported only when a run needs it (a module's every import is compiled on each execution).
The records and helpers they share with this module (GpuState, SysfsGpu, ENRICHED_FIELDS, ...)
are in gpu_records.py, which imports none of them.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import sys
from dataclasses import replace
from typing import Callable, Optional

from . import pci, topology
from .errors import CommandOutputError

# Shared records (gpu_records); some are only re-exported, read by callers as gpu.<name>.
from .gpu_records import (  # noqa: F401  pylint: disable=unused-import
    ENRICHED_FIELDS,
    NVIDIA_SMI_COMMAND,
    NVML_AFFINITY_WORDS,
    SNAPSHOT_FORMAT,
    SNAPSHOT_VERSION,
    SOURCE_NVIDIA_SMI,
    SOURCE_NVML,
    SOURCE_SNAPSHOT,
    SOURCE_SYSFS,
    GpuState,
    SysfsGpu,
    mig_memory_gb,
    normalise_bus_id,
    nvml_unavailable,
)
from .gpu_records import address_key as _address_key
from .gpu_records import quote as _quote
from .gpu_records import sorted_warnings as _sorted_warnings
from .sysfs import Reader

NVIDIA_SMI_MODES = ("auto", "always", "never")
# The library pynvml's nvmlInit loads on Linux, and the reason read_nvml gives when that fails
# (pynvml raises NVMLError_LibraryNotFound, "NVML Shared Library Not Found").
NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_LIBRARY_MISSING = "nvmlInit failed: NVML Shared Library Not Found"
_NVML_MODULE = "pynvml"
# node_source of a GPU whose sysfs numa_node is -1 and whose NVML CPU affinity at NODE scope
# (nvmlDeviceGetCpuAffinityWithinScope, nvml_cpu_affinity) lies within exactly one node's CPUs.
NODE_SOURCE_NVML = "nvml_cpu_affinity"
_SYSFS_FIELDS = (
    "address",
    "vendor",
    "vendor_id",
    "device_id",
    "numa_node",
    "node",
    "local_cpus",
    "switch",
    "root_port",
    "partition",
)
_VENDORS = {pci.VENDOR_NVIDIA: "nvidia", pci.VENDOR_AMD: "amd"}
_CARD_RE = re.compile(r"^card[0-9]+\Z")
_KILL_AFTER_S = 5


# ---------------------------------------------------------------------------------------------
# Shared helpers


# ---------------------------------------------------------------------------------------------
# sysfs: the inventory and the locality


def _partition_modes(reader: Reader, device: str, kind: str) -> Optional[dict]:
    current = reader.text(f"{device}/current_{kind}_partition", optional=True)
    available = reader.text(f"{device}/available_{kind}_partition", optional=True)
    if current is None and available is None:
        return None
    modes = [token.upper() for token in re.split(r"[\s,]+", available or "") if token]
    return {"current": current.upper() if current else None, "available": modes}


def read_amd_partitions(reader: Reader) -> dict:
    """{PCI address: {compute, memory}} of AMD Instinct partition modes of class/drm/card* devices.

    Reads ``{current,available}_{compute,memory}_partition`` of each card's device (the directory
    two levels above the resolved ``class/drm/cardN`` link, which is what ``cardN/device`` points
    to); a kind the driver does not offer is None. Cards whose device is not a PCI function (the
    per-partition ``amdgpu_xcp`` platform devices in CPX mode) are skipped.
    """
    base = reader.sys("class", "drm")
    found: dict = {}
    for name in reader.listdir(base, optional=True):
        if not _CARD_RE.match(name):
            continue
        device = os.path.dirname(os.path.dirname(reader.realpath(f"{base}/{name}")))
        address = os.path.basename(device).lower()
        try:
            pci.parse_address(address)
        except ValueError:
            continue
        if address in found:
            continue
        compute = _partition_modes(reader, device, "compute")
        memory = _partition_modes(reader, device, "memory")
        if compute is not None or memory is not None:
            found[address] = {"compute": compute, "memory": memory}
    return found


def read_gpus(reader: Reader, node_cpus: dict) -> list:
    """NVIDIA and AMD GPUs under <sysfs_root>/bus/pci/devices with their locality, by address.

    ``node_cpus`` ({node: CPUs}) lets a GPU whose ``numa_node`` is -1 take the one node whose CPUs
    equal, or strictly contain, its local CPUs (pci.infer_node). Bad files become warnings on ``reader``; nothing raises.
    """
    partitions = read_amd_partitions(reader)
    gpus = []
    for dev in pci.read_pci_devices(reader, node_cpus):
        if dev.kind != "gpu":
            continue
        vendor = _VENDORS.get(dev.vendor_id or "", "unknown")
        gpus.append(
            SysfsGpu(
                address=dev.address,
                vendor=vendor,
                vendor_id=dev.vendor_id,
                device_id=dev.device_id,
                numa_node=dev.numa_node,
                node=dev.node,
                node_source=dev.node_source,
                local_cpus=dev.local_cpus,
                switch=dev.switch,
                root_port=dev.root_port,
                partition=partitions.get(dev.address) if vendor == "amd" else None,
                numa_node_raw=dev.numa_node_raw,
            )
        )
    return gpus


def _smi_unavailable(reason: str) -> GpuState:
    return GpuState(
        source=None,
        nvml={"available": False, "reason": None, "driver_version": None},
        nvidia_smi={"used": False, "reason": reason, "driver_version": None},
        gpus={},
    )


def nvidia_smi_argv(
    nvidia_smi: Optional[str], timeout: Optional[str], seconds: int
) -> Optional[list]:
    """argv running ``nvidia-smi -q -x`` under coreutils ``timeout``, or None without nvidia-smi.

    ``timeout`` is the path of coreutils ``timeout`` (None: run nvidia-smi without a limit);
    ``seconds`` is the limit. Raises CommandOutputError when ``seconds`` is below 1.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
        raise CommandOutputError(
            NVIDIA_SMI_COMMAND,
            f"nvidia_smi_timeout is {_quote(seconds)}; set it to a whole number of seconds, "
            "1 or more",
        )
    if nvidia_smi is None:
        return None
    command = [nvidia_smi, "-q", "-x"]
    if timeout is None:
        return command
    return [timeout, f"--kill-after={_KILL_AFTER_S}", str(seconds)] + command


def read_nvidia_smi(
    runner: Optional[Callable], required: bool, timeout_s: Optional[int] = None
) -> GpuState:
    """GPU state from ``runner()`` -> (rc, stdout, stderr) of ``nvidia-smi -q -x``.

    ``runner`` is None when nvidia-smi is not installed. ``timeout_s`` is set when the runner runs
    it under coreutils ``timeout`` with that limit, so that status 124 or 137 means it timed out.
    Unless ``required``, a missing binary, a timeout, a non-zero exit or unusable output gives
    ``nvidia_smi.used: false`` with the reason; with ``required`` they raise CommandOutputError.
    """
    if runner is None:
        reason = "nvidia-smi was not found in PATH"
        if required:
            raise CommandOutputError(
                NVIDIA_SMI_COMMAND, f"{reason}; install the NVIDIA driver utilities or use auto"
            )
        return _smi_unavailable(reason)
    from . import gpu_smi  # only output to parse needs it: imported once nvidia-smi has run

    rc, out, err = runner()
    state, failure = gpu_smi._smi_outcome(rc, out, err, timeout_s)
    if state is not None:
        return state
    reason, fix = failure
    if required:
        raise CommandOutputError(NVIDIA_SMI_COMMAND, f"{reason}; {fix}" if fix else reason)
    return _smi_unavailable(reason)


def read_gpu_state(
    nvml=None,
    nvml_reason: Optional[str] = None,
    nvidia_smi: Optional[Callable] = None,
    nvidia_smi_mode: str = "auto",
    snapshot: Optional[str] = None,
    nvidia_smi_timeout: Optional[int] = None,
) -> GpuState:
    """GPU state from a snapshot, else NVML, else nvidia-smi.

    Raises SnapshotError for a bad snapshot and CommandOutputError when ``always`` fails.

    ``nvml`` is the imported pynvml module (None when it cannot be imported, ``nvml_reason`` says
    why); ``nvidia_smi`` is the runner for :func:`read_nvidia_smi`, and ``nvidia_smi_timeout``
    the limit it runs under (None: no ``timeout``). ``nvidia_smi_mode``: ``auto``
    runs nvidia-smi only when NVML is unavailable, ``always`` uses it instead of NVML (and fails
    without it), ``never`` does not run it.
    """
    if nvidia_smi_mode not in NVIDIA_SMI_MODES:
        raise CommandOutputError(
            NVIDIA_SMI_COMMAND,
            f"mode {nvidia_smi_mode!r} is not one of {', '.join(NVIDIA_SMI_MODES)}",
        )
    if snapshot is not None:
        from . import gpu_snapshot  # imported only when a snapshot is read or written

        return gpu_snapshot.read_snapshot(snapshot)
    if nvidia_smi_mode == "always":
        state = read_nvidia_smi(nvidia_smi, True, nvidia_smi_timeout)
        skipped = {
            "available": False,
            "reason": "not used: nvidia_smi=always",
            "driver_version": None,
        }
        return replace(state, nvml=skipped)
    if nvml is None:
        state = nvml_unavailable(nvml_reason or "nvidia-ml-py (import pynvml) is not available")
    else:
        from . import gpu_nvml  # imported only when there is a pynvml module to read

        state = gpu_nvml.read_nvml(nvml)
    if state.nvml["available"]:
        return state
    if nvidia_smi_mode == "never":
        skipped = {"used": False, "reason": "not tried: nvidia_smi=never", "driver_version": None}
        return replace(state, nvidia_smi=skipped)
    return replace(read_nvidia_smi(nvidia_smi, False, nvidia_smi_timeout), nvml=state.nvml)


# ---------------------------------------------------------------------------------------------
# Facts


def mig_reset_required(mig: dict) -> bool:
    """Whether a GPU's MIG mode change waits for a GPU reset: ``mode_pending`` is known and is
    not ``mode_current`` (NVML nvmlDeviceGetMigMode, nvidia-smi ``pending_mig``, a snapshot).

    ``mig`` is the facts' ``mig`` dict of one GPU; never raises.
    """
    current, pending = mig.get("mode_current"), mig.get("mode_pending")
    return current is not None and pending is not None and current != pending


def node_from_affinity(affinity, node_cpus: dict) -> Optional[int]:
    """The one node whose CPUs hold every CPU of ``affinity`` (NVML's NODE-scope CPU affinity
    of a GPU, nvml_cpu_affinity), or None: no affinity, or it fits no node or several."""
    if not affinity:
        return None
    wanted = set(affinity)
    found = [nid for nid, cpus in node_cpus.items() if cpus and wanted <= set(cpus)]
    return found[0] if len(found) == 1 else None


def merge(gpus: list, state: GpuState, node_cpus: Optional[dict] = None) -> tuple:
    """(facts GPU list, warnings): sysfs GPUs joined with ``state`` by PCI address.

    sysfs stays the source of identity and locality; enriched values are credited to
    ``state.label``; a GPU's ``mig`` gains ``reset_required`` (mig_reset_required), whichever
    source gave it. A GPU whose sysfs locality is unknown takes the node of its NVML CPU
    affinity (node_from_affinity over ``node_cpus`` {node: CPUs}), with node_source
    NODE_SOURCE_NVML. An address the enrichment reports but sysfs lacks, or an NVIDIA GPU the
    enrichment does not report, becomes a warning; the latter also gets the reason for each
    enriched field in its ``unavailable``.
    """
    label, entries, warnings = state.label, [], []
    for gpu in sorted(gpus, key=lambda item: _address_key(item.address)):
        entry = {
            "address": gpu.address,
            "vendor": gpu.vendor,
            "vendor_id": gpu.vendor_id,
            "device_id": gpu.device_id,
            "numa_node": gpu.numa_node,
            "node": gpu.node,
            "node_source": gpu.node_source,
            "local_cpus": list(gpu.local_cpus) if gpu.local_cpus is not None else None,
            "switch": gpu.switch,
            "root_port": gpu.root_port,
        }
        entry.update(dict.fromkeys(ENRICHED_FIELDS))
        entry["partition"] = copy.deepcopy(gpu.partition)
        sources = {key: SOURCE_SYSFS for key in _SYSFS_FIELDS if entry[key] is not None}
        record = state.gpus.get(gpu.address) if gpu.vendor == "nvidia" else None
        unavailable: dict = {}
        if record is not None:
            for key in ENRICHED_FIELDS:
                entry[key] = copy.deepcopy(record.get(key))
                if entry[key] is not None:
                    sources[key] = label
            unavailable = dict(record["unavailable"])
            if isinstance(entry["mig"], dict):
                entry["mig"]["reset_required"] = mig_reset_required(entry["mig"])
            inferred = None
            if entry["node"] is None and node_cpus:
                inferred = node_from_affinity(entry["nvml_cpu_affinity"], node_cpus)
            if inferred is not None:
                entry["node"], entry["node_source"] = inferred, NODE_SOURCE_NVML
                sources["node"] = sources["node_source"] = label
        elif gpu.vendor == "nvidia" and label is not None:
            reason = f"{label} did not report this GPU (another driver, a cgroup, or lost)"
            unavailable = dict.fromkeys(ENRICHED_FIELDS, reason)
            warnings.append({"path": gpu.address, "reason": reason})
        entry["sources"] = dict(sorted(sources.items()))
        entry["unavailable"] = dict(sorted(unavailable.items()))
        entry["numa_node_raw"] = gpu.numa_node_raw
        entries.append(entry)
    known = {gpu.address for gpu in gpus}
    for address in sorted(set(state.gpus) - known, key=_address_key):
        warnings.append(
            {"path": address, "reason": f"{label} reports a GPU that is not under bus/pci/devices"}
        )
    return entries, warnings


def read_gpu_topology(
    reader: Reader, state: GpuState, load_amdsmi: Optional[Callable] = None
) -> dict:
    """JSON-ready ansible_facts.gpu_topology: sysfs GPUs (via ``reader``) enriched by ``state``.

    AMD GPUs get their ``amd`` record (gpu_amd.annotate; ``load_amdsmi`` as there).

    Raises TopologyError when the roots are not a sysfs/procfs tree at all (Reader.check_roots).
    """
    reader.check_roots()
    node_cpus = topology.read_node_cpus(reader)
    gpus = read_gpus(reader, node_cpus)
    entries, warnings = merge(gpus, state, node_cpus)
    from . import gpu_amd

    amdsmi = gpu_amd.annotate(
        reader, entries, load_amdsmi, state.amd if state.snapshot_path else None
    )
    return {
        "gpus": entries,
        "amdsmi": amdsmi,
        "nvml": dict(state.nvml),
        "nvidia_smi": dict(state.nvidia_smi),
        "snapshot": {
            "path": state.snapshot_path,
            "recorded_from": state.source if state.snapshot_path else None,
        },
        "sysfs_root": reader.sysfs_root,
        "warnings": _sorted_warnings(list(reader.warnings) + list(state.warnings) + warnings),
    }


# ---------------------------------------------------------------------------------------------
# One gathering: what gpu_topology_facts and numa_facts (gpu=true) run


def read_nvml_library(load: Optional[Callable] = None) -> bool:
    """Whether NVML_LIBRARY loads, as pynvml's nvmlInit loads it on Linux; never raises.

    ``load`` loads a shared library by name (default ``ctypes.CDLL``).
    """
    if load is None:
        import ctypes

        load = ctypes.CDLL
    try:
        load(NVML_LIBRARY)
    except OSError:
        return False
    return True


def _module_findable(name: str) -> bool:
    if name in sys.modules:
        return True
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return True  # let the import itself say what is wrong


def load_nvml_if_usable(load_nvml: Callable, library_loads: Callable = read_nvml_library) -> tuple:
    """``load_nvml()`` -> (pynvml, None) or (None, reason), skipping an import that cannot help.

    Importing pynvml costs more than the rest of a facts run. On Linux, when pynvml is installed
    but not yet imported and NVML_LIBRARY does not load, its nvmlInit could only fail with
    NVML_LIBRARY_MISSING: that reason is returned without the import, exactly what read_nvml
    would have given. Anywhere else ``load_nvml`` is called.
    """
    if (
        sys.platform.startswith("linux")
        and _NVML_MODULE not in sys.modules
        and _module_findable(_NVML_MODULE)
        and not library_loads()
    ):
        return None, NVML_LIBRARY_MISSING
    return load_nvml()


def gather_gpu_topology(
    reader: Reader,
    runner: Callable,
    which: Callable,
    load_nvml: Callable,
    nvidia_smi_mode: str = "auto",
    nvidia_smi_timeout: int = 30,
    snapshot: Optional[str] = None,
    snapshot_out: Optional[str] = None,
    check_mode: bool = False,
    library_loads: Callable = read_nvml_library,
    load_amdsmi: Optional[Callable] = None,
) -> tuple:
    """(ansible_facts.gpu_topology, whether ``snapshot_out`` was written) for the host.

    Raises CommandOutputError (bad ``nvidia_smi_timeout``, or ``always`` failed), SnapshotError
    (bad ``snapshot``, ``snapshot_out`` not writable) and TopologyError (roots not sysfs/procfs).

    ``runner(argv) -> (rc, out, err)`` runs a command in the C locale, ``which(name)`` finds a
    binary in PATH (None when absent), ``load_nvml()`` gives (pynvml, None) or (None, why it
    cannot be imported); NVML is not loaded at all with a ``snapshot``. ``snapshot_out`` is
    written unless ``check_mode``.
    """
    nvml, nvml_reason = (None, None)
    if not snapshot:
        nvml, nvml_reason = load_nvml_if_usable(load_nvml, library_loads)
    killer = which("timeout")
    argv = nvidia_smi_argv(which("nvidia-smi"), killer, nvidia_smi_timeout)
    state = read_gpu_state(
        nvml,
        nvml_reason,
        functools.partial(runner, argv) if argv else None,
        nvidia_smi_mode,
        snapshot=snapshot,
        nvidia_smi_timeout=nvidia_smi_timeout if killer else None,
    )
    facts = read_gpu_topology(reader, state, None if snapshot else load_amdsmi)
    if snapshot_out and not check_mode:
        from . import gpu_amd, gpu_snapshot

        gpu_snapshot.write_snapshot(snapshot_out, replace(state, amd=gpu_amd.recorded(facts)))
        return facts, True
    return facts, False
