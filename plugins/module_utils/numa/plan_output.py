# Private to this collection: may change in any release.
"""The plan's output. Pure, no I/O.

Its GPU entries (gpus, MPS daemons of whole GPUs), the text of a placement
(placement_text) and the one-line summary of a plan (plan_summary).
"""

from __future__ import annotations

from . import limits
from .allowed import allowed_text
from .cpulist import format_cpulist
from .plan_common import MPS_LOG_ROOT, MPS_PIPE_ROOT, short_address
from .plan_facts import Host
from .plan_gpu_partitions import waits_text


def plan_gpus_out(state: Host, order: dict) -> tuple:
    """(plan gpus, whole-GPU MPS daemons); order: placement name -> declaration index."""
    gpus, daemons = [], []
    for gpu in state.gpus:
        # Declaration order, whatever order kept and new placements were committed in.
        gpu.placements.sort(key=order.__getitem__)
        gpu.mps_clients.sort(key=order.__getitem__)
        mig = None
        declared = gpu.mig_declared is not None
        if gpu.mig_mode == "enabled":
            mig = {
                "mode": gpu.mig_mode,
                "mode_current": gpu.mig_mode_current,
                "declared": declared,
                "layout": [
                    {
                        "profile": slot.profile,
                        "placement_start": slot.start,
                        "placement_size": slot.size,
                        "placement": slot.placement,
                        "device_uuid": slot.device_uuid,
                        "compute_profile": slot.compute_profile,
                    }
                    for slot in gpu.slots
                ],
                "reset_required": gpu.mig_pending,
            }
        elif gpu.mig_mode is not None:
            mig = {
                "mode": gpu.mig_mode,
                "mode_current": gpu.mig_mode_current,
                "declared": declared,
                "layout": [],
                "reset_required": gpu.mig_pending,
            }
        mps = None
        if gpu.use == "mps":
            pipe = f"{MPS_PIPE_ROOT}/{gpu.uuid}"
            log = f"{MPS_LOG_ROOT}/{gpu.uuid}"
            mps = {
                "device_uuid": gpu.uuid,
                "pipe_dir": pipe,
                "log_dir": log,
                "clients": list(gpu.mps_clients),
                "pinned_memory_limit_kb_total": gpu.mps_pinned_kb,
            }
            daemons.append(
                {
                    "device_uuid": gpu.uuid,
                    "gpu_address": gpu.address,
                    "pipe_dir": pipe,
                    "log_dir": log,
                    "clients": list(gpu.mps_clients),
                    "active_thread_percentage": max(gpu.mps_pct) if gpu.mps_pct else None,
                    "waits_for": None,
                }
            )
        if gpu.use is not None:
            use = gpu.use
        elif gpu.claimed or any(not s.existing for s in gpu.slots):
            use = "mig"
        else:
            use = "free"
        gpus.append(
            {
                "address": gpu.address,
                "uuid": gpu.uuid,
                "node": gpu.node,
                "use": use,
                "placements": list(gpu.placements),
                "mig": mig,
                "mps": mps,
            }
        )
    return gpus, daemons


def partition_text(partition) -> str:
    """'/cpx3' for an AMD logical GPU entry (gpus[].partition), '' for anything else."""
    if not isinstance(partition, dict):
        return ""
    return f"/{str(partition.get('mode')).lower()}{partition.get('index')}"


def placement_text(entry: dict) -> str:
    """Where a plan entry runs: 'node1 cpus 32-39 gpus b1:00.0,ca:00.0', ' mig 1g.10gb@2', ' mps'.

    Memory nodes other than the CPU nodes follow the CPUs: 'node1 cpus 25-48 mems 0'.
    """
    nodes = "+".join(str(n) for n in entry["nodes"])
    text = f"node{nodes} cpus {format_cpulist(entry['cpus'])}"
    mems = entry.get("mems") or ()
    if any(m not in entry["nodes"] for m in mems):
        text += " mems " + "+".join(str(m) for m in mems)
    if entry["gpus"]:
        text += " gpus " + ",".join(
            short_address(g["address"]) + partition_text(g.get("partition")) for g in entry["gpus"]
        )
        mig = entry["gpus"][0]["mig"]
        if mig is not None:
            text += f" mig {mig['profile']}@{mig['placement_start']}"
        if entry["mps"] is not None:
            text += " mps"
    return text


def plan_summary(plan: dict) -> str:
    """One line per host: '<host>: 2 placements: a node0 cpus 2-17 gpus 17:00.0; ...; 1 warning'.

    A placement anchored with near: ends in ' near <BB:DD.F>' (' near 4b:00.0'); an exec
    placement without user: in ' as root' (systemd's default account); one whose MIG
    instance does not exist yet in ' (waits for MIG instance ...: <reason>)' (waits_text).
    A plan narrowed to the allowed cpuset ends in '; allowed CPUs 1,3 and memory nodes 1'.
    """
    placements = plan.get("placements") or []
    parts = []
    for entry in placements:
        text = f"{entry['name']} {placement_text(entry)}"
        near = entry.get("near")
        if near:
            text += f" near {short_address(near['address'])}"
        if limits.runs_as(entry) == "root":  # exec without user: (the plan warns)
            text += " as root"
        if entry.get("waits_for"):
            text += f" ({waits_text(entry)})"
        parts.append(text)
    count = len(placements)
    line = f"{plan.get('host')}: {count} placement{'' if count == 1 else 's'}"
    if parts:
        line += ": " + "; ".join(parts)
    warnings = len(plan.get("warnings") or [])
    if warnings:
        line += f"; {warnings} warning{'' if warnings == 1 else 's'}"
    narrowed = plan.get("allowed") or {}
    if narrowed.get("narrowed"):  # the allowed cpuset: the plan stays inside it
        line += f"; allowed {allowed_text(narrowed.get('cpus') or (), narrowed.get('mems') or ())}"
    return line
