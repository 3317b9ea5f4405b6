# Private to this collection: may change in any release.
"""MPS in the planner. Pure, no I/O.

Room on a GPU for an MPS client, and the plan's MPS daemons (mps_daemons).
"""

from __future__ import annotations

from . import priority
from .errors import PlacementError
from .placements import format_kb
from .plan_common import int_list, size_text
from .plan_facts import Host
from .plan_gpu import Gpu


class MpsChecks:
    """_Planner part: the checks of a placement that shares a GPU through MPS."""

    def _check_mps_room(self, p, gpu: Gpu) -> None:
        """Refuse an MPS client whose pinned_memory_limit does not fit the listed GPU's memory."""
        pinned = p.mps.pinned_memory_limit_kb
        if gpu.mps_room(pinned):
            return
        total = gpu.memory_mib * 1024
        left = max(total - gpu.mps_pinned_kb, 0)
        if gpu.mps_pinned_kb:
            already = (
                f"its MPS clients {', '.join(gpu.mps_clients)} already pinned "
                f"{format_kb(gpu.mps_pinned_kb)}, {format_kb(left)} is left"
            )
        else:
            already = "no other MPS client pinned any of it"
        lower = (
            f"lower pinned_memory_limit to at most {size_text(left // 1024 * 1024)}, "
            if left >= 1024
            else ""
        )
        raise PlacementError(
            self.state.host,
            f"{p.where}.mps.pinned_memory_limit: {format_kb(pinned)} does not fit GPU "
            f"{gpu.address}: it has {format_kb(total)} of memory and {already}; {lower}list "
            "another GPU, or use gpus: 1 to let the planner pick a GPU with room",
        )

    def _check_mig_mps(self, p, listed: list) -> None:
        """Refuse an MPS pinned_memory_limit above the memory of one instance of the profile."""
        pinned = p.mps.pinned_memory_limit_kb if p.mps is not None else None
        if not pinned:
            return
        sizes = [
            g.mig_memory[p.mig_profile]
            for g in listed or self.state.gpus
            if g.mig_capable and p.mig_profile in g.mig_memory
        ]
        if not sizes or pinned <= max(sizes) * 1024:
            return
        memory = max(sizes) * 1024
        raise PlacementError(
            self.state.host,
            f"{p.where}.mps.pinned_memory_limit: {format_kb(pinned)} is more than the "
            f"{format_kb(memory)} of memory of one {p.mig_profile} MIG instance; lower "
            f"pinned_memory_limit to at most {size_text(memory)}, or pick a larger mig_profile",
        )


def mig_daemons(plan_placements: list) -> list:
    daemons = []
    for entry in plan_placements:
        if entry["mps"] is None or not entry["gpus"] or entry["gpus"][0]["mig"] is None:
            continue
        mig = entry["gpus"][0]["mig"]
        daemons.append(
            {
                "device_uuid": mig["device_uuid"],
                "gpu_address": entry["gpus"][0]["address"],
                "pipe_dir": entry["mps"]["pipe_dir"],
                "log_dir": entry["mps"]["log_dir"],
                "clients": [entry["name"]],
                "active_thread_percentage": entry["mps"]["active_thread_percentage"],
                # Its MIG instance does not exist yet: no unit, never started (as its client).
                "waits_for": entry.get("waits_for"),
            }
        )
    return daemons


def kept_daemon_cpus(daemon: dict, node: int, cpus: list, recorded_daemons) -> list:
    """The CPUs the daemon recorded last when it may keep them, else ``cpus``.

    recorded_daemons: mps_daemons of the plan applied last (None: plan from scratch). A daemon
    of the same unit on the same node keeps its recorded CPUs while each of them is still one
    it may use (``cpus``: online, not isolated, allowed, of its node): narrowing or widening
    what it may use around them changes nothing, so its unit and, through Requires=, its
    clients are not restarted for it (day-2 rule: never restart what the user did not change).
    """
    for old in recorded_daemons or ():
        if not isinstance(old, dict) or old.get("unit") != daemon.get("unit"):
            continue
        kept = old.get("cpus")
        if old.get("node") == node and int_list(kept) and kept and set(kept) <= set(cpus):
            return sorted(kept)
    return cpus


def daemon_details(
    host: str,
    daemons: list,
    entries: list,
    parsed: list,
    gpus: list,
    state: Host,
    recorded_daemons=None,
) -> None:
    """Add unit, instance, node, CPUs, memory nodes, user, limits and priority (the highest of
    its clients, key only when not normal) to each MPS daemon entry.

    A daemon serves its clients only when they run as the user it runs as (its pipe directory is
    0700), so the clients of one daemon must share one user; raises PlacementError otherwise.
    The daemon runs on the online, not isolated, allowed CPUs of its GPU's node (of its first
    client's node when the GPU's node is unknown or has no CPUs; housekeeping CPUs included)
    and binds memory to that node's nearest memory node:
    not on the union of its clients' CPUs, so that adding, removing or resizing one client does
    not change the daemon's unit and restart, through Requires=, every other client.
    """
    if not daemons:
        return
    by_name = {entry["name"]: entry for entry in entries}
    gpu_uuid = {gpu["address"]: gpu["uuid"] for gpu in gpus}
    for daemon in daemons:
        clients = [by_name[name] for name in daemon["clients"]]
        # Whole-GPU daemons serve a GPU-... UUID; MIG ones a MIG-... UUID or a pending instance.
        mig = not (daemon["device_uuid"] or "").startswith("GPU-")
        users = sorted({(c["user"] or "root", c["group"] or "") for c in clients})
        if len(users) > 1:
            where = {p.name: p.where for p in parsed}
            named = ", ".join(f"{c['name']} runs as {c['user'] or 'root'}" for c in clients)
            raise PlacementError(
                host,
                f"{where[clients[-1]['name']]}.user: the MPS clients of one daemon (GPU "
                f"{daemon['gpu_address']}) must run as one user and group, because the daemon's "
                f"pipe directory {daemon['pipe_dir']} is private to its user ({named}); give "
                "them the same user (and group), or put them on different GPUs",
            )
        pinned = [
            c["mps"]["pinned_memory_limit_kb"]
            for c in clients
            if c["mps"] and c["mps"]["pinned_memory_limit_kb"] is not None
        ]
        instance = daemon["device_uuid"]
        gpu = state.gpu_by_id.get(daemon["gpu_address"])
        node = gpu.cpu_node if gpu is not None and gpu.cpu_node in state.usable else None
        if node is None:
            node = clients[0]["node"]
        # The node's online CPUs but isolated ones, reserved (housekeeping) CPUs included: a
        # control daemon, whose pinning then changes only with the node, not with
        # numafleet_reserved_cpus or the other placements.
        cpus = [
            cpu
            for cpu in state.node[node].get("cpus") or ()
            if cpu in state.online and cpu not in state.isolated
        ]
        if state.allowed_cpus is not None:  # never outside the allowed cpuset either
            cpus = [cpu for cpu in cpus if cpu in state.allowed_cpus]
        unit = f"nvidia-mps@{instance}.service" if instance else None
        if unit is not None and cpus:
            cpus = kept_daemon_cpus({"unit": unit}, node, cpus, recorded_daemons)
        daemon.update(
            {
                "instance": instance,
                "unit": unit,
                "gpu_uuid": gpu_uuid.get(daemon["gpu_address"]),
                "mig": mig,
                "node": node,
                "cpus": cpus or list(clients[0]["cpus"]),
                "mems": state.near_mem[node][:1] or list(clients[0]["mems"]),
                "user": clients[0]["user"],
                "group": clients[0]["group"],
                "pinned_memory_limit_kb": max(pinned) if pinned else None,
            }
        )
        # The highest priority of its clients (key only when not normal, as on placements).
        priority.add_to_entry(
            daemon, priority.highest(c.get("priority", "normal") for c in clients)
        )
