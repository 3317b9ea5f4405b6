"""Hand-written gpu_topology entries of AMD Instinct MI300X GPUs, shaped as the facts contract
(gpu_topology.gpus[] with vendor "amd" and the ``amd`` record) for planner tests.

Values follow the MI300X as AMD documents it: 8 XCDs, 192 GiB of HBM3, compute partitions
SPX/DPX/QPX/CPX (1/2/4/8 logical GPUs), memory partitions NPS1/NPS4, NPS4 only with CPX.
UUIDs and unique ids are made up, one per GPU and logical GPU.
"""

from __future__ import annotations

from synthetic_hosts import synthetic

XCDS = 8
COMPATIBLE = {"SPX": ["NPS1"], "DPX": ["NPS1"], "QPX": ["NPS1"], "CPX": ["NPS1", "NPS4"]}
COUNT = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}


def logical_uuid(bus: int, index: int) -> str:
    """The made-up UUID of logical GPU index of the GPU on PCI bus bus."""
    return f"GPU-{bus:02x}{index:02x}d5b45ff06a3a"


def mi300x(bus: int, node: int, compute: str = "SPX", memory: str = "NPS1", kfd: int = 2) -> dict:
    """A gpu_topology entry of an MI300X at 0000:<bus>:00.0 on NUMA node node."""
    count = COUNT[compute]
    per = XCDS // count
    logical = [
        {
            "index": index,
            "uuid": logical_uuid(bus, index),
            "unique_id": f"0x{bus:02x}{index:02x}d5b45ff06a3a",
            "kfd_node": kfd + index,
            "gpu_id": 10000 + bus * 16 + index,
            "render_minor": 128 + index,
            "xcds": list(range(index * per, (index + 1) * per)),
        }
        for index in range(count)
    ]
    address = f"0000:{bus:02x}:00.0"
    return {
        "address": address,
        "uuid": logical[0]["uuid"],
        "node": node,
        "numa_node": node,
        "vendor": "amd",
        "name": "AMD Instinct MI300X",
        "switch": None,
        "nvlink_peers": [],
        "memory_total_mib": 196608,
        "mig": None,
        "partition": {"compute": compute, "memory": memory},
        "amd": {
            "model": "AMD Instinct MI300X",
            "kfd_node": kfd,
            "gpu_id": logical[0]["gpu_id"],
            "unique_id": logical[0]["unique_id"],
            "uuid": logical[0]["uuid"],
            "drm_card": f"card{bus}",
            "render_minor": 128,
            "vram_total_mib": 196608,
            "compute_partition": {"current": compute, "available": ["SPX", "DPX", "QPX", "CPX"]},
            "memory_partition": {"current": memory, "available": ["NPS1", "NPS4"]},
            "compatible_memory_partitions": {mode: list(nps) for mode, nps in COMPATIBLE.items()},
            "compatible_source": "table",
            "xcd_count": XCDS,
            "logical_gpus": logical,
            "processes": [],
            "source": "sysfs",
        },
    }


def mi300x_host() -> tuple:
    """(numa, gpu_topology) of a 2-socket MI300X host: 0000:03 and 0000:23 SPX/NPS1 and 43, 63
    CPX/NPS4 on node 0; 83, a3, c3, e3 CPX/NPS4 on node 1 (8 logical GPUs each)."""
    numa = synthetic(cpus_per_node=(64, 64), mem_gb=(1024, 1024))
    gpus = [
        mi300x(0x03, 0, "SPX", "NPS1"),
        mi300x(0x23, 0, "SPX", "NPS1"),
        mi300x(0x43, 0, "CPX", "NPS4"),
        mi300x(0x63, 0, "CPX", "NPS4"),
        mi300x(0x83, 1, "CPX", "NPS4"),
        mi300x(0xA3, 1, "CPX", "NPS4"),
        mi300x(0xC3, 1, "CPX", "NPS4"),
        mi300x(0xE3, 1, "CPX", "NPS4"),
    ]
    return numa, {"gpus": gpus}
