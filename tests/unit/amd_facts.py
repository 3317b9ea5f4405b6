"""Hand-written gpu_topology entries of AMD Instinct MI300X GPUs, shaped as the facts contract
(gpu_topology.gpus[] with vendor "amd" and the ``amd`` record) for planner tests.

Values follow the MI300X as AMD documents it: 8 XCDs, 192 GiB of HBM3, compute partitions
SPX/DPX/QPX/CPX (1/2/4/8 logical GPUs), memory partitions NPS1/NPS4, NPS4 only with CPX.
UUIDs and unique ids are made up, one per GPU and logical GPU by default; ``shared=True`` gives
every logical GPU the GPU's, as the driver does on a real 8x MI300X in CPX. Render minors are
distinct per logical GPU of the host: 128 + 8 * (bus >> 5) + index.
"""

from __future__ import annotations

from typing import Optional

from synthetic_hosts import synthetic

XCDS = 8
COMPATIBLE = {"SPX": ["NPS1"], "DPX": ["NPS1"], "QPX": ["NPS1", "NPS4"], "CPX": ["NPS1", "NPS4"]}
COUNT = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}


def logical_uuid(bus: int, index: int) -> str:
    """The made-up UUID of logical GPU index of the GPU on PCI bus bus."""
    return f"GPU-{bus:02x}{index:02x}d5b45ff06a3a"


def mi300x(
    bus: int,
    node: int,
    compute: str = "SPX",
    memory: str = "NPS1",
    kfd: int = 2,
    hive: Optional[str] = None,
    shared: bool = False,
) -> dict:
    """A gpu_topology entry of an MI300X at 0000:<bus>:00.0 on NUMA node node (hive: its
    amd.hive_id; shared: its logical GPUs carry the GPU's UUID)."""
    count = COUNT[compute]
    per = XCDS // count
    logical = [
        {
            "index": index,
            "uuid": logical_uuid(bus, 0 if shared else index),
            "unique_id": f"0x{bus:02x}{0 if shared else index:02x}d5b45ff06a3a",
            "kfd_node": kfd + index,
            "gpu_id": 10000 + bus * 16 + index,
            "render_minor": 128 + 8 * (bus >> 5) + index,
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
            "hive_id": hive,
            "render_minor": logical[0]["render_minor"],
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


HIVE = "0xd2c3a1f05b6e4471"


def mi300x_hive_host(memory: str = "NPS1") -> tuple:
    """(numa, gpu_topology) of the host as a real 8x MI300X platform shows it: the eight GPUs are
    one XGMI hive in one memory partition, 03 and 23 SPX, the other six CPX, and every logical
    GPU of a GPU carries that GPU's UUID."""
    numa = synthetic(cpus_per_node=(64, 64), mem_gb=(1024, 1024))
    modes = ["SPX", "SPX"] + ["CPX"] * 6 if memory == "NPS1" else ["CPX"] * 8
    gpus = [
        mi300x(bus, 0 if bus < 0x80 else 1, mode, memory, hive=HIVE, shared=True)
        for bus, mode in zip((0x03, 0x23, 0x43, 0x63, 0x83, 0xA3, 0xC3, 0xE3), modes, strict=True)
    ]
    return numa, {"gpus": gpus}
