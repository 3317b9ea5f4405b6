# Private to this collection: may change in any release.
"""MIG through ``nvidia-smi``: the fallback backend when NVML (pynvml) cannot be used.

Reads with ``nvidia-smi -q -x`` (addresses, UUIDs, modes, architecture, processes and the
MIG-device index of every GPU/compute instance), ``nvidia-smi -L`` (GPU indexes and MIG device
UUIDs) and, per GPU whose MIG mode is enabled, ``nvidia-smi mig -i ADDR -lgip / -lgipp / -lgi /
-lci``. Writes with ``nvidia-smi -i ADDR -mig 1|0`` and ``nvidia-smi mig -i ADDR -cgi / -cci /
-dci / -dgi``. Every command goes through a runner callable ``runner(argv) -> (rc, out, err)``
that the module builds (LC_ALL=C); nothing here starts a process itself.

The ``parse_*`` functions are pure and tested against recorded nvidia-smi output
(tests/unit/fixtures/cmd/nvidia-smi/).
"""

from __future__ import annotations

import re
from typing import Callable, Optional
from xml.etree import ElementTree

from . import gpu_records, gpu_smi
from .errors import CommandOutputError
from .mig import (
    CI_PROFILE_IDS,
    ComputeInstance,
    GpuInstance,
    MigBackendError,
    MigGpu,
    Profile,
    smi_command,
)

SOURCE = "nvidia-smi"

# What the list commands print (with a non-zero status) when there is nothing to list.
_NOTHING_FOUND = ("no gpu instances found", "no compute instances found")

_LGIP_ROW = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+MIG\s+(?P<name>\S+)\s+(?P<id>\d+)\s+(?P<free>\d+)/(?P<total>\d+)\s+"
    r"(?P<gib>\d+(?:\.\d+)?)\s"
)
_LGIPP_ROW = re.compile(
    r"^GPU\s+(?P<gpu>\d+)\s+Profile ID\s+(?P<id>\d+)\s+Placements?\s*:\s*"
    r"(?:\{(?P<starts>[\d,\s]*)\}:(?P<size>\d+)|None)\s*\Z"
)
_LGI_ROW = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+MIG\s+(?P<name>\S+)\s+(?P<profile>\d+)\s+(?P<id>\d+)\s+"
    r"(?P<start>\d+):(?P<size>\d+)\s*\|\Z"
)
_LCI_ROW = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+(?P<gi>\d+)\s+MIG\s+(?P<name>\S+)\s+(?P<profile>\d+)\s+(?P<id>\d+)"
    r"(?:\s+(?P<start>\d+):(?P<size>\d+))?\s*\|\Z"
)
_L_GPU = re.compile(r"^GPU\s+(?P<index>\d+):\s+(?P<name>.*?)\s+\(UUID:\s*(?P<uuid>[^)\s]+)\)\s*\Z")
_L_MIG = re.compile(
    r"^\s+MIG\s+(?P<name>\S+)\s+Device\s+(?P<device>\d+):\s+\(UUID:\s*(?P<uuid>[^)\s]+)\)\s*\Z"
)
_CREATED_GI = re.compile(
    r"Successfully created GPU instance ID\s+(?P<id>\d+)\s+on GPU\s+(?P<gpu>\d+)\s+"
    r"using profile MIG\s+(?P<name>\S+)\s+\(ID\s+(?P<profile>\d+)\)"
)
_CREATED_CI = re.compile(
    r"Successfully created compute instance(?:\s+ID\s+(?P<id>\d+))?\s+on GPU\s+(?P<gpu>\d+)\s+"
    r"GPU instance ID\s+(?P<gi>\d+)\s+using profile MIG\s+(?P<name>\S+)\s+\(ID\s+(?P<profile>\d+)\)"
)
_SLICES_IN_NAME = re.compile(r"^(\d+)[cg]\.")

# Driver messages and what to do about them (first match wins; compared in lower case).
_FIXES = (
    (
        ("in use by another client", "currently being used", "currently in use"),
        "Stop the processes that use this GPU (CUDA applications, nvidia-persistenced, DCGM "
        "nv-hostengine, monitoring agents such as another nvidia-smi) and run again",
    ),
    (
        ("insufficient permissions", "permission denied"),
        "Run the task as root (become: true); MIG changes and listings need root",
    ),
    (
        ("insufficient resources",),
        "The placement overlaps an existing instance or the profile's count is used up; compare "
        "nvidia-smi mig -lgi with -lgipp and free the slices first",
    ),
    (
        ("not supported",),
        "This GPU or driver cannot do this; check MIG Mode in nvidia-smi -q and the driver version",
    ),
    (
        ("no such file", "not found"),
        "Install the NVIDIA driver utilities or point the module at the nvidia-smi binary",
    ),
)
_DEFAULT_FIX = "Run the command by hand to see nvidia-smi's full message and fix what it names"


def _first_line(out: str, err: str) -> str:
    for text in (err, out):
        for line in (text or "").splitlines():
            if line.strip():
                return gpu_records.clip(line.strip())
    return "no output"


def _fix(out: str, err: str) -> str:
    text = f"{err or ''}\n{out or ''}".lower()
    for needles, fix in _FIXES:
        if any(needle in text for needle in needles):
            return fix
    return _DEFAULT_FIX


def _nothing_found(out: str, err: str) -> bool:
    text = f"{err or ''}\n{out or ''}".strip().lower()
    return any(text.startswith(marker) for marker in _NOTHING_FOUND)


def _int_or_none(text: Optional[str]) -> Optional[int]:
    value = (text or "").strip()
    return int(value) if value.isascii() and value.isdigit() else None


# ---------------------------------------------------------------------------------------------
# Parsers (pure)


def parse_lgip(text: str) -> list:
    """Rows of ``nvidia-smi mig -lgip`` as dicts (gpu, name, id, free, total, memory_mib).

    Each profile takes two text rows (the second holds CE/JPEG/OFA); only the first is read.
    ``memory_mib`` is nvidia-smi's GiB figure (two decimals) in MiB, so it can be a few MiB off
    the exact size NVML gives. ``name`` has no ``MIG `` prefix. Raises nothing; no rows gives [].
    """
    rows = []
    for line in text.splitlines():
        match = _LGIP_ROW.match(line.strip())
        if match:
            rows.append(
                {
                    "gpu": int(match["gpu"]),
                    "name": match["name"],
                    "id": int(match["id"]),
                    "free": int(match["free"]),
                    "total": int(match["total"]),
                    "memory_mib": int(round(float(match["gib"]) * 1024)),
                }
            )
    return rows


def parse_lgipp(text: str) -> dict:
    """{(gpu index, profile id): ((start, size), ...)} from ``nvidia-smi mig -lgipp``.

    Accepts ``Placements:`` and the singular ``Placement :`` of single-placement profiles.
    """
    placements: dict = {}
    for line in text.splitlines():
        match = _LGIPP_ROW.match(line.strip())
        if not match:
            continue
        key = (int(match["gpu"]), int(match["id"]))
        starts = [int(s) for s in re.split(r"[,\s]+", match["starts"] or "") if s]
        size = int(match["size"]) if match["size"] else 0
        placements[key] = tuple(sorted((start, size) for start in starts))
    return placements


def parse_lgi(text: str) -> list:
    """Rows of ``nvidia-smi mig -lgi`` as dicts (gpu, name, profile_id, id, start, size).

    "No GPU instances found" (or any text without table rows) gives [].
    """
    rows = []
    for line in text.splitlines():
        match = _LGI_ROW.match(line.strip())
        if match:
            rows.append(
                {
                    "gpu": int(match["gpu"]),
                    "name": match["name"],
                    "profile_id": int(match["profile"]),
                    "id": int(match["id"]),
                    "start": int(match["start"]),
                    "size": int(match["size"]),
                }
            )
    return rows


def parse_lci(text: str) -> list:
    """Rows of ``nvidia-smi mig -lci`` as dicts (gpu, gpu_instance_id, name, profile_id, id,
    start, size); start/size are None where the driver prints no Placement column.

    "No compute instances found" (or any text without table rows) gives [].
    """
    rows = []
    for line in text.splitlines():
        match = _LCI_ROW.match(line.strip())
        if match:
            rows.append(
                {
                    "gpu": int(match["gpu"]),
                    "gpu_instance_id": int(match["gi"]),
                    "name": match["name"],
                    "profile_id": int(match["profile"]),
                    "id": int(match["id"]),
                    "start": _int_or_none(match["start"]),
                    "size": _int_or_none(match["size"]),
                }
            )
    return rows


def parse_list_gpus(text: str) -> list:
    """GPUs of ``nvidia-smi -L``: dicts (index, name, uuid, mig_devices), sorted by index.

    ``mig_devices`` lists (device index, profile name, MIG UUID) for the indented ``MIG ...
    Device N: (UUID: MIG-...)`` lines under the GPU, in the order printed.
    """
    gpus: list = []
    for line in text.splitlines():
        match = _L_GPU.match(line.strip())
        if match:
            gpus.append(
                {
                    "index": int(match["index"]),
                    "name": match["name"],
                    "uuid": match["uuid"],
                    "mig_devices": [],
                }
            )
            continue
        match = _L_MIG.match(line)
        if match and gpus:
            gpus[-1]["mig_devices"].append((int(match["device"]), match["name"], match["uuid"]))
    return sorted(gpus, key=lambda entry: entry["index"])


def parse_created_gpu_instance(text: str) -> Optional[int]:
    """GPU instance id from ``nvidia-smi mig -cgi`` output, or None when no success line."""
    match = _CREATED_GI.search(text or "")
    return int(match["id"]) if match else None


def parse_created_compute_instance(text: str) -> tuple:
    """(found, CI id or None) from ``nvidia-smi mig -cci`` output.

    Older drivers print the success line without the CI id: (True, None).
    """
    match = _CREATED_CI.search(text or "")
    if not match:
        return False, None
    return True, _int_or_none(match["id"])


def parse_xml_mig_extras(text: str) -> dict:
    """{address: {architecture, mig_devices {index: (gi, ci, uuid)}, processes}} from -q -x.

    What ``gpu_smi.parse_nvidia_smi_xml`` does not keep: ``product_architecture`` (lower case,
    spaces as ``_``), each ``<mig_device>``'s index with its GPU/compute instance ids (and
    ``<uuid>`` where the driver prints one) and each process's GPU instance id (None = N/A).
    Raises CommandOutputError when the text is not XML.
    """
    try:
        root = ElementTree.fromstring(text)
    except (ElementTree.ParseError, ValueError, LookupError) as exc:
        raise CommandOutputError(
            gpu_records.NVIDIA_SMI_COMMAND, f"output is not XML ({gpu_records.clip(str(exc))})"
        ) from None
    extras: dict = {}
    for element in root.findall("gpu"):
        raw = element.get("id") or element.findtext("pci/pci_bus_id") or ""
        try:
            address = gpu_records.normalise_bus_id(raw)
        except ValueError:
            continue
        arch = (element.findtext("product_architecture") or "").strip()
        devices = {}
        for device in element.findall("mig_devices/mig_device"):
            index = _int_or_none(device.findtext("index"))
            gi_id = _int_or_none(device.findtext("gpu_instance_id"))
            ci_id = _int_or_none(device.findtext("compute_instance_id"))
            uuid = (device.findtext("uuid") or "").strip()
            if index is not None and gi_id is not None and ci_id is not None:
                devices[index] = (gi_id, ci_id, uuid if uuid.startswith("MIG-") else None)
        processes = set()
        for item in element.findall("processes/process_info"):
            pid = _int_or_none(item.findtext("pid"))
            if pid is not None:
                processes.add((pid, _int_or_none(item.findtext("gpu_instance_id"))))
        extras[address] = {
            "architecture": re.sub(r"\s+", "_", arch.lower())
            if arch and arch.lower() not in ("n/a", "unknown")
            else None,
            "mig_devices": devices,
            "processes": tuple(
                sorted(processes, key=lambda p: (p[0], -1 if p[1] is None else p[1]))
            ),
        }
    return extras


def _ci_slices(name: str, gi_slices: int, size: Optional[int]) -> int:
    """Compute slices of a CI: ``N`` of ``Nc.<gi>``; a full-size CI has the GI's slices."""
    head = name.split(".", 1)[0]
    if head.endswith("c") and head[:-1].isdigit():
        return int(head[:-1])
    if gi_slices:
        return gi_slices
    return size or 0


def _profile_slices(name: str) -> int:
    match = _SLICES_IN_NAME.match(name)
    return int(match[1]) if match else 0


def build_mig_gpu(
    address: str,
    record: dict,
    extras: dict,
    listed: Optional[dict],
    lgip: list,
    lgipp: dict,
    lgi: list,
    lci: list,
) -> MigGpu:
    """MigGpu from the parsed outputs of one GPU (pure).

    ``record`` is the GPU's ``parse_nvidia_smi_xml`` record, ``extras`` its
    ``parse_xml_mig_extras`` entry, ``listed`` its ``parse_list_gpus`` entry (None when -L did
    not list it). MIG UUIDs come from ``<mig_device><uuid>`` or, through the device index, from
    ``-L``; when the XML gives no indexes, -L devices are paired with the compute instances in
    (GPU instance id, CI id) order, and only if their count and profile names agree.
    """
    mig = record.get("mig") or {}
    index = listed["index"] if listed else None
    profiles = []
    for row in lgip:
        places = lgipp.get((row["gpu"], row["id"]))
        if places is None:  # -lgipp keyed by another index than -lgip printed: match by id only
            places = next((v for (g, pid), v in lgipp.items() if pid == row["id"]), ())
        profiles.append(
            Profile(
                name=row["name"],
                id=row["id"],
                slices=_profile_slices(row["name"]),
                memory_mib=row["memory_mib"],
                max_count=row["total"],
                placements=tuple(places),
            )
        )
    profile_slices = {p.id: p.slices for p in profiles}
    profile_names = {p.id: p.name for p in profiles}
    uuids = _device_uuids(extras, listed, lgi, lci, profile_names)
    instances = []
    for row in sorted(lgi, key=lambda r: r["id"]):
        gi_slices = profile_slices.get(row["profile_id"]) or _profile_slices(row["name"])
        computes = tuple(
            ComputeInstance(
                id=ci["id"],
                slices=_ci_slices(ci["name"], gi_slices, ci["size"]),
                profile_id=ci["profile_id"],
                device_uuid=uuids.get((row["id"], ci["id"])),
            )
            for ci in sorted(lci, key=lambda c: c["id"])
            if ci["gpu_instance_id"] == row["id"]
        )
        instances.append(
            GpuInstance(
                id=row["id"],
                profile_id=row["profile_id"],
                start=row["start"],
                size=row["size"],
                compute_instances=computes,
            )
        )
    return MigGpu(
        address=address,
        index=index,
        uuid=record.get("uuid"),
        name=record.get("name"),
        architecture=extras.get("architecture"),
        mode_current=mig.get("mode_current"),
        mode_pending=mig.get("mode_pending"),
        profiles=tuple(sorted(profiles, key=lambda p: p.id)),
        gpu_instances=tuple(instances),
        processes=tuple(extras.get("processes", ())),
    )


def _device_uuids(extras: dict, listed: Optional[dict], lgi, lci, profile_names) -> dict:
    """{(gi id, ci id): MIG UUID} for the GPU; missing pairs are unknown."""
    by_device = {dev: uuid for dev, dummy, uuid in (listed or {}).get("mig_devices", ())}
    devices = extras.get("mig_devices") or {}
    if devices:
        found = {}
        for dev, (gi_id, ci_id, uuid) in devices.items():
            value = uuid or by_device.get(dev)
            if value:
                found[(gi_id, ci_id)] = value
        return found
    listing = sorted((listed or {}).get("mig_devices", ()))
    pairs = sorted((ci["gpu_instance_id"], ci["id"], ci["name"]) for ci in lci)
    if not listing or len(listing) != len(pairs):
        return {}
    if any(name != ci_name for (dummy, name, dummy2), (g, c, ci_name) in zip(listing, pairs)):
        return {}
    return {(g, c): uuid for (dummy, dummy2, uuid), (g, c, dummy3) in zip(listing, pairs)}


# ---------------------------------------------------------------------------------------------
# The backend


class SmiBackend:
    """MIG backend that runs ``nvidia-smi`` through ``runner(argv) -> (rc, stdout, stderr)``."""

    source = SOURCE

    def __init__(self, runner: Callable, nvidia_smi: str = "nvidia-smi") -> None:
        self.runner = runner
        self.nvidia_smi = nvidia_smi

    # -- command lines -------------------------------------------------------------------------

    def argv(self, kind: str, address: str, *args) -> list:
        """argv of one write action; ``kind`` is the backend method name. Raises MigBackendError."""
        smi = self.nvidia_smi
        if kind == "set_mode":
            return [smi, "-i", address, "-mig", "1" if args[0] else "0"]
        if kind == "create_gpu_instance":
            profile_id, start = args
            return [smi, "mig", "-i", address, "-cgi", f"{int(profile_id)}:{int(start)}"]
        if kind == "create_compute_instance":
            gi_id, ci_profile_id = args
            return [smi, "mig", "-i", address, "-cci", str(int(ci_profile_id)), "-gi", str(gi_id)]
        if kind == "destroy_compute_instance":
            gi_id, ci_id = args
            return [smi, "mig", "-i", address, "-dci", "-gi", str(int(gi_id)), "-ci", str(ci_id)]
        if kind == "destroy_gpu_instance":
            return [smi, "mig", "-i", address, "-dgi", "-gi", str(int(args[0]))]
        raise MigBackendError(
            address, f"nvidia-smi action {kind!r}", "no such action", "This is a bug; report it"
        )

    @staticmethod
    def describe(action) -> str:
        """Command line text of ``action`` (a mig.Action) for would_run and messages."""
        return smi_command(action)

    # -- running -------------------------------------------------------------------------------

    def _run(self, address: str, argv: list, empty_ok: bool = False) -> tuple:
        rc, out, err = self.runner(argv)
        out, err = out or "", err or ""
        if rc != 0:
            if empty_ok and _nothing_found(out, err):
                return "", err
            raise MigBackendError(
                address,
                " ".join(argv),
                f"exited with status {rc}: {_first_line(out, err)}",
                _fix(out, err),
            )
        return out, err

    def read(self) -> list:
        """Every NVIDIA GPU nvidia-smi reports, as MigGpu sorted by address; raises
        MigBackendError when a command fails or its output does not parse."""
        command = [self.nvidia_smi, "-q", "-x"]
        out, dummy = self._run("(all)", command)
        try:
            state = gpu_smi.parse_nvidia_smi_xml(out)
            extras = parse_xml_mig_extras(out)
        except CommandOutputError as exc:
            raise MigBackendError(
                "(all)", " ".join(command), exc.reason, "Check that the NVIDIA driver is loaded"
            ) from None
        listing, dummy = self._run("(all)", [self.nvidia_smi, "-L"])
        by_uuid = {entry["uuid"]: entry for entry in parse_list_gpus(listing)}
        result = []
        for address in sorted(state.gpus, key=gpu_records.address_key):
            record = state.gpus[address]
            listed = by_uuid.get(record.get("uuid"))
            mig = record.get("mig") or {}
            lists = ([], {}, [], [])
            if mig.get("mode_current") == "enabled":
                lists = self._read_lists(address)
            result.append(build_mig_gpu(address, record, extras.get(address, {}), listed, *lists))
        return result

    def _read_lists(self, address: str) -> tuple:
        base = [self.nvidia_smi, "mig", "-i", address]
        lgip, dummy = self._run(address, base + ["-lgip"])
        lgipp, dummy = self._run(address, base + ["-lgipp"])
        lgi, dummy = self._run(address, base + ["-lgi"], empty_ok=True)
        lci, dummy = self._run(address, base + ["-lci"], empty_ok=True)
        return parse_lgip(lgip), parse_lgipp(lgipp), parse_lgi(lgi), parse_lci(lci)

    # -- writes --------------------------------------------------------------------------------

    def set_mode(self, address: str, enabled: bool) -> None:
        """Ask for MIG mode on/off (may stay pending until a reset); raises MigBackendError."""
        self._run(address, self.argv("set_mode", address, enabled))

    def create_gpu_instance(self, address: str, profile_id: int, start: int) -> int:
        """Create a GPU instance at ``start``; its id. Raises MigBackendError."""
        argv = self.argv("create_gpu_instance", address, profile_id, start)
        out, err = self._run(address, argv)
        gi_id = parse_created_gpu_instance(out + "\n" + err)
        if gi_id is None:
            raise MigBackendError(
                address,
                " ".join(argv),
                f"printed no 'Successfully created GPU instance' line: {_first_line(out, err)}",
                _fix(out, err),
            )
        return gi_id

    def create_compute_instance(self, address: str, gi_id: int, ci_profile_id: int) -> int:
        """Create a compute instance in GPU instance ``gi_id``; its id. Raises MigBackendError.

        When the driver's success line carries no CI id (R450 era), the id is read back with
        ``-lci -gi``, which must then list exactly one compute instance in that GPU instance.
        """
        argv = self.argv("create_compute_instance", address, gi_id, ci_profile_id)
        out, err = self._run(address, argv)
        found, ci_id = parse_created_compute_instance(out + "\n" + err)
        if not found:
            raise MigBackendError(
                address,
                " ".join(argv),
                f"printed no 'Successfully created compute instance' line: {_first_line(out, err)}",
                _fix(out, err),
            )
        if ci_id is not None:
            return ci_id
        check = [self.nvidia_smi, "mig", "-i", address, "-lci", "-gi", str(int(gi_id))]
        listed, dummy = self._run(address, check, empty_ok=True)
        ids = [row["id"] for row in parse_lci(listed) if row["gpu_instance_id"] == gi_id]
        if len(ids) != 1:
            raise MigBackendError(
                address,
                " ".join(check),
                f"the driver did not print the new compute instance id and GPU instance {gi_id} "
                f"holds {len(ids)} compute instances",
                "Leave one compute instance per GPU instance, or use the NVML backend",
            )
        return ids[0]

    def destroy_compute_instance(self, address: str, gi_id: int, ci_id: int) -> None:
        """Destroy one compute instance; raises MigBackendError (e.g. in use by a process)."""
        self._run(address, self.argv("destroy_compute_instance", address, gi_id, ci_id))

    def destroy_gpu_instance(self, address: str, gi_id: int) -> None:
        """Destroy one GPU instance (its CIs must be gone); raises MigBackendError."""
        self._run(address, self.argv("destroy_gpu_instance", address, gi_id))

    def close(self) -> None:
        """Nothing to release: every command is a separate process."""


__all__ = [
    "CI_PROFILE_IDS",
    "SOURCE",
    "SmiBackend",
    "build_mig_gpu",
    "parse_created_compute_instance",
    "parse_created_gpu_instance",
    "parse_lci",
    "parse_lgi",
    "parse_lgip",
    "parse_lgipp",
    "parse_list_gpus",
    "parse_xml_mig_extras",
]
