# Private to this collection: may change in any release.
"""GPU choice of the planner. Pure, no I/O.

Which GPUs a placement gets (listed by address or UUID, anchored with near:, picked on a
node) and the GPU part of its plan entry (gpus[], CUDA_* environment, warnings).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from .cpulist import format_cpulist
from .errors import PlacementError
from .gpu_amd import render_node
from .placements import GPU_SHORT_ADDRESS
from .plan_common import (
    KNOWN_DEVICES_SHOWN,
    MPS_LOG_ROOT,
    MPS_PIPE_ROOT,
    device_hint,
    device_label,
)
from .plan_fit import Fit
from .plan_gpu import Gpu, Slot, choose_gpus
from .plan_gpu_amd import (
    KFD_DEVICE,
    commit_slot,
    partition_out,
    waits_for_partition,
)
from .plan_gpu_partitions import PENDING_FIX, pending_text, waits_for_instance


class GpuChoice:
    """_Planner part: GPUs of a placement (listed, anchored, picked on a node) and its entries."""

    def _gpu_of(self, p, ident: str) -> Gpu:
        """The GPU a gpus: entry names (PCI address, BB:DD.F short address or UUID)."""
        state = self.state
        gpu = state.gpu_by_id.get(ident)
        if gpu is not None:
            return gpu
        if GPU_SHORT_ADDRESS.match(ident):
            matches = [g for g in state.gpus if g.address.partition(":")[2] == ident]
            if len(matches) == 1:
                return matches[0]
            if matches:
                raise PlacementError(
                    state.host,
                    f"{p.where}.gpus: {ident} is ambiguous: it matches GPUs "
                    f"{', '.join(g.address for g in matches)} (several PCI domains); write the "
                    f"full address with its domain, e.g. {matches[0].address}",
                )
        known = ", ".join(g.address for g in state.gpus) or "none"
        raise PlacementError(
            state.host,
            f"{p.where}.gpus: {ident} is not a GPU of this host (known: {known}); "
            "list PCI addresses or UUIDs from ansible_facts.gpu_topology",
        )

    def _listed_gpus(self, p) -> list:
        state = self.state
        gpus = []
        for ident in p.gpu_ids or ():
            gpu = self._gpu_of(p, ident)
            if gpu in gpus:
                first = p.gpu_ids[gpus.index(gpu)]
                how = (
                    "by address and UUID"
                    if gpu.uuid in (first, ident)
                    else f"as {first} and {ident}"
                )
                raise PlacementError(
                    state.host,
                    f"{p.where}.gpus lists {gpu.address} twice ({how}); list it once",
                )
            gpus.append(gpu)
        for gpu in gpus:
            self._check_amd_listed(p, gpu)
            if gpu.mig_leaving:
                raise PlacementError(
                    state.host,
                    f"{p.where}.gpus: {gpu.address} leaves MIG mode in this run "
                    f"({gpu.mig_declared.where}.mode: disabled), which may need a GPU reset; "
                    "list it once MIG is off (run site.yml again after the change), or list "
                    "another GPU",
                )
            if p.mig_profile is None and gpu.mig_mode == "enabled":
                raise PlacementError(
                    state.host,
                    f"{p.where}.gpus: {gpu.address} has MIG enabled and only serves MIG "
                    "instances; set mig_profile or list another GPU",
                )
            if p.mig_profile is None and p.partition is None and gpu.use is not None:
                if gpu.use == "mps" and p.mps is not None:
                    continue
                raise self.state.fail(
                    p,
                    f"lists GPU {gpu.address}, already given to {', '.join(gpu.placements)}; "
                    "list another GPU or use gpus: <count>",
                )
            if p.mps is not None and not gpu.uuid:
                raise PlacementError(
                    state.host,
                    f"{p.where}.mps: GPU {gpu.address} has no UUID (not an NVIDIA GPU?); MPS "
                    "needs an NVIDIA GPU: remove mps",
                )
        return gpus

    def _near_device(self, p) -> dict:
        """The PCI device of the facts that p's near: names (full or BB:DD.F address)."""
        state = self.state
        matches = [d for d in state.pci if d["address"] == p.near]
        if not matches and GPU_SHORT_ADDRESS.match(p.near):
            matches = [d for d in state.pci if d["address"].partition(":")[2] == p.near]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise PlacementError(
                state.host,
                f"{p.where}.near: {p.near} is ambiguous: it matches PCI devices "
                f"{', '.join(d['address'] for d in matches)} (several PCI domains); write the "
                f"full address with its domain, e.g. {matches[0]['address']}",
            )
        if not state.pci:
            raise PlacementError(
                state.host,
                f"{p.where}.near: {p.near} is not a PCI device of this host, which lists no "
                "GPU, NIC, NVMe drive or CXL memory device (ansible_facts.numa.pci_devices is "
                "empty); pin node: instead",
            )
        # GPUs last: near: is mostly for NICs and drives, GPUs are usually chosen with gpus:.
        devices = sorted(state.pci, key=lambda d: (d.get("kind") == "gpu", d["address"]))
        known = ", ".join(device_hint(d) for d in devices[:KNOWN_DEVICES_SHOWN])
        if len(devices) > KNOWN_DEVICES_SHOWN:
            known += f" and {len(devices) - KNOWN_DEVICES_SHOWN} more"
        raise PlacementError(
            state.host,
            f"{p.where}.near: {p.near} is not a GPU, NIC, NVMe drive or CXL memory device of "
            f"this host (known: {known}); write an address of ansible_facts.numa.pci_devices",
        )

    def _anchor(self, p):
        """p with node: set to the node of its near: device; raises PlacementError."""
        state = self.state
        device = self._near_device(p)
        label = device_label(device)
        nid = device.get("node")
        gpu = state.gpu_by_id.get(device["address"])
        if nid is None and gpu is not None and gpu.node is not None:
            # The PCI facts say unknown; the GPU facts know it (NVML's CPU affinity).
            nid = gpu.node
            device = dict(device, node=nid, node_source="gpu_topology")
        if nid is None:
            raise PlacementError(
                state.host,
                f"{p.where}.near: {label} has unknown NUMA locality (numa_node -1 and its local "
                "CPUs lie in no single node), so it gives no node to anchor on; drop near: and "
                "pin node: N instead if you know the node it is attached to (nodes with CPUs: "
                f"{', '.join(str(n) for n in state.cpu_nodes)})",
            )
        if nid not in state.usable:
            kind = state.kind_text(nid) if nid in state.node else "kind not in the NUMA facts"
            nearest = sorted(
                state.cpu_nodes,
                key=lambda other: (state.dist.get(nid, {}).get(other, 255), other),
            )
            fix = (
                f"write node: {nearest[0]} (the nearest node with CPUs) instead of near:"
                if nearest and nid in state.dist
                else "pin node: to one of "
                f"{', '.join(str(n) for n in state.cpu_nodes)} instead of near:"
            )
            raise PlacementError(
                state.host,
                f"{p.where}.near: {label} is on node {nid}, which has no CPUs a placement can "
                f"use ({kind}); {fix}",
            )
        if p.node is not None and p.node != nid:
            raise PlacementError(
                state.host,
                f"{p.where}: node: {p.node} and near: {device['address']} disagree: {label} is "
                f"on node {nid}; drop node: (near: pins the placement to the device's node) or "
                f"drop near: to keep node {p.node}",
            )
        self.anchors[p.index] = (device, p.node is not None)
        return p if p.node is not None else replace(p, node=nid)

    def _check_gpu_nodes(self, p, listed: list, pinned_nodes: Optional[list]) -> None:
        """Refuse node: or pinned cpus on another node than a listed GPU (unless allow_span)."""
        state = self.state
        known = [g for g in listed if g.node is not None and g.cpu_node is not None]
        if not known:
            return
        gpu_nodes = {g.cpu_node for g in known}
        if len(gpu_nodes) > 1:
            raise PlacementError(
                state.host,
                f"{p.where}.gpus: the listed GPUs sit on nodes "
                f"{', '.join(str(n) for n in sorted(gpu_nodes))}; list GPUs of one node or set "
                "allow_span: true",
            )
        if p.node is not None and p.node not in gpu_nodes:
            gpu = known[0]
            near = "" if gpu.cpu_node == gpu.node else f" (its nearest CPUs: node {gpu.cpu_node})"
            key, pin, drop = self._pin(p)
            raise PlacementError(
                state.host,
                f"{p.where}.{key}: {pin} is not the node of GPU {gpu.address}, which is "
                f"on node {gpu.node}{near}; {drop} (the CPUs follow the GPUs), list GPUs of "
                f"node {p.node}, or set allow_span: true to run the CPUs on node {p.node} anyway",
            )
        if pinned_nodes is not None:
            away = [n for n in pinned_nodes if n not in gpu_nodes]
            if away:
                gpu = known[0]
                away_cpus = [c for c in p.cpu_list if state.cpu_node[c] in away]
                raise PlacementError(
                    state.host,
                    f"{p.where}.cpus: CPUs {format_cpulist(away_cpus)} are on node "
                    f"{', '.join(str(n) for n in away)}, but GPU {gpu.address} is on node "
                    f"{gpu.node}; pin CPUs of node {gpu.cpu_node}, list GPUs of node "
                    f"{away[0]}, or set allow_span: true to keep the CPUs away from the GPU",
                )

    def _gpu_pick(self, p, nid: int, listed: list, fallback: bool, far: bool = False):
        """GPUs (and MIG slot) for placement p with CPUs on node nid; None if none fit.

        far: MIG GPUs of any node, nearest to nid first (allow_span with node: or pinned cpus).
        """
        state = self.state
        if p.partition is not None:
            return self._amd_pick(p, nid, listed, fallback, far)
        if p.mig_profile is not None:
            pool = listed or [
                g
                for g in state.gpus
                if g.mig_capable
                and (far or g.cpu_node == nid or (fallback and g.cpu_node is None))
                and p.mig_profile in g.mig_profiles
            ]
            if far and not listed:
                row = state.dist[nid]
                pool.sort(key=lambda g: (g.cpu_node is None, row.get(g.cpu_node, 255), g.address))
            for gpu in pool:
                pick = gpu.mig_pick(p.mig_profile)
                if pick is not None:
                    return [gpu], pick
            return None
        if listed:
            if p.mps is not None and not listed[0].mps_room(p.mps.pinned_memory_limit_kb or 0):
                return None
            return listed, None
        if p.gpu_count == 0:
            return [], None
        if p.mps is not None:
            pinned = p.mps.pinned_memory_limit_kb or 0
            shared = [
                g
                for g in state.gpus
                if g.use == "mps"
                and (g.cpu_node == nid or (fallback and g.cpu_node is None))
                and g.mps_room(pinned)
            ]
            if shared:
                return shared[:1], None
            pool = [
                g
                for g in state.free_whole.get(nid, ())
                if g.uuid and g.amd is None and g.mps_room(pinned)
            ]
            if not pool and fallback:
                pool = [
                    g for g in state.free_unknown if g.uuid and g.amd is None and g.mps_room(pinned)
                ]
            return (pool[:1], None) if pool else None
        known = state.free_whole.get(nid, [])
        if not fallback:
            chosen = choose_gpus(known, p.gpu_count)
            return None if chosen is None else (chosen, None)
        if len(known) + len(state.free_unknown) < p.gpu_count:
            return None
        chosen = choose_gpus(known, min(len(known), p.gpu_count)) or []
        chosen = chosen + state.free_unknown[: p.gpu_count - len(chosen)]
        if len(chosen) < p.gpu_count or len({g.vendor for g in chosen}) > 1:
            # one vendor's GPUs, those of known locality first
            chosen = choose_gpus(known + state.free_unknown, p.gpu_count)
            return None if chosen is None else (chosen, None)
        return chosen, None

    def _near_out(self, p) -> Optional[dict]:
        """The plan's near entry of p: the PCI device it is anchored on, or None."""
        anchor = self.anchors.get(p.index)
        if anchor is None:
            return None
        device = anchor[0]
        return {"address": device["address"], "kind": device.get("kind"), "node": device["node"]}

    def _gpu_part(self, p, fit: Fit, environment: dict, warnings: list, extra: dict) -> tuple:
        """GPU entries, CUDA_VISIBLE_DEVICES and MPS settings of a placement that has GPUs;
        ``extra`` gets the plan entry's optional keys (``device_allow``)."""
        gpus_out, devices, mps_out = self._commit_gpus(p, fit)
        if any(g.amd is not None for g in fit.gpus):
            return self._amd_part(p, fit, gpus_out, devices, environment, warnings, extra)
        visible = ",".join(devices) if all(devices) else ""
        if any(g.vendor == "nvidia" or (g.uuid or "").startswith("GPU-") for g in fit.gpus):
            environment["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        waits = None
        if visible:
            environment["CUDA_VISIBLE_DEVICES"] = visible
        elif fit.mig is not None and not fit.mig.existing:
            # The instance does not exist yet: no GPU at all rather than every GPU the process
            # would otherwise see. The unit is written but not enabled or started (waits_for);
            # the plan made after the instance is created names it.
            environment["CUDA_VISIBLE_DEVICES"] = ""
            waits = waits_for_instance(fit.gpus[0], p.mig_profile, fit.mig.start)
        if mps_out is not None:
            environment["CUDA_MPS_PIPE_DIRECTORY"] = mps_out["pipe_dir"]
            if mps_out["active_thread_percentage"] is not None:
                environment["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(
                    mps_out["active_thread_percentage"]
                )
            if mps_out["pinned_memory_limit_kb"] is not None:
                environment["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = (
                    f"0={max(mps_out['pinned_memory_limit_kb'] // 1024, 1)}M"
                )
        self._unknown_node_warnings(fit, warnings)
        missing_uuid = [g.address for g in fit.gpus if not g.uuid]
        if missing_uuid:
            warnings.append(
                f"GPU {', '.join(missing_uuid)} has no UUID (not NVIDIA, or NVML unavailable): "
                "CUDA_VISIBLE_DEVICES is not set; select the device in the program"
            )
        elif waits is not None:
            warnings.append(
                f"MIG instance {waits['mig_instance']} does not exist yet ({waits['reason']}): "
                "its unit is written with CUDA_VISIBLE_DEVICES empty (no GPU) but not enabled "
                "or started until the instance exists and the plan is made again"
            )
        if fit.mig is not None and fit.gpus[0].mig_pending:
            warnings.append(
                f"{pending_text(fit.gpus[0])}: its MIG instance {p.mig_profile}@{fit.mig.start} is "
                "kept (no move, no removal) and no new instance is planned on this GPU until the "
                f"mode applies; {PENDING_FIX.format(address=fit.gpus[0].address)}"
            )
        self._cross_node_warnings(fit, warnings)
        return gpus_out, visible, mps_out, waits

    def _amd_part(
        self,
        p,
        fit: Fit,
        gpus_out: list,
        devices: list,
        environment: dict,
        warnings: list,
        extra: dict,
    ) -> tuple:
        """The GPU part of a placement with AMD GPUs, never by index, no CUDA_* key for them.

        ROCR_VISIBLE_DEVICES by UUID (whole GPU: its uuid; partition: the logical GPU's) when
        every UUID names one logical GPU of the host. When one is shared (the logical GPUs of a
        partitioned GPU carry the GPU's unique_id) or missing, the unit is given its render
        nodes instead: ``extra["device_allow"]`` = [/dev/kfd, /dev/dri/renderD<minor>, ...]
        (DevicePolicy=closed; ROCm skips a GPU whose render node it may not open) and no
        ROCR_VISIBLE_DEVICES. A logical GPU that appears once the compute partition changes:
        "" and waits_for.
        """
        pairs = list(zip(gpus_out, devices, fit.gpus))
        amd = [(entry, device, gpu) for entry, device, gpu in pairs if "partition" in entry]
        nvidia = [device for entry, device, dummy in pairs if "partition" not in entry]
        waits = None
        slot = fit.mig if p.partition is not None else None
        shared = self.state.shared_uuids
        unusable = [
            (entry, device, gpu)
            for entry, device, gpu in amd
            if not device or device.lower() in shared
        ]
        minors = [
            (entry["partition"] or {}).get("render_minor")
            if entry["partition"] is not None
            else gpu.amd.get("render_minor")
            for entry, dummy, gpu in amd
        ]
        if slot is not None and not slot.existing:
            environment["ROCR_VISIBLE_DEVICES"] = ""
            waits = waits_for_partition(fit.gpus[0], slot)
            warnings.append(
                f"{waits['partition']} does not exist yet ({waits['reason']}): its unit is "
                "written with ROCR_VISIBLE_DEVICES empty (no GPU) but not enabled or started "
                "until the amd layer changed the mode and the plan is made again"
            )
        elif not unusable:
            environment["ROCR_VISIBLE_DEVICES"] = ",".join(device for dummy, device, g in amd)
        elif all(minor is not None for minor in minors):
            extra["device_allow"] = [KFD_DEVICE] + [render_node(minor) for minor in minors]
        else:
            missing = [e["address"] for e, dummy, g in unusable]
            warnings.append(
                f"GPU {', '.join(missing)} has no UUID of its own (no or a shared KFD "
                "unique_id) and no render node in the facts: ROCR_VISIBLE_DEVICES is not set; "
                "select the device in the program"
            )
        visible = ""
        if nvidia and all(nvidia):
            visible = ",".join(nvidia)
            environment["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            environment["CUDA_VISIBLE_DEVICES"] = visible
        self._unknown_node_warnings(fit, warnings)
        self._cross_node_warnings(fit, warnings)
        return gpus_out, visible, None, waits

    @staticmethod
    def _unknown_node_warnings(fit: Fit, warnings: list) -> None:
        """Warn of the placement's GPUs of unknown NUMA node (placed by CPU/memory fit)."""
        for address in [g.address for g in fit.gpus if g.node is None]:
            warnings.append(
                f"GPU {address} has unknown NUMA locality (numa_node -1, or a node that does "
                "not exist); CPUs and memory were "
                f"placed on node {fit.nodes[0]} by CPU/memory fit. Set node: if you know the "
                "GPU's node"
            )

    @staticmethod
    def _cross_node_warnings(fit: Fit, warnings: list) -> None:
        """Warn of the placement's GPUs away from its CPUs (traffic crosses nodes)."""
        for gpu in fit.gpus:
            if gpu.cpu_node is not None and gpu.cpu_node not in fit.nodes:
                warnings.append(
                    f"GPU {gpu.address} is on node {gpu.node}, not next to the placement's CPUs "
                    f"(node {', '.join(str(n) for n in fit.nodes)}): its traffic crosses nodes"
                )

    def _commit_gpus(self, p, fit: Fit) -> tuple:
        gpus_out, devices = [], []
        mps_out = None
        for gpu in fit.gpus:
            gpu.placements.append(p.name)
            mig = None
            device = gpu.uuid
            if p.partition is not None:
                commit_slot(gpu, fit.mig, p.name)
                device = fit.mig.device_uuid
            elif fit.mig is not None:
                start, size = fit.mig.start, fit.mig.size
                uuid, existing = fit.mig.device_uuid, fit.mig.existing
                if existing:
                    gpu.claimed.add(start)
                    gpu.slots = [
                        s if s.start != start or not s.existing else s._replace(placement=p.name)
                        for s in gpu.slots
                    ]
                elif any(s.start == start and not s.existing for s in gpu.slots):  # declared
                    gpu.slots = [
                        s if s.start != start or s.existing else s._replace(placement=p.name)
                        for s in gpu.slots
                    ]
                else:
                    gpu.slots.append(Slot(start, size, p.mig_profile, None, p.name, False))
                    gpu.slots.sort(key=lambda s: s.start)
                mig = {
                    "profile": p.mig_profile,
                    "placement_start": start,
                    "placement_size": size,
                    "device_uuid": uuid,
                    "existing": existing,
                }
                device = uuid
            elif p.mps is not None:
                if gpu.use is None:
                    self._take_whole(gpu)
                    gpu.use = "mps"
            else:
                self._take_whole(gpu)
                gpu.use = "whole"
            if p.mps is not None:
                pinned = p.mps.pinned_memory_limit_kb
                gpu.mps_clients.append(p.name)
                gpu.mps_pinned_kb += pinned or 0
                if p.mps.active_thread_percentage is not None:
                    gpu.mps_pct.append(p.mps.active_thread_percentage)
                key = device or f"{gpu.uuid or gpu.address}-mig{fit.mig.start if fit.mig else ''}"
                mps_out = {
                    "pipe_dir": f"{MPS_PIPE_ROOT}/{key}",
                    "log_dir": f"{MPS_LOG_ROOT}/{key}",
                    "active_thread_percentage": p.mps.active_thread_percentage,
                    "pinned_memory_limit_kb": pinned,
                }
            entry = {
                "address": gpu.address,
                "uuid": gpu.uuid,
                "node": gpu.node,
                "mig": mig,
                "shared_mps": p.mps is not None,
            }
            if gpu.amd is not None:  # AMD only: NVIDIA entries stay as they were
                entry["partition"] = partition_out(gpu, fit.mig if p.partition else None)
            gpus_out.append(entry)
            devices.append(device)
        if not p.gpu_ids:
            order = sorted(range(len(gpus_out)), key=lambda i: gpus_out[i]["address"])
            gpus_out = [gpus_out[i] for i in order]
            devices = [devices[i] for i in order]
        return gpus_out, devices, mps_out

    def _take_whole(self, gpu: Gpu) -> None:
        state = self.state
        pool = state.free_unknown if gpu.cpu_node is None else state.free_whole[gpu.cpu_node]
        if gpu in pool:
            pool.remove(gpu)
