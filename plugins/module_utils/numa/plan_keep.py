# Private to this collection: may change in any release.
"""Stable plans in the planner. Pure, no I/O.

The recorded plan (parse_recorded), a placement's request (placement_request) and the
commit of an unchanged placement on its recorded resources.
"""

from __future__ import annotations

from typing import Optional

from .cpulist import format_cpulist
from .errors import PlacementError, PlanError
from .placements import RESERVED_VAR, format_kb
from .plan_common import PLAN_VERSION, int_list
from .plan_fit import Fit
from .plan_gpu_amd import partitioned, xcp_pick


class KeepRecorded:
    """_Planner part: commit a placement whose request did not change on its recorded resources."""

    def _keep(self, p, old: dict) -> Optional[str]:
        """Commit p on the resources of its recorded entry old; the reason it cannot, or None."""
        state = self.state
        if p.near is not None:
            p = self._anchor(p)
        listed = self._listed_gpus(p) if p.gpu_ids else []
        nodes = list(old["nodes"])
        if p.node is not None and nodes[0] != p.node:
            return f"its recorded node {nodes[0]} is not node {p.node}"
        lost = [nid for nid in nodes if nid in state.untrusted]
        if lost:
            raise PlanError(
                state.host,
                f"{p.where} runs on node {lost[0]} (the plan applied last), whose facts cannot "
                f"be trusted now: numa_facts could not use {state.untrusted[lost[0]]}; "
                "planning it elsewhere would move a running service, so fix the host's sysfs "
                "(or the /sys the facts read) and gather facts again, or set "
                "numafleet_repack: true to place every placement anew",
            )
        cpus = old["cpus"]
        for cpu in cpus:
            node = state.cpu_node.get(cpu)
            if node is None:
                return f"its CPU {cpu} no longer exists"
            if cpu in state.offline or cpu not in state.online:
                return f"its CPU {cpu} is offline"
            if cpu in state.reserved:
                return f"its CPU {cpu} is now in {RESERVED_VAR}"
            if cpu in state.isolated and p.cpu_list is None:
                return f"its CPU {cpu} is now isolated"
            if state.allowed_cpus is not None and cpu not in state.allowed_cpus:
                return (
                    f"its CPU {cpu} is now outside the allowed cpuset "
                    f"({format_cpulist(state.allowed_out['cpus'])}, from "
                    f"{state.allowed_source_text('cpus')})"
                )
            if cpu in state.taken_cpus:
                return f"its CPU {cpu} is pinned by another placement"
            if node not in nodes:
                return f"its CPU {cpu} is now on node {node}, not on node {nodes[0]}"
        warnings: list = []
        if p.cpu_list is not None:
            self._explicit_cpus(p, warnings)
        elif len(cpus) < p.cpu_count:
            return f"it recorded {len(cpus)} CPUs for cpus: {p.cpu_count}"
        mem_node = old.get("memory_node")
        if mem_node is None:
            hugepages = old.get("hugepages")
            mem_node = hugepages["node"] if hugepages else old["mems"][0]
        if state.allowed_mems is not None:
            for mem in sorted(set(old["mems"]) | {mem_node}):
                if mem not in state.allowed_mems:
                    return f"its memory node {mem} is now outside {state.allowed_mems_text()}"
        gpu_mems = [m for m in old["mems"] if m in state.gpu_memory]
        if gpu_mems:
            return (
                f"its memory node {gpu_mems[0]} is the memory of GPU "
                f"{state.gpu_memory[gpu_mems[0]]}, which placements never use"
            )
        if mem_node not in state.budget:
            return f"its memory node {mem_node} has no memory now"
        hp_kb = 0
        if p.hugepages is not None:
            if p.hugepages.size_kb not in state.hp_sizes[mem_node]:
                return f"node {mem_node} no longer offers {format_kb(p.hugepages.size_kb)} pages"
            hp_kb = p.hugepages.size_kb * p.hugepages.count
        if state.used_kb[mem_node] + p.memory_kb + hp_kb > state.budget[mem_node]:
            return f"its memory no longer fits the budget of node {mem_node}"
        fit = Fit()
        fit.nodes = nodes
        fit.cpus = tuple(cpus)
        fit.mem_node = mem_node
        fit.mems = list(old["mems"])
        fit.spans = bool(old.get("spans"))
        for entry in old["gpus"]:
            gpu = state.gpu_by_id.get(entry["address"])
            if gpu is None:
                return f"its GPU {entry['address']} is gone"
            if listed and gpu not in listed:
                return f"its GPU {entry['address']} is not listed in gpus"
            part = entry.get("partition")
            if part is not None or p.partition is not None:
                # An AMD logical GPU: kept on its recorded GPU and partition index.
                index = part.get("index") if isinstance(part, dict) else None
                if p.partition is None or index is None:
                    return f"GPU {gpu.address} no longer serves it a logical GPU"
                pick = xcp_pick(gpu, p.partition, index)
                if pick is None:
                    return (
                        f"its logical GPU {p.partition.lower()}{index} of GPU {gpu.address} is no "
                        "longer free (taken, or the GPU's compute partition changes)"
                    )
                fit.mig = pick
                fit.gpus.append(gpu)
                continue
            mig = entry.get("mig")
            if mig is not None:
                if not gpu.mig_capable or p.mig_profile is None:
                    return f"GPU {gpu.address} no longer serves MIG instances"
                pick = gpu.mig_pick(p.mig_profile, mig["placement_start"])
                if pick is None and gpu.mig_pending and mig.get("existing") is False:
                    # It waited for its instance already: it keeps waiting on its slot (no
                    # move, no removal); the MIG layer creates it only once the mode applies.
                    pick = gpu.mig_pick(p.mig_profile, mig["placement_start"], pending_ok=True)
                if pick is None:
                    return (
                        f"its MIG slot {p.mig_profile}@{mig['placement_start']} of GPU "
                        f"{gpu.address} is no longer free"
                    )
                fit.mig = pick
            elif gpu.mig_capable or gpu.mig_leaving or gpu.mig_mode == "enabled":
                return f"GPU {gpu.address} is now in MIG mode"
            elif partitioned(gpu):
                return f"GPU {gpu.address} is now in compute partition {gpu.amd_compute_planned}"
            elif entry.get("shared_mps"):
                if gpu.use not in (None, "mps"):
                    return f"GPU {gpu.address} is now given whole to another placement"
                if p.mps is None or not gpu.mps_room(p.mps.pinned_memory_limit_kb or 0):
                    return f"GPU {gpu.address} has no room left for its MPS share"
            elif gpu.use is not None:
                return f"GPU {gpu.address} is now used by {', '.join(gpu.placements)}"
            fit.gpus.append(gpu)
        if fit.spans:
            warnings.append(
                f"spans NUMA nodes {', '.join(str(n) for n in nodes)} (kept from the recorded plan)"
            )
        halves = state.half_core_text(cpus) if p.cpu_list is None else None
        if halves is not None:  # kept: a running service is not moved for it
            warnings.append(f"{halves} (kept from the recorded plan)")
        self.out.append(self._commit(p, fit, warnings))
        return None

    def check_amd_changes(self, placements: list, recorded: Optional[dict]) -> None:
        """Refuse a declared compute partition change on a GPU that serves a placement kept
        from the recorded plan (request unchanged) in another mode: the change would take its
        GPU or logical GPU away under a running service."""
        if not recorded:
            return
        state = self.state
        for p in placements:
            old = recorded.get(p.name)
            if old is None or request_change(old.get("request"), placement_request(p)):
                continue
            for entry in old.get("gpus") or ():
                gpu = state.gpu_by_id.get(entry.get("address"))
                if gpu is None or gpu.amd is None or gpu.amd_declared is None:
                    continue
                planned = gpu.amd_compute_planned
                if planned == gpu.amd_compute:
                    continue
                part = entry.get("partition")
                mode = part.get("mode") if isinstance(part, dict) else "SPX"
                if mode == planned:
                    continue
                what = (
                    f"{mode} logical GPU {part.get('index')}"
                    if isinstance(part, dict)
                    else "the whole GPU"
                )
                raise PlacementError(
                    state.host,
                    f"{gpu.amd_declared.where}.compute_partition: {planned} on GPU "
                    f"{gpu.address} (now {gpu.amd_compute}) takes away {what} that {p.where} "
                    f"runs on (kept from the plan applied last); move or remove {p.name} "
                    f"first, or keep compute_partition: {gpu.amd_compute} on this GPU",
                )


def placement_request(p) -> dict:
    """What a placement asks for in resources (JSON-ready); a kept placement's must not change.

    Only the keys that decide where it runs: cpus (count or list), gpus (count or list),
    memory_kb, hugepages, node, near, mig_profile, MPS share and allow_span. exec, environment,
    user, tenant and the like change the unit, not the placement.
    """
    request = {
        "cpus": list(p.cpu_list) if p.cpu_list is not None else p.cpu_count,
        "gpus": list(p.gpu_ids) if p.gpu_ids else p.gpu_count,
        "memory_kb": p.memory_kb,
        "hugepages": (
            None
            if p.hugepages is None
            else {"size_kb": p.hugepages.size_kb, "count": p.hugepages.count}
        ),
        "node": p.node,
        "near": p.near,
        "mig_profile": p.mig_profile,
        "mps": p.mps is not None,
        "mps_pinned_memory_limit_kb": None if p.mps is None else p.mps.pinned_memory_limit_kb,
        "allow_span": p.allow_span,
    }
    if p.partition is not None:  # AMD only: the requests of other placements stay as they were
        request["partition"] = p.partition
    return request


def request_change(old: Optional[dict], new: dict) -> str:
    """'' when old equals new, else the changed keys as 'cpus 4 -> 8, memory_kb ...'."""
    if old == new:
        return ""
    if not isinstance(old, dict):
        return "no request was recorded"
    return ", ".join(
        f"{key} {old.get(key)!r} -> {new[key]!r}".replace("'", "")
        for key in new
        if old.get(key) != new[key]
    )


_RECORDED_FIX = (
    "move the file away, or set numafleet_repack: true for this host to plan every placement "
    "from scratch (placements may then move)"
)


def parse_recorded(host: str, recorded: Optional[dict], path: str) -> Optional[dict]:
    """name -> placement entry of the recorded plan (None when there is none); raises PlanError.

    recorded: ansible_facts.numafleet_recorded (numa_facts option recorded_plan): ``state``
    (absent, present or invalid), ``plan`` (the parsed file) and ``error``. A file that is not
    a plan of this collection for this host, or one in which a placement lacks its resources,
    is refused with the path and the fix: it is never trusted blindly.
    """
    if not recorded or recorded.get("state") in (None, "absent"):
        return None

    def refuse(why: str) -> PlanError:
        return PlanError(host, f"the recorded plan {path} {why}; {_RECORDED_FIX}")

    if recorded.get("state") != "present":
        if recorded.get("kind") in ("directory", "other"):
            raise PlanError(
                host,
                f"the recorded plan {path} {recorded.get('error') or 'is not a regular file'}: "
                "move it away (numafleet_repack: true cannot replace it). Nothing was changed.",
            )
        raise refuse(recorded.get("error") or "cannot be read")
    plan = recorded.get("plan")
    if not isinstance(plan, dict) or not isinstance(plan.get("placements"), list):
        raise refuse("is not a plan of numafleet.tuning (no placements list)")
    if plan.get("version") != PLAN_VERSION:
        raise refuse(f"has plan version {plan.get('version')!r}, not {PLAN_VERSION}")
    if plan.get("host") != host:
        raise refuse(f"was recorded for host {plan.get('host')!r}, not {host}")
    awaiting = plan.get("awaiting_restart", [])
    if not isinstance(awaiting, list) or not all(isinstance(u, str) for u in awaiting):
        raise refuse("has an awaiting_restart that is not a list of unit names")
    out = {}
    for position, entry in enumerate(plan["placements"]):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or name in out:
            raise refuse(f"has a bad or repeated name at placements[{position}]")
        ok = (
            int_list(entry.get("cpus"))
            and int_list(entry.get("nodes"))
            and entry["nodes"]
            and int_list(entry.get("mems"))
            and entry["mems"]
            and isinstance(entry.get("gpus"), list)
            and all(
                isinstance(g, dict) and isinstance(g.get("address"), str) for g in entry["gpus"]
            )
        )
        if not ok:
            raise refuse(f"has a placement {name} without valid cpus, nodes, mems or gpus")
        out[name] = entry
    return out
