"""Checks 1-3 of the GPU proof kit: what the facts reader, the nvidia-smi parser and the MIG
listing parsers make of a real driver. Read-only: NVML queries and nvidia-smi listings only.
"""

from __future__ import annotations

import re
from typing import Optional

from gpu_proof import Check, Context, Skip

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    facts as numa_facts,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    gpu,
    gpu_snapshot,
    mig_smi,
    planner,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

UUID_RE = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
PROFILE_NAME_RE = re.compile(r"\d+g\.\d+gb(\+[a-z.]+|-me)?\Z")
DOCTYPE_RE = re.compile(r"<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+\"([^\"]+)\"")
# The fields both NVML and nvidia-smi -q -x give, compared one by one.
COMPARED = ("uuid", "name", "memory_total_mib", "compute_mode", "persistence_mode")
# Fields of the facts that a real driver must fill (a reason in `unavailable` is a failure): all
# enriched ones but those a lone GPU or an older driver lacks for good reason.
OPTIONAL = ("nvlink_peers", "nvlink_switches", "nvml_numa_node", "nvml_cpu_affinity")
REQUIRED = tuple(key for key in gpu.ENRICHED_FIELDS if key not in OPTIONAL)
SMI_TIMEOUT_S = 60


def reader_of(ctx: Context) -> Reader:
    return Reader(ctx.sysfs_root, ctx.procfs_root)


def nvidia_entries(facts: dict) -> list:
    return [entry for entry in facts["gpus"] if entry["vendor"] == "nvidia"]


def host_facts(ctx: Context) -> tuple:
    """(numa facts, gpu facts or None) as the kit saw them. What check 1 could not gather is
    gathered now: the NUMA facts, and the GPU facts from nvidia-smi's state when NVML gave none.
    """
    if ctx.numa_facts is None:
        ctx.numa_facts = numa_facts.read_numa_facts(reader_of(ctx))
    if ctx.gpu_facts is None and ctx.smi_state is not None and ctx.smi_state.nvidia_smi["used"]:
        ctx.gpu_facts = gpu.read_gpu_topology(reader_of(ctx), ctx.smi_state)
    return ctx.numa_facts, ctx.gpu_facts


def _raw_bus_ids(nvml) -> dict:
    """{normalised address: NVML's own busId text}, straight from nvmlDeviceGetPciInfo."""
    found = {}
    nvml.nvmlInit()
    try:
        for index in range(int(nvml.nvmlDeviceGetCount())):
            raw = nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(index)).busId
            raw = raw.decode() if isinstance(raw, bytes) else str(raw)
            found[gpu.normalise_bus_id(raw)] = raw
    finally:
        nvml.nvmlShutdown()
    return found


def _node_item(check: Check, entry: dict, numa: dict) -> None:
    sysfs_node, nvml_node = entry["numa_node"], entry.get("nvml_numa_node")
    observed = {
        "sysfs_numa_node": sysfs_node,
        "nvml_numa_node": nvml_node,
        "planner_node": entry["node"],
        "node_source": entry["node_source"],
        "nvml_reason": entry["unavailable"].get("nvml_numa_node"),
    }
    cpuless = {node["id"] for node in numa.get("nodes", []) if not node.get("cpus")}
    if nvml_node is None or sysfs_node is None:
        check.add(
            f"{entry['address']}.numa_node",
            True,
            observed,
            note="one side does not know the node; nothing to compare",
        )
    elif nvml_node == sysfs_node:
        check.add(f"{entry['address']}.numa_node", True, observed)
    elif nvml_node in cpuless:
        check.add(
            f"{entry['address']}.numa_node",
            True,
            observed,
            note="NVML names the GPU memory's own CPU-less node (GH200-like); sysfs the "
            "PCI function's node",
        )
    else:
        check.add(f"{entry['address']}.numa_node", False, observed, expected="equal")


def check_nvml(ctx: Context, check: Check) -> None:
    """Check 1: the real NVML through gpu.read_gpu_state/read_gpu_topology, against sysfs."""
    if ctx.nvml is None:
        raise Skip(ctx.nvml_reason or "nvidia-ml-py is not installed")
    state = gpu.read_gpu_state(ctx.nvml, None, None, "never")
    ctx.nvml_state = state
    check.add("nvml_available", state.nvml["available"], state.nvml)
    if not state.nvml["available"]:
        return
    # What gpu_topology_facts snapshot_out= writes; it must read back as the same state (the
    # record/replay contract the demo fleet and the tests rely on).
    path = str(ctx.out / "nvml-snapshot.json")
    gpu_snapshot.write_snapshot(path, state)
    ctx.files["nvml-snapshot.json"] = path
    back = gpu_snapshot.read_snapshot(path)
    check.add(
        "snapshot_round_trip",
        back.gpus == state.gpus,
        {"gpus": len(back.gpus), "driver": back.nvml.get("driver_version")},
    )
    try:
        ctx.numa_facts = numa_facts.read_numa_facts(reader_of(ctx))
    except NumaTuneError as exc:  # the GPU items below do not need it
        check.add("numa_facts", False, str(exc), expected="the NUMA facts of this host")
    facts = gpu.read_gpu_topology(reader_of(ctx), state)
    ctx.gpu_facts = facts
    try:
        raw = _raw_bus_ids(ctx.nvml)
    except ctx.nvml.NVMLError as exc:
        raw = {"error": str(exc)}
    entries = nvidia_entries(facts)
    matched = [entry["address"] for entry in entries if entry["address"] in state.gpus]
    lost = [
        w
        for w in facts["warnings"]
        if "not under bus/pci/devices" in w["reason"] or "did not report this GPU" in w["reason"]
    ]
    check.add(
        "pci_bus_id_to_sysfs",
        bool(matched) and not lost and sorted(raw) == sorted(state.gpus),
        {
            "nvml_bus_ids": raw,
            "sysfs_nvidia_gpus": [e["address"] for e in entries],
            "warnings": lost,
        },
        expected="every NVML GPU under /sys/bus/pci/devices and every sysfs NVIDIA GPU in NVML",
    )
    for entry in entries:
        if entry["address"] not in state.gpus:
            continue
        address, miss = entry["address"], entry["unavailable"]
        check.add(
            f"{address}.uuid",
            bool(UUID_RE.match(entry["uuid"] or "")),
            entry["uuid"],
            expected="GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
        )
        check.add(f"{address}.name", bool(entry["name"]), entry["name"])
        check.add(
            f"{address}.memory_total_mib",
            (entry["memory_total_mib"] or 0) > 0,
            entry["memory_total_mib"],
        )
        _node_item(check, entry, ctx.numa_facts or {})
        mig = entry["mig"]
        check.add(
            f"{address}.mig_mode",
            mig is not None
            and {mig["mode_current"], mig["mode_pending"]} <= {"enabled", "disabled"},
            {
                "current": mig and mig["mode_current"],
                "pending": mig and mig["mode_pending"],
                "reason": miss.get("mig"),
            },
            note="a pending change waits for a GPU reset"
            if mig and mig["mode_current"] != mig["mode_pending"]
            else "",
        )
        _profiles_item(check, address, mig, miss)
        for key in ("processes", "compute_mode", "persistence_mode"):
            check.add(
                f"{address}.{key}",
                entry[key] is not None,
                {"value": entry[key], "reason": miss.get(key)},
            )
        bad = {key: miss[key] for key in REQUIRED if key in miss}
        check.add(
            f"{address}.unavailable", not bad, miss, expected=f"none of {', '.join(REQUIRED)}"
        )


def _profiles_item(check: Check, address: str, mig: Optional[dict], miss: dict) -> None:
    """Settle whether NVML lists GPU instance profiles while MIG is disabled (or how it lists)."""
    if mig is None:
        check.add(f"{address}.mig_profiles", None, miss.get("mig"), note="no MIG on this GPU")
        return
    profiles = mig["supported_profiles"]
    observed = {
        "mode_current": mig["mode_current"],
        "listed": profiles is not None,
        "reason": miss.get("mig.supported_profiles"),
        "profiles": [
            {key: p[key] for key in ("name", "id", "max_count", "slice_count", "memory_mib")}
            | {"placements": len(p["placements"] or [])}
            for p in profiles or []
        ],
    }
    if profiles is None:
        check.add(
            f"{address}.mig_profiles",
            observed["reason"] is not None,
            observed,
            note=f"NVML lists no GPU instance profile while MIG is {mig['mode_current']}",
        )
        return
    bad = [
        p["name"]
        for p in profiles
        if not PROFILE_NAME_RE.match(p["name"] or "") or not p["placements"]
    ]
    check.add(
        f"{address}.mig_profiles",
        not bad,
        observed,
        expected="names like 1g.18gb, each with placements",
        note=f"NVML lists {len(profiles)} GPU instance profiles while MIG is {mig['mode_current']}",
    )


# ---------------------------------------------------------------------------------------------
# Check 2


def smi_runner(ctx: Context, argv: list, limit_s: int, kept: dict):
    """The runner gpu.read_nvidia_smi calls; the XML is written as evidence and kept in ``kept``."""

    def run():
        rc, out, err = ctx.run(argv, cap_s=limit_s + 10)
        ctx.write("nvidia-smi-q-x.xml", out)
        kept["text"] = out
        return rc, out, err

    return run


def check_smi_xml(ctx: Context, check: Check) -> None:
    """Check 2: the real ``nvidia-smi -q -x`` through gpu_smi, compared with NVML field by field."""
    smi = ctx.which("nvidia-smi")
    if smi is None:
        raise Skip("nvidia-smi is not in PATH")
    limit = int(ctx.left_s(SMI_TIMEOUT_S))
    argv = gpu.nvidia_smi_argv(smi, ctx.which("timeout"), limit)
    kept = {"text": ""}
    state = gpu.read_nvidia_smi(smi_runner(ctx, argv, limit, kept), False, limit)
    ctx.smi_state = state
    text = kept["text"]
    doctype = DOCTYPE_RE.search(text)
    version = re.search(r"<driver_version>([^<]*)</driver_version>", text)
    cuda = re.search(r"<cuda_version>([^<]*)</cuda_version>", text)
    check.add(
        "parser_accepts",
        state.nvidia_smi["used"] and bool(state.gpus),
        {
            "used": state.nvidia_smi["used"],
            "reason": state.nvidia_smi["reason"],
            "gpus": sorted(state.gpus),
            "dtd": doctype.group(1) if doctype else None,
            "driver_version": version.group(1) if version else None,
            "cuda_version": cuda.group(1) if cuda else None,
            "bytes": len(text),
        },
        expected="the XML parsed, one record per GPU",
    )
    if not state.nvidia_smi["used"]:
        return
    extras = mig_smi.parse_xml_mig_extras(text)
    for address, record in sorted(state.gpus.items()):
        miss = record["unavailable"]
        bad = {key: miss[key] for key in REQUIRED if key in miss}
        check.add(
            f"{address}.parsed_fields",
            not bad,
            miss,
            expected=f"{', '.join(REQUIRED)} read from the XML",
            note=f"architecture {extras.get(address, {}).get('architecture')}",
        )
    nvml = ctx.nvml_state
    if nvml is None or not nvml.nvml.get("available"):
        check.add("agrees_with_nvml", None, note="NVML gave nothing to compare with")
        return
    for name, ok, observed in agreement(nvml, state):
        check.add(name, ok, observed, expected="equal")


def agreement(nvml, smi) -> list:
    """[(item name, equal?, {nvml, nvidia_smi})] of every value both GpuStates give.

    Also what tests/unit/gpu_kit/test_recorded_runs.py replays on every recorded run.
    """
    found = [
        (
            "driver_version",
            nvml.nvml["driver_version"] == smi.nvidia_smi["driver_version"],
            {"nvml": nvml.nvml["driver_version"], "nvidia_smi": smi.nvidia_smi["driver_version"]},
        ),
        (
            "same_gpus",
            sorted(nvml.gpus) == sorted(smi.gpus),
            {"nvml": sorted(nvml.gpus), "nvidia_smi": sorted(smi.gpus)},
        ),
    ]
    for address in sorted(set(nvml.gpus) & set(smi.gpus)):
        ours, theirs = nvml.gpus[address], smi.gpus[address]
        pairs = [(key, ours[key], theirs[key]) for key in COMPARED]
        pairs += [
            (f"mig.{key}", (ours["mig"] or {}).get(key), (theirs["mig"] or {}).get(key))
            for key in ("mode_current", "mode_pending")
        ]
        # A process that starts between the two reads differs; the kit starts none meanwhile.
        pairs.append(
            ("processes", sorted(ours["processes"] or []), sorted(theirs["processes"] or []))
        )
        found += [
            (f"{address}.{key}", left == right, {"nvml": left, "nvidia_smi": right})
            for key, left, right in pairs
        ]
    return found


# ---------------------------------------------------------------------------------------------
# Check 3

LGIP_LIKE = re.compile(r"^\|\s*\d+\s+MIG\s+\S+")
LGIPP_LIKE = re.compile(r"^GPU\s+\d+\s+Profile ID")


def _listing(ctx: Context, smi: str, address: str, option: str) -> tuple:
    argv = [smi, "mig", "-i", address, option]
    rc, out, err = ctx.run(argv, cap_s=SMI_TIMEOUT_S)
    stderr = f"# stderr:\n{err}" if err else ""
    ctx.append("nvidia-smi-mig.txt", f"$ {' '.join(argv)}\n# exit status {rc}\n{out}{stderr}")
    return rc, out, err


def _listing_item(check: Check, name: str, rc: int, out: str, err: str, parsed, like) -> None:
    lines = [line for line in out.splitlines() if like.match(line.strip())]
    observed = {
        "rc": rc,
        "first_line": mig_smi._first_line(out, err),
        "rows_seen": len(lines),
        "rows_parsed": len(parsed),
    }
    if rc != 0:
        fix = mig_smi._fix(out, err)
        observed["our_fix"] = fix
        observed["nothing_found"] = mig_smi._nothing_found(out, err)
        # A listing that hung, or that a non-root user may not see, proves nothing.
        unusable = rc in (124, 127) or "permission" in fix.lower() or "as root" in fix.lower()
        check.add(
            name,
            not parsed and not unusable,
            observed,
            expected="the driver's answer to the listing (run as root; within the time limit)",
            note="" if unusable else "the driver refuses this listing; its text is recorded",
        )
        return
    check.add(
        name, len(lines) == len(parsed), observed, expected="every profile row of the output parsed"
    )


def check_mig_listings(ctx: Context, check: Check) -> None:
    """Check 3: nvidia-smi mig -lgip/-lgipp as they are on this driver, and the planner's MIG inputs."""
    smi = ctx.which("nvidia-smi")
    numa, facts = host_facts(ctx)
    if facts is None or not nvidia_entries(facts):
        raise Skip("no NVIDIA GPU in the facts (NVML and nvidia-smi gave none)")
    for entry in nvidia_entries(facts):
        address = entry["address"]
        if smi is not None:
            rc, out, err = _listing(ctx, smi, address, "-lgip")
            rows = mig_smi.parse_lgip(out) if rc == 0 else []
            _listing_item(check, f"{address}.lgip", rc, out, err, rows, LGIP_LIKE)
            rc2, out2, err2 = _listing(ctx, smi, address, "-lgipp")
            spots = mig_smi.parse_lgipp(out2) if rc2 == 0 else {}
            _listing_item(check, f"{address}.lgipp", rc2, out2, err2, list(spots), LGIPP_LIKE)
            profiles = (entry["mig"] or {}).get("supported_profiles")
            if rows and profiles:
                _compare_profiles(check, address, rows, spots, profiles)
        _planner_item(check, numa, facts, entry)


def _compare_profiles(check: Check, address: str, rows: list, spots: dict, profiles: list):
    """NVML's profiles against -lgip's rows and -lgipp's placements (one GPU)."""
    by_id = {p["id"]: p for p in profiles}
    differences = []
    for row in rows:
        ours = by_id.get(row["id"])
        if ours is None:
            differences.append(f"id {row['id']} ({row['name']}) missing from NVML")
            continue
        if ours["name"] != row["name"] or ours["max_count"] != row["total"]:
            differences.append(
                f"id {row['id']}: NVML {ours['name']} x{ours['max_count']}, "
                f"lgip {row['name']} x{row['total']}"
            )
        if abs(ours["memory_mib"] - row["memory_mib"]) > max(16, ours["memory_mib"] // 100):
            differences.append(
                f"id {row['id']}: NVML {ours['memory_mib']} MiB, lgip {row['memory_mib']} MiB"
            )
        placed = spots.get((row["gpu"], row["id"]))
        theirs = [(p["start"], p["size"]) for p in ours["placements"] or []]
        if placed is not None and sorted(placed) != sorted(theirs):
            differences.append(f"id {row['id']}: NVML placements {theirs}, lgipp {list(placed)}")
    check.add(
        f"{address}.nvml_vs_lgip",
        not differences,
        {
            "differences": differences,
            "lgip_ids": [r["id"] for r in rows],
            "nvml_ids": sorted(by_id),
        },
        expected="the same profiles, counts, sizes, placements",
    )


def _planner_item(check: Check, numa: dict, facts: dict, entry: dict) -> None:
    """Plan (never apply) one MIG instance of the smallest profile on this GPU from these facts."""
    mig = entry["mig"]
    if mig is None:
        check.add(f"{entry['address']}.planner_mig_inputs", None, note="no MIG on this GPU")
        return
    profiles = mig.get("supported_profiles")
    smallest = profiles[0]["name"] if profiles else None
    # Without listed profiles any layout must be refused as unknown yet (the name is a stand-in).
    declared = {"gpu": entry["address"], "mode": "enabled", "layout": [smallest or "1g.10gb"]}
    try:
        plan = planner.plan_host("gpu-proof", numa, facts, [], [], {}, mig_gpus=[declared])
    except NumaTuneError as exc:
        refused = smallest is None and "lists MIG profiles only in MIG mode" in str(exc)
        check.add(
            f"{entry['address']}.planner_mig_inputs",
            refused,
            {"declared": declared, "error": str(exc)},
            expected="a layout planned from the listed profiles"
            if smallest
            else "the layout refused until the driver lists profiles",
        )
        return
    layout = [g for g in plan["mig_gpus"] if g.get("gpu") == entry["address"]]
    profiles_planned = [slot["profile"] for g in layout for slot in g["layout"]]
    check.add(
        f"{entry['address']}.planner_mig_inputs",
        smallest is not None and smallest in profiles_planned,
        {"declared": declared, "planned": layout, "warnings": plan["warnings"]},
        expected="a MIG layout planned for this GPU (planned only, never applied)",
    )
