# Private to this collection: may change in any release.
"""GPU snapshots: the GPU state as JSON, recorded on a host and read back anywhere.

Split from gpu.py so that a facts run without a snapshot does not compile it: gpu.read_gpu_state
and gpu.gather_gpu_topology import this module only for ``snapshot`` and ``snapshot_out``.
"""

from __future__ import annotations

import copy
import json
import os
import stat
from typing import Optional

from . import pci
from .errors import SnapshotError
from .files import write_file
from .gpu_records import (
    SNAPSHOT_FORMAT,
    SNAPSHOT_VERSION,
    SOURCE_NVIDIA_SMI,
    SOURCE_NVML,
    GpuState,
    address_key,
    clip,
    quote,
    sorted_warnings,
)

_SNAPSHOT_LIMIT = 64 << 20
_SNAPSHOT_FILE_FIX = "Point snapshot at a JSON file written by numafleet.tuning.gpu_topology_facts snapshot_out=PATH."
_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_STR, _INT, _BOOL = ("str",), ("int",), ("bool",)


def _opt(schema: tuple) -> tuple:
    return ("opt", schema)


def _absent_ok(schema: tuple) -> tuple:
    """A key that may be left out (or null): added after version 1 was first written."""
    return ("maybe", schema)


def _list(schema: tuple) -> tuple:
    return ("list", schema)


def _obj(**fields) -> tuple:
    return ("obj", fields)


_SWITCH = ("enum", ("enabled", "disabled"))
_COMPUTE_INSTANCE = _obj(
    id=_INT, profile_id=_opt(_INT), profile_name=_opt(_STR), mig_device_uuid=_opt(_STR)
)
_GPU_INSTANCE = _obj(
    id=_INT,
    profile_id=_opt(_INT),
    profile_name=_opt(_STR),
    placement_start=_opt(_INT),
    placement_size=_opt(_INT),
    compute_instances=_opt(_list(_COMPUTE_INSTANCE)),
    mig_device_uuid=_opt(_STR),
    # true: made by a render-mode apply in this recording, not recorded from a GPU
    # (mig_nvml.render_into_snapshot; its MIG-device UUIDs are synthetic)
    rendered=_absent_ok(_BOOL),
)
_PROFILE = _obj(
    name=_opt(_STR),
    id=_INT,
    max_count=_INT,
    slice_count=_INT,
    memory_mib=_opt(_INT),
    placements=_opt(_list(_obj(start=_INT, size=_INT))),
)
_MIG = _obj(
    mode_current=_SWITCH,
    mode_pending=_opt(_SWITCH),
    gpu_instances=_opt(_list(_GPU_INSTANCE)),
    supported_profiles=_opt(_list(_PROFILE)),
    # derived from the two modes (gpu.mig_reset_required); recomputed when read back
    reset_required=_absent_ok(_BOOL),
)
_RECORD = _obj(
    address=("address",),
    uuid=_opt(_STR),
    name=_opt(_STR),
    memory_total_mib=_opt(_INT),
    compute_mode=_opt(_STR),
    persistence_mode=_opt(_SWITCH),
    mig=_opt(_MIG),
    processes=_opt(_list(_INT)),
    nvlink_peers=_opt(_list(("address",))),
    nvlink_switches=_opt(_list(("address",))),
    nvml_numa_node=_opt(_INT),
    # NVML's NODE-scope CPU affinity (gpu_nvml._read_cpu_affinity); absent in older snapshots
    nvml_cpu_affinity=_absent_ok(_list(_INT)),
    unavailable=("map", _STR),
    # GPU baseline settings (gpu_settings.SnapshotBackend): what a render apply set, and what a
    # recording knows of clocks and power limit; absent in snapshots that say nothing of them
    application_clocks=_absent_ok(
        _obj(
            memory_mhz=_absent_ok(_INT),
            graphics_mhz=_absent_ok(_INT),
            default_memory_mhz=_absent_ok(_INT),
            default_graphics_mhz=_absent_ok(_INT),
            supported=_absent_ok(_list(_obj(memory_mhz=_INT, graphics_mhz=_list(_INT)))),
        )
    ),
    power_limit=_absent_ok(
        _obj(
            current_w=_absent_ok(_INT),
            default_w=_absent_ok(_INT),
            min_w=_absent_ok(_INT),
            max_w=_absent_ok(_INT),
        )
    ),
)
_MODES = _opt(_obj(current=_opt(_STR), available=_list(_STR)))
_AMD_RECORD = _obj(
    model=_opt(_STR),
    kfd_node=_opt(_INT),
    gpu_id=_opt(_INT),
    unique_id=_opt(_STR),
    uuid=_opt(_STR),
    hive_id=_absent_ok(_STR),
    drm_card=_opt(_STR),
    render_minor=_opt(_INT),
    vram_total_mib=_opt(_INT),
    compute_partition=_MODES,
    memory_partition=_MODES,
    compatible_memory_partitions=_opt(("map", _list(_STR))),
    compatible_source=_opt(("enum", ("sysfs", "amdsmi", "table"))),
    xcd_count=_opt(_INT),
    logical_gpus=_list(
        _obj(
            index=_INT,
            uuid=_opt(_STR),
            unique_id=_opt(_STR),
            kfd_node=_opt(_INT),
            gpu_id=_opt(_INT),
            render_minor=_opt(_INT),
            xcds=_list(_INT),
        )
    ),
    processes=_opt(_list(_obj(pid=_opt(_INT), name=_opt(_STR)))),
    source=("enum", ("sysfs", "amdsmi", "amd-smi", "snapshot")),
)
_SNAPSHOT = _obj(
    format=_STR,
    version=_INT,
    recorded_from=_opt(("enum", (SOURCE_NVML, SOURCE_NVIDIA_SMI))),
    nvml=_obj(available=_BOOL, reason=_opt(_STR), driver_version=_opt(_STR)),
    nvidia_smi=_obj(used=_BOOL, reason=_opt(_STR), driver_version=_opt(_STR)),
    gpus=_list(_RECORD),
    warnings=_list(_obj(path=_STR, reason=_STR)),
    # AMD GPUs (gpu_amd.recorded): written only for hosts with one; version 1 still reads.
    amd=_absent_ok(
        _obj(
            amdsmi=_obj(available=_BOOL, reason=_opt(_STR), version=_opt(_STR)),
            gpus=("map", _AMD_RECORD),
        )
    ),
)
_JSON_TYPES = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"))


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return next((word for kind, word in _JSON_TYPES if isinstance(value, kind)), "unknown")


def _check(value, schema: tuple, where: str, path: str) -> None:
    """Raise SnapshotError unless ``value`` (parsed JSON) has the shape ``schema`` describes."""
    kind, place = schema[0], where or "the top level"
    if kind in ("opt", "maybe"):
        if value is not None:
            _check(value, schema[1], where, path)
        return
    expected = {
        "str": (str, "a string"),
        "address": (str, "a PCI address string"),
        "enum": (str, "a string"),
        "int": (int, "an integer"),
        "bool": (bool, "true or false"),
        "list": (list, "a list"),
        "map": (dict, "an object"),
        "obj": (dict, "an object"),
    }[kind]
    if not isinstance(value, expected[0]) or (kind == "int" and isinstance(value, bool)):
        raise SnapshotError(path, f"{place} must be {expected[1]}, not {_json_type(value)}")
    if kind == "enum" and value not in schema[1]:
        choices = ", ".join(schema[1])
        raise SnapshotError(path, f"{place} is {quote(value)}; expected one of {choices}")
    if kind == "address":
        try:
            pci.parse_address(value)
        except ValueError:
            raise SnapshotError(
                path, f"{place}: {quote(value)} is not a PCI address DDDD:BB:DD.F"
            ) from None
    if kind == "list":
        for index, item in enumerate(value):
            _check(item, schema[1], f"{where}[{index}]", path)
    elif kind == "map":
        for key, item in value.items():
            _check(item, schema[1], f"{where}.{clip(key)}", path)
    elif kind == "obj":
        fields = schema[1]
        missing = [key for key in fields if key not in value and fields[key][0] != "maybe"]
        if missing:
            raise SnapshotError(path, f"{place} lacks {', '.join(missing)}")
        extra = sorted(quote(key) for key in value if key not in fields)
        if extra:
            raise SnapshotError(path, f"{place} has unknown key(s) {', '.join(extra)}")
        for key, item_schema in fields.items():
            _check(value.get(key), item_schema, f"{where}.{key}" if where else key, path)


def as_snapshot(state: GpuState) -> dict:
    """JSON-ready snapshot document of ``state`` (what ``snapshot_out`` writes)."""
    gpus = []
    for address in sorted(state.gpus, key=address_key):
        record = copy.deepcopy(state.gpus[address])
        record["address"] = address
        gpus.append(record)
    doc = {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "recorded_from": state.source,
        "nvml": dict(state.nvml),
        "nvidia_smi": dict(state.nvidia_smi),
        "gpus": gpus,
        "warnings": sorted_warnings(state.warnings),
    }
    if state.amd is not None:
        doc["amd"] = copy.deepcopy(state.amd)
    return doc


def parse_snapshot(text: str, path: str) -> GpuState:
    """GPU state of a snapshot's JSON text (``path`` names it in errors); raises SnapshotError."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SnapshotError(path, f"is not JSON ({clip(str(exc))})") from None
    if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(path, f'is not a GPU snapshot (no "format": "{SNAPSHOT_FORMAT}")')
    if doc.get("version") != SNAPSHOT_VERSION:
        raise SnapshotError(
            path,
            f"has version {quote(doc.get('version'))}; this collection reads version "
            f"{SNAPSHOT_VERSION}",
        )
    _check(doc, _SNAPSHOT, "", path)
    gpus: dict = {}
    for index, item in enumerate(doc["gpus"]):
        address = item.pop("address").lower()
        item.setdefault("nvml_cpu_affinity", None)  # a snapshot written before it was recorded
        if address in gpus:
            raise SnapshotError(path, f"gpus[{index}] repeats address {address}")
        gpus[address] = item
    return GpuState(
        source=doc["recorded_from"],
        nvml=doc["nvml"],
        nvidia_smi=doc["nvidia_smi"],
        gpus=gpus,
        warnings=tuple(doc["warnings"]),
        snapshot_path=path,
        amd=doc.get("amd"),
    )


def _not_regular(mode: int) -> Optional[str]:
    """Why a file of st_mode ``mode`` is no snapshot (a FIFO or device would block or stream)."""
    if stat.S_ISREG(mode):
        return None
    kind = next((word for test, word in _FILE_KINDS if test(mode)), "not a file")
    return f"is not a regular file (it is {kind})"


def _open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK)


def read_snapshot(path: str) -> GpuState:
    """GPU state recorded in the snapshot file ``path``; raises SnapshotError.

    Anything but a regular file (a FIFO, a directory, a device) is refused before it is opened.
    """
    text = ""
    try:
        odd = _not_regular(os.stat(path).st_mode)
        if odd is None:
            with open(path, encoding="utf-8", opener=_open_nonblocking) as handle:
                odd = _not_regular(os.fstat(handle.fileno()).st_mode)  # replaced since the stat
                if odd is None:
                    text = handle.read(_SNAPSHOT_LIMIT + 1)
    except OSError as exc:
        raise SnapshotError(path, f"cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise SnapshotError(path, f"is not UTF-8 text ({exc.reason})") from None
    if odd is not None:
        raise SnapshotError(path, odd, fix=_SNAPSHOT_FILE_FIX)
    if len(text) > _SNAPSHOT_LIMIT:
        raise SnapshotError(path, f"is larger than {_SNAPSHOT_LIMIT >> 20} MiB")
    return parse_snapshot(text, path)


def write_snapshot(path: str, state: GpuState) -> None:
    """Write ``state`` as a snapshot file at ``path`` (atomically, mode 0644); raises SnapshotError.

    The directory of ``path`` is the user's choice and must exist; the file is made with a
    random temporary name (O_EXCL, never through a link), fsynced, and renamed over ``path``
    (a link there is replaced, not followed): files.write_file.
    """
    text = json.dumps(as_snapshot(state), indent=2, sort_keys=True) + "\n"
    directory, name = os.path.split(os.path.abspath(path))

    def fail(where: str, reason: str) -> SnapshotError:
        return SnapshotError(
            path,
            f"cannot be written ({reason})",
            fix=f"Make sure the directory of snapshot_out ({directory}) exists and is writable "
            "on the host, and that snapshot_out is not itself a directory.",
        )

    if not os.path.isdir(directory):
        raise fail(directory, "No such file or directory")
    write_file(directory, name, text, 0o644, fail)
