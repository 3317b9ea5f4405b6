# Private to this collection: may change in any release.
"""GPU state from ``nvidia-smi -q -x``: its XML and the outcome of a finished run.

Split from gpu.py so that a facts run without nvidia-smi does not compile it: gpu.read_nvidia_smi
imports this module only when nvidia-smi has run.
"""

from __future__ import annotations

import re
from typing import Optional

from .errors import CommandOutputError
from .gpu_records import (
    NVIDIA_SMI_COMMAND,
    QUOTE_LIMIT,
    SOURCE_NVIDIA_SMI,
    GpuState,
    clean_text,
    clip,
    empty_record,
    normalise_bus_id,
    quote,
)

_NOT_AVAILABLE = ("", "n/a", "none")
# nvidia-smi's spellings of the values the facts give in lower case.
_XML_SWITCH = ("Enabled", "Disabled")
_XML_COMPUTE_MODES = ("Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process")
# coreutils timeout: 124 when the command ran out of time, 137 when it had to be killed.
_TIMEOUT_STATUSES = (124, 137)
# A real ``nvidia-smi -q -x`` report is well under a MiB per GPU.
_OUTPUT_LIMIT = 64 << 20


def _xml_value(element, path: str, miss: dict, key: str) -> Optional[str]:
    found = element.find(path)
    if found is None:
        miss[key] = f"nvidia-smi printed no <{path}>"
        return None
    text = (found.text or "").strip()
    if text.lower() in _NOT_AVAILABLE or text.startswith("["):
        miss[key] = f"nvidia-smi reports {clip(text) or 'nothing'} for <{path}>"
        return None
    return text


def _xml_choice(text: Optional[str], spellings: tuple, miss: dict, key: str, label: str):
    """The lower-case value of nvidia-smi's spelling ``text``; None (reason in ``miss``) if unknown.

    An unknown spelling must not pass through: a snapshot would record it and then refuse it.
    """
    if text is None:
        return None
    value = re.sub(r"[\s-]+", "_", text.strip()).lower()
    if value in (spelling.lower() for spelling in spellings):
        return value
    miss[key] = f"nvidia-smi: {label} {quote(text)} is not one of {', '.join(spellings)}"
    return None


def _xml_int(text: Optional[str]) -> Optional[int]:
    token = (text or "").split(" ", 1)[0]
    return int(token) if token.isascii() and token.isdigit() else None


def _xml_mig(element, miss: dict) -> Optional[dict]:
    raw = _xml_value(element, "mig_mode/current_mig", miss, "mig")
    current = _xml_choice(raw, _XML_SWITCH, miss, "mig", "mig mode_current")
    if current is None:
        return None
    raw = _xml_value(element, "mig_mode/pending_mig", {}, "")
    pending = current
    if raw is not None:  # absent or N/A: no change is pending
        pending = _xml_choice(raw, _XML_SWITCH, miss, "mig.mode_pending", "mig mode_pending")
    instances: dict = {}
    for device in element.findall("mig_devices/mig_device"):
        gpu_instance = _xml_int(device.findtext("gpu_instance_id"))
        compute_instance = _xml_int(device.findtext("compute_instance_id"))
        if gpu_instance is None:
            continue
        computes = instances.setdefault(gpu_instance, set())
        if compute_instance is not None:
            computes.add(compute_instance)
    miss["mig.supported_profiles"] = "not reported by nvidia-smi -q"
    if instances:
        miss["mig.gpu_instances"] = "nvidia-smi -q gives instance ids only, not profiles or UUIDs"
    return {
        "mode_current": current,
        "mode_pending": pending,
        "gpu_instances": [
            {
                "id": gi_id,
                "profile_id": None,
                "profile_name": None,
                "placement_start": None,
                "placement_size": None,
                "compute_instances": [
                    {"id": ci_id, "profile_id": None, "profile_name": None, "mig_device_uuid": None}
                    for ci_id in sorted(instances[gi_id])
                ],
                "mig_device_uuid": None,
            }
            for gi_id in sorted(instances)
        ],
        "supported_profiles": None,
    }


def _xml_record(element) -> dict:
    record = empty_record()
    miss = record["unavailable"]
    record["uuid"] = _xml_value(element, "uuid", miss, "uuid")
    record["name"] = _xml_value(element, "product_name", miss, "name")
    total = _xml_value(element, "fb_memory_usage/total", miss, "memory_total_mib")
    record["memory_total_mib"] = _xml_int(total)
    if total is not None and record["memory_total_mib"] is None:
        miss["memory_total_mib"] = f"nvidia-smi printed {quote(total)}, not a size in MiB"
    for key, spellings in (("compute_mode", _XML_COMPUTE_MODES), ("persistence_mode", _XML_SWITCH)):
        value = _xml_value(element, key, miss, key)
        record[key] = _xml_choice(value, spellings, miss, key, key)
    record["mig"] = _xml_mig(element, miss)
    if element.find("processes") is None:
        miss["processes"] = "nvidia-smi printed no <processes>"
    else:
        pids = {
            _xml_int(item.findtext("pid")) for item in element.findall("processes/process_info")
        }
        record["processes"] = sorted(pid for pid in pids if pid is not None)
    for key in ("nvlink_peers", "nvlink_switches", "nvml_numa_node", "nvml_cpu_affinity"):
        miss[key] = "not reported by nvidia-smi -q"
    return record


def parse_nvidia_smi_xml(text: str) -> GpuState:
    """GPU state from ``nvidia-smi -q -x`` output; raises CommandOutputError if it is not that XML.

    A ``<gpu>`` without a usable bus id becomes a warning; absent or ``N/A`` values are None with
    the reason in the GPU's ``unavailable`` map.
    """
    from xml.etree import ElementTree  # only nvidia-smi's output needs it: imported when used

    try:
        root = ElementTree.fromstring(text)
    except (ElementTree.ParseError, ValueError, LookupError) as exc:
        raise CommandOutputError(
            NVIDIA_SMI_COMMAND, f"output is not XML ({clip(str(exc))})"
        ) from None
    if root.tag != "nvidia_smi_log":
        raise CommandOutputError(
            NVIDIA_SMI_COMMAND,
            f"output's root element is <{clip(str(root.tag))}>, not <nvidia_smi_log>",
        )
    gpus, warnings = {}, []
    for position, element in enumerate(root.findall("gpu")):
        raw = element.get("id") or element.findtext("pci/pci_bus_id") or ""
        try:
            address = normalise_bus_id(raw)
        except ValueError as exc:
            warnings.append({"path": f"nvidia-smi:gpu[{position}]", "reason": str(exc)})
            continue
        gpus[address] = _xml_record(element)
    driver = clean_text(root.findtext("driver_version"))
    return GpuState(
        source=SOURCE_NVIDIA_SMI,
        nvml={"available": False, "reason": None, "driver_version": None},
        nvidia_smi={"used": True, "reason": None, "driver_version": driver},
        gpus=gpus,
        warnings=tuple(warnings),
    )


def _first_line(*texts) -> str:
    for text in texts:
        head = (text or "").lstrip()[: QUOTE_LIMIT * 4]
        if head:
            return clip(head.splitlines()[0].rstrip())
    return ""


def _smi_outcome(rc: int, out: str, err: str, timeout_s: Optional[int]) -> tuple:
    """(GPU state, None) of a finished nvidia-smi, or (None, (reason, how to fix or None))."""
    if timeout_s is not None and rc in _TIMEOUT_STATUSES:
        return None, (
            f"timed out after {timeout_s} s",
            "raise nvidia_smi_timeout if the driver is only slow, or find out why nvidia-smi hangs",
        )
    if rc != 0:
        return None, (f"exited with status {rc}: {_first_line(err, out)}".rstrip(": "), None)
    if len(out or "") > _OUTPUT_LIMIT:
        limit = _OUTPUT_LIMIT >> 20
        return None, (f"printed more than {limit} MiB, which is no nvidia-smi -q -x report", None)
    try:
        return parse_nvidia_smi_xml(out), None
    except CommandOutputError as exc:
        return None, (exc.reason, None)
