"""The GPU proof kit's AMD section: what the facts reader makes of a real AMD Instinct host.

Runs only where an AMD GPU is present (a PCI function of vendor 0x1002 that gpu.read_gpus calls
a GPU, or a KFD topology node with a gpu_id); skipped elsewhere, and independent of the NVIDIA
driver checks. Read-only: sysfs, the amdsmi library's queries, ``rocminfo`` and ``amd-smi``
listings (static, partition, list, process; never ``amd-smi set``). Raw outputs are kept in the
out directory (amd-facts.json, rocminfo.txt, amd-smi-*.json) so that a run on real hardware can
become a test fixture. Where amd-smi is installed, its view (parsed by gpu_amd_smi, the
collection's amd-smi reader) is compared with the facts: the GPUs, their compute and memory
partitions, logical GPU counts, UUIDs, KFD nodes and host NUMA nodes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

from gpu_proof import Check, Context, Skip

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import gpu, gpu_amd_smi
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    CommandOutputError,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.sysfs import Reader

AMD_VENDOR = "0x1002"
ROCM_UUID_RE = re.compile(r"^\s*Uuid:\s*(GPU-[0-9A-Fa-f]+)\s*$", re.M)
# Logical GPUs per compute partition (CPX: one per XCD, xcd_count of the GPU).
LOGICAL = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4}
# amd-smi queries run (name, arguments); "list" falls back to plain ``list --json`` on releases
# before ROCm 6.4, which lack ``-e``.
AMD_SMI_LISTINGS = tuple((name, list(args)) for name, args in gpu_amd_smi.AMD_SMI_COMMANDS.items())
AMD_SMI_LIST_FALLBACK = ["list", "--json"]


def amd_present(ctx: Context) -> list:
    """Signs of an AMD GPU here: a KFD topology node with a non-zero gpu_id, an AMD PCI GPU."""
    signs = []
    nodes = Path(ctx.sysfs_root, "class", "kfd", "kfd", "topology", "nodes")
    for gpu_id in sorted(nodes.glob("*/gpu_id")):
        try:
            if gpu_id.read_text().strip() not in ("", "0"):
                signs.append(f"KFD node {gpu_id.parent.name}")
                break
        except OSError:
            continue
    return signs


def load_amdsmi() -> tuple:
    """(amdsmi, None) or (None, why not): AMD's amdsmi Python library."""
    try:
        import amdsmi
    except ImportError as exc:
        return None, f"amdsmi is not installed ({exc})"
    return amdsmi, None


def rocminfo_uuids(text: str) -> list:
    """The ``Uuid: GPU-...`` values of rocminfo's GPU agents, in its order (CPU agents print
    ``CPU-XX``, which the pattern leaves out)."""
    return ROCM_UUID_RE.findall(text)


def compare(facts: dict, rocm: Optional[list]) -> list:
    """(name, ok, observed, expected) findings on the AMD entries of gpu_topology ``facts``;
    ``rocm``: rocminfo's GPU UUIDs, or None without rocminfo."""
    found = []
    amd = [entry for entry in facts.get("gpus") or [] if entry.get("vendor") == "amd"]
    found.append(
        (
            "amd GPUs have an amd record",
            all(e.get("amd") for e in amd) and bool(amd),
            [e["address"] for e in amd if not e.get("amd")],
            "none missing",
        )
    )
    uuids, gpu_uuids, no_render = [], [], []
    for entry in amd:
        record = entry.get("amd") or {}
        mode = (record.get("compute_partition") or {}).get("current")
        logical = record.get("logical_gpus") or []
        want = LOGICAL.get(mode, record.get("xcd_count")) if mode else None
        found.append(
            (
                f"{entry['address']}: logical GPUs of {mode}",
                want is None or len(logical) == want,
                len(logical),
                want,
            )
        )
        found.append(
            (
                f"{entry['address']}: node known",
                entry.get("node") is not None,
                entry.get("node"),
                "the PCI function's numa_node",
            )
        )
        uuids += [item.get("uuid") for item in logical]
        gpu_uuids.append(record.get("uuid"))
        no_render += [
            f"{entry['address']}/{item.get('index')}"
            for item in logical
            if item.get("render_minor") is None
        ]
    found.append(("every logical GPU has a UUID", all(uuids), uuids.count(None), 0))
    # The driver gives the logical GPUs of one GPU that GPU's unique_id: the GPUs' own UUIDs
    # must differ, and the logical GPUs need their render nodes (the plan selects by them).
    found.append(
        (
            "GPU UUIDs are distinct",
            len(set(gpu_uuids)) == len(gpu_uuids),
            len(gpu_uuids),
            len(set(gpu_uuids)),
        )
    )
    found.append(("every logical GPU has a render node", not no_render, no_render, "none missing"))
    if rocm is not None:
        ours = {u.lower() for u in uuids if u}
        theirs = {u.lower() for u in rocm}
        found.append(
            ("rocminfo lists the same GPU UUIDs", ours == theirs, sorted(theirs), sorted(ours))
        )
    return found


def check_amd_facts(ctx: Context, check: Check) -> None:
    """AMD GPUs through the facts reader (sysfs, KFD, amdsmi), against rocminfo and amd-smi."""
    signs = amd_present(ctx)
    if not signs:
        raise Skip("no AMD GPU here (no KFD topology node with a gpu_id)")
    module, reason = load_amdsmi()
    reader = Reader(ctx.sysfs_root, ctx.procfs_root)
    facts = gpu.read_gpu_topology(
        reader, gpu.nvml_unavailable("not asked"), lambda: (module, reason)
    )
    ctx.write("amd-facts.json", json.dumps(facts, indent=1, sort_keys=True) + "\n")
    rocm = None
    tool = ctx.which("rocminfo")
    if tool:
        rc, out, err = ctx.run([tool], cap_s=60)
        ctx.write("rocminfo.txt", out + (f"\n--- stderr\n{err}" if err else ""))
        rocm = rocminfo_uuids(out) if rc == 0 else None
    smi = ctx.which("amd-smi")
    outputs = run_amd_smi(ctx, smi) if smi else None
    for name, ok, observed, expected in compare(facts, rocm) + compare_amd_smi(facts, outputs):
        check.add(name, ok, observed, expected)
    check.add("amdsmi loaded", module is not None or None, reason, "the amdsmi library")


def run_amd_smi(ctx: Context, smi: str) -> dict:
    """{query name: stdout} of the amd-smi queries that succeeded; every answer is kept as
    amd-smi-<name>.json (``rc=<n>`` and stderr when it failed)."""
    outputs = {}
    for name, args in AMD_SMI_LISTINGS:
        rc, out, err = ctx.run([smi, *args], cap_s=60)
        if rc != 0 and name == "list":
            ctx.write("amd-smi-list-e.json", f"rc={rc}\n{err}")
            rc, out, err = ctx.run([smi, *AMD_SMI_LIST_FALLBACK], cap_s=60)
        ctx.write(f"amd-smi-{name}.json", out if rc == 0 else f"rc={rc}\n{err}")
        if rc == 0:
            outputs[name] = out
    return outputs


def _same(name: str, ours, theirs) -> tuple:
    """A finding comparing our value with amd-smi's; skipped (None) when amd-smi has none."""
    return (name, None if theirs is None else ours == theirs, ours, theirs)


def compare_amd_smi(facts: dict, outputs: Optional[dict]) -> list:
    """(name, ok, observed, expected) findings: the facts' AMD GPUs against amd-smi's view.

    ``outputs``: run_amd_smi's {query: stdout}, or None without amd-smi (no findings). Observed
    is ours, expected amd-smi's; a value amd-smi does not give makes the finding skipped.
    """
    if outputs is None:
        return []
    if "static" not in outputs:
        return [("amd-smi static ran", False, sorted(outputs), "amd-smi static --json output")]
    try:
        records = gpu_amd_smi.parse_amd_smi(
            outputs["static"], outputs.get("partition"), outputs.get("list"), outputs.get("process")
        )
        numa = gpu_amd_smi.numa_nodes(outputs["static"])
    except CommandOutputError as exc:
        return [("amd-smi output parses", False, str(exc), "amd-smi's documented output")]
    found = [("amd-smi output parses", True, sorted(outputs), None)]
    amd = [entry for entry in facts.get("gpus") or [] if entry.get("vendor") == "amd"]
    for entry in amd:
        address, ours = entry["address"], entry.get("amd") or {}
        theirs = records.get(address)
        found.append((f"{address}: amd-smi lists it", theirs is not None, address, sorted(records)))
        if theirs is None:
            continue
        for key in ("compute_partition", "memory_partition"):
            found.append(
                _same(
                    f"{address}: {key} (amd-smi)",
                    (ours.get(key) or {}).get("current"),
                    (theirs.get(key) or {}).get("current"),
                )
            )
        ours_logical = ours.get("logical_gpus") or []
        theirs_logical = theirs["logical_gpus"]
        found.append(
            _same(f"{address}: logical GPUs (amd-smi)", len(ours_logical), len(theirs_logical))
        )
        for key in ("uuid", "kfd_node"):
            values = [item[key] for item in theirs_logical]
            found.append(
                _same(
                    f"{address}: logical GPU {key}s (amd-smi)",
                    [item.get(key) for item in ours_logical],
                    values if None not in values else None,
                )
            )
        found.append(_same(f"{address}: NUMA node (amd-smi)", entry.get("node"), numa.get(address)))
    extra = sorted(set(records) - {entry["address"] for entry in amd})
    found.append(("amd-smi shows no GPU the facts lack", not extra, extra, []))
    return found
