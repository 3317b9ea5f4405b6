# Private to this collection: may change in any release.
"""The apply roles' inputs turned into the arguments of numafleet.tuning.host_apply, in Python.

What the five apply roles' ``vars/main.yml`` (hugepages, numa_kernel, nvidia_mig, nvidia_mps,
pinned_services) and the playbooks' ``vars/roles.yml`` computed before this module replaced them
(issue 20), and the measurement-settings check of the playbooks. Same values, same messages,
same order:

- ``ROLE_DEFAULTS``: {role input: default}, equal to the roles' ``defaults/main.yml``.
- ``site_inputs(host_vars)``: {role input: value} as site.yml / drift_check.yml compute them from
  the numafleet_* host variables (the *_plan inputs left out: the plan is passed separately).
- ``build(host, inputs, plan, facts, layers)``: ``ApplyArgs(module_args, reboot_ok, problems)``.
- ``measure_problems(host, host_vars)``: the measurement-settings message, [] when fine.

Never raises on a bad input type: a value of the wrong shape is a problem naming the host and the
role input. Controller side only.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    cmdline,
    gpu_settings,
    partition,
    units,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.cpulist import format_cpulist
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import NumaTuneError
from ansible_collections.numafleet.tuning.plugins.plugin_utils import _module_inputs
from ansible_collections.numafleet.tuning.plugins.plugin_utils._host_vars import (
    BY_NAME,
    INVENTORY_ROLE_INPUTS,
    PLAN_INPUTS,
    role_input_sources,
)

ALL_LAYERS = ("hugepages", "kernel", "gpu", "amd", "mig", "mps", "units")

# Every input of the five apply roles and its default (roles/*/defaults/main.yml; a unit test
# compares the two).
ROLE_DEFAULTS: dict = {
    "hugepages_render_root": None,
    "hugepages_boot_reserve": [],
    "hugepages_mounts": [],
    "hugepages_bootloader": "auto",
    "hugepages_reboot_ok": False,
    "hugepages_kernel_isolation": "none",
    "hugepages_sysfs_root": "/sys",
    "hugepages_procfs_root": "/proc",
    "numa_kernel_numa_balancing": "auto",
    "numa_kernel_zone_reclaim_mode": "0",
    "numa_kernel_thp_enabled": "madvise",
    "numa_kernel_thp_defrag": "madvise",
    "numa_kernel_numad": "masked",
    "numa_kernel_irqbalance_banned": "auto",
    "numa_kernel_irq_affinity": False,
    "numa_kernel_render_root": None,
    "nvidia_gpu_settings": [],
    "nvidia_gpu_render_root": None,
    "nvidia_gpu_snapshot": None,
    "nvidia_gpu_backend": "auto",
    "nvidia_gpu_sysfs_root": "/sys",
    "nvidia_gpu_procfs_root": "/proc",
    "amd_partition_render_root": None,
    "amd_partition_reset_ok": False,
    "amd_partition_backend": "auto",
    "amd_partition_sysfs_root": "/sys",
    "amd_partition_procfs_root": "/proc",
    "nvidia_mig_render_root": None,
    "nvidia_mig_snapshot": None,
    "nvidia_mig_reset_ok": False,
    "nvidia_mig_require_gpu": False,
    "nvidia_mig_backend": "auto",
    "nvidia_mig_parted_config": "/etc/numafleet/mig-parted.yaml",
    "nvidia_mig_sysfs_root": "/sys",
    "nvidia_mig_procfs_root": "/proc",
    "nvidia_mps_render_root": None,
    "nvidia_mps_require_gpu": False,
    "nvidia_mps_restart": "auto",
    "nvidia_mps_gpu_topology": None,
    "nvidia_mps_unit_dir": "/etc/systemd/system",
    "nvidia_mps_manifest_path": "/etc/numafleet/mps-units.json",
    "nvidia_mps_control_path": "/usr/bin/nvidia-cuda-mps-control",
    "nvidia_mps_nvidia_smi_path": "/usr/bin/nvidia-smi",
    "pinned_services_render_root": None,
    "pinned_services_hardening": True,
    "pinned_services_preflight": "warn",
    "pinned_services_restart": "auto",
    "pinned_services_unit_dir": "/etc/systemd/system",
    "pinned_services_manifest_path": "/etc/numafleet/manifest.json",
}

SIZE_NAMES = {"2M": 2048, "1G": 1048576}
_BOOTLOADERS = {"Debian": "grub_d", "RedHat": "grubby"}
_CPULIST = re.compile(r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*\Z")
_PASS = '"{{ ansible_facts.numafleet_plan }}"'
_MISSING = object()


class ApplyArgs(NamedTuple):
    """What build() returns: the host_apply arguments, hugepages_reboot_ok, and the problems."""

    module_args: dict
    reboot_ok: bool
    problems: list


def _get(value, key, default=_MISSING):
    """``value.key | default(default)`` of Jinja: the default when value is no mapping or lacks key."""
    if isinstance(value, Mapping) and key in value:
        return value[key]
    return default


def _seq(value) -> bool:
    """Jinja's ``is sequence`` for what a plan holds (a list; a string is refused here)."""
    return isinstance(value, (list, tuple))


def _text(value) -> str:
    """How Jinja writes a value into a message (None, True, [..] as Python writes them)."""
    return value if isinstance(value, str) else str(value)


def _shown(value, default="none") -> str:
    return default if value is _MISSING else _text(value)


def _json(value) -> str:
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _bool(value) -> bool:
    """Ansible's ``| bool``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true", "y", "t")
    if isinstance(value, (int, float)):
        return value == 1
    return False


def _int(value) -> int:
    """Jinja's ``| int``: 0 for what is not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return 0
    except OverflowError:
        return 0


def _hashable_in(value, choices) -> bool:
    try:
        return value in choices
    except TypeError:
        return False


def _root_ok(root) -> bool:
    return isinstance(root, str) and os.path.isabs(root) and root.rstrip("/") != ""


def _root(render_root) -> str:
    return render_root if render_root is not None else "/"


def site_inputs(host_vars: Mapping) -> dict:
    """{role input: value} of every apply-role input but the *_plan ones, as site.yml sets them.

    ``host_vars``: the host's variables (numafleet_* and, for INVENTORY_ROLE_INPUTS, the role
    inputs themselves). Each mapped input takes its host variable, else that variable's default
    (HOST_VARS); nvidia_mig_snapshot is numafleet_gpu_snapshot only in render mode. The inputs
    no playbook sets take the host's value, else ROLE_DEFAULTS.
    """
    host_vars = host_vars if isinstance(host_vars, Mapping) else {}
    out = {}
    for role_input, var in role_input_sources().items():
        if role_input in PLAN_INPUTS:
            continue
        out[role_input] = host_vars.get(var, BY_NAME[var].default)
    if host_vars.get("numafleet_render_root") is None:
        out["nvidia_mig_snapshot"] = None
        out["nvidia_gpu_snapshot"] = None
    for role_input in INVENTORY_ROLE_INPUTS:
        out[role_input] = host_vars.get(role_input, ROLE_DEFAULTS[role_input])
    for role_input, default in ROLE_DEFAULTS.items():
        out.setdefault(role_input, default)
    return out


def _plan_message(host, role_input, shape, plan) -> str:
    return (
        f"host {host}: {role_input} is not this host's plan from numafleet.tuning.numa_plan "
        f"(version 1, host {host}, {shape}; got version {_shown(_get(plan, 'version'))}, host "
        f"{_shown(_get(plan, 'host'))}). Run numafleet.tuning.numa_plan on this host first and "
        f"pass its fact: {role_input}: {_PASS}."
    )


def _render_message(host, role_input, root, long=True, site=True) -> str:
    name = f"{role_input} (numafleet_render_root in site.yml)" if site else role_input
    text = (
        f"host {host}: {name} is '{_text(root)}'; render mode needs an absolute directory other "
        f"than /, e.g. /srv/numafleet-render/{host}. To apply to the host itself, leave it unset (null)"
    )
    if long:
        return text + (
            "; an empty string is refused so that a template that came out empty cannot turn a "
            "review run into a rollout."
        )
    return text + ("; an empty string is refused." if site else ".")


def _hugepages(host, inp, plan, facts, out):
    render_root = inp["hugepages_render_root"]
    render = render_root is not None
    errors = []
    if not (
        _get(plan, "version", None) == 1
        and _seq(_get(plan, "nodes", None))
        and _get(plan, "host", None) == host
    ):
        errors.append(_plan_message(host, "hugepages_plan", "a nodes list", plan))
    if render and not _root_ok(render_root):
        errors.append(_render_message(host, "hugepages_render_root", render_root))
    sysfs = inp["hugepages_sysfs_root"]
    if render and (not isinstance(sysfs, str) or sysfs.rstrip("/") in ("", "/sys")):
        errors.append(
            f"host {host}: hugepages_render_root is set (render mode) but hugepages_sysfs_root is "
            f"{_text(sysfs)}, so the pools would be written to this host's running kernel. Point "
            "hugepages_sysfs_root (numafleet_sysfs_root in site.yml) at a scratch copy of the "
            "host's tree (playbooks/capture_topology.yml), or review the host itself with --check "
            "--diff and no render root."
        )
    boot = inp["hugepages_boot_reserve"]
    boot_list = boot if _seq(boot) else []
    if not _seq(boot):
        errors.append(
            f"host {host}: hugepages_boot_reserve is {_json(boot)}; give page sizes as 2M, 1G or "
            "a size in kB (e.g. [1G])."
        )
    for index, item in enumerate(boot_list):
        if not (_hashable_in(item, ("2M", "1G")) or _posint(item)):
            errors.append(
                f"host {host}: hugepages_boot_reserve[{index}] is {_json(item)}; give page sizes "
                "as 2M, 1G or a size in kB (e.g. [1G])."
            )
    mounts = inp["hugepages_mounts"]
    mount_list = mounts if _seq(mounts) else []
    if not _seq(mounts):
        errors.append(_mount_message(host, "hugepages_mounts", mounts))
    for index, item in enumerate(mount_list):
        size = _get(item, "size", None)
        if not (
            isinstance(item, Mapping)
            and isinstance(_get(item, "path", None), str)
            and (_hashable_in(size, ("2M", "1G")) or _posint(size))
        ):
            errors.append(_mount_message(host, f"hugepages_mounts[{index}]", item))
    bootloader = inp["hugepages_bootloader"]
    if bootloader == "auto":
        bootloader = _BOOTLOADERS.get(_get(facts, "os_family", ""), "auto")
    args = {
        "sysfs_root": sysfs,
        "procfs_root": inp["hugepages_procfs_root"],
        "boot_reserve_sizes_kb": [_size(item) for item in boot_list],
        "bootloader": bootloader,
        "mounts": [_mount(item) for item in mount_list if isinstance(item, Mapping)],
    }
    isolation = _isolation(host, inp, plan, facts, errors)
    if isolation:
        args["kernel_args"] = isolation
    out["hugepages"] = args
    if errors:
        return errors
    pools = [
        {"node": node.get("id"), "size_kb": pool.get("size_kb"), "count": pool.get("count")}
        for node in _get(plan, "nodes", [])
        if isinstance(node, Mapping)
        for pool in (node.get("hugepages") or [])
        if isinstance(pool, Mapping)
    ]
    checked = {
        "pools": pools,
        "boot_reserve_sizes_kb": args["boot_reserve_sizes_kb"],
        "bootloader": bootloader,
        "mounts": args["mounts"],
        "root": _root(render_root),
    }
    if isolation:
        checked["kernel_args"] = isolation
    return _module_inputs.problems("numa_hugepages", checked, host, _get(facts, "numa", None))


def kernel_cmdline_args(host: str, inputs: Mapping, plan, facts: Mapping) -> list:
    """The kernel arguments the hugepages layer of ``host`` writes with these inputs: the
    boot-reserved pages' (hugepages.kernel_args of the plan's pools), then the kernel isolation's;
    [] when the inputs are refused (build() reports why). Never raises."""
    from ansible_collections.numafleet.tuning.plugins.module_utils.numa import hugepages

    applied = build(host, inputs, plan, facts, ("hugepages",))
    if applied.problems:
        return []
    params = applied.module_args.get("hugepages") or {}
    pools = [
        {"node": node.get("id"), "size_kb": pool.get("size_kb"), "count": pool.get("count")}
        for node in _get(plan, "nodes", [])
        if isinstance(node, Mapping)
        for pool in (node.get("hugepages") or [])
        if isinstance(pool, Mapping)
    ]
    try:
        args = hugepages.kernel_args(
            hugepages.parse_pools(pools),
            hugepages.parse_sizes(list(params.get("boot_reserve_sizes_kb") or []), "boot"),
        )
    except NumaTuneError:
        args = []
    return args + list(params.get("kernel_args") or [])


def isolation_warnings(inputs: Mapping, plan) -> list:
    """cmdline.placement_warnings of hugepages_kernel_isolation for the plan's placements."""
    mode = inputs.get("hugepages_kernel_isolation") if isinstance(inputs, Mapping) else None
    return cmdline.placement_warnings(mode, _get(plan, "placements", []))


def _isolation(host, inp, plan, facts, errors) -> list:
    """The kernel arguments of hugepages_kernel_isolation for the host (cmdline.plan_isolation
    on the facts' numa and the plan's reserved_cpus), [] for none; a refusal goes to errors."""
    mode = inp["hugepages_kernel_isolation"]
    if mode in (None, "none"):
        return []
    try:
        return cmdline.plan_isolation(
            mode,
            _get(facts, "numa", None),
            _get(plan, "reserved_cpus", None),
            "hugepages_kernel_isolation",
        )["kernel_args"]
    except NumaTuneError as exc:
        errors.append(f"host {host}: {exc}.")
        return []


def _posint(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _size(item):
    return SIZE_NAMES.get(item, item) if isinstance(item, str) else item


def _mount(item: Mapping) -> dict:
    entry = {"path": item.get("path"), "size_kb": _size(item.get("size"))}
    for key in ("mode", "group"):
        if item.get(key) is not None:
            entry[key] = _text(item[key])
    return entry


def _mount_message(host, name, item) -> str:
    return (
        f"host {host}: {name} is {_json(item)}; each entry needs path (an absolute mount point) "
        "and size (2M, 1G or the page size in kB as a number), optionally mode (an octal string, "
        "1770 when left out) and group, e.g. {path: /dev/hugepages1G, size: 1G}."
    )


def _kernel(host, inp, plan, facts, out):
    render_root = inp["numa_kernel_render_root"]
    render = render_root is not None
    numa = _get(facts, "numa", {})
    errors = []
    if not (
        _get(plan, "version", None) == 1
        and _seq(_get(plan, "placements", None))
        and _seq(_get(plan, "nodes", None))
        and _seq(_get(plan, "reserved_cpus", None))
        and _get(plan, "host", None) == host
    ):
        errors.append(
            _plan_message(
                host, "numa_kernel_plan", "lists placements, nodes and reserved_cpus", plan
            )
        )
    if render and not _root_ok(render_root):
        errors.append(_render_message(host, "numa_kernel_render_root", render_root))
    banned = inp["numa_kernel_irqbalance_banned"]
    banned_text = _text(banned)
    if not (banned_text in ("auto", "leave", "") or _CPULIST.match(banned_text)):
        errors.append(
            f"host {host}: numa_kernel_irqbalance_banned is '{banned_text}'; give auto, leave, or a "
            'cpulist string such as "0-1,64-65" (no spaces).'
        )
    sysfs, procfs = _get(numa, "sysfs_root", None), _get(numa, "procfs_root", None)
    if render and not (sysfs != "/sys" and procfs != "/proc"):
        errors.append(
            f"host {host}: numa_kernel_render_root is set (render mode) but the NUMA facts were "
            f"read from the live {_text(sysfs)} and {_text(procfs)}, where numa_kernel would change "
            "the running kernel. Point numafleet_sysfs_root and numafleet_procfs_root at a "
            "recording (playbooks/capture_topology.yml), or unset the render root to apply to the "
            "host."
        )
    kernel = _get(numa, "kernel", {})
    cpus = _get(numa, "cpus", {})
    args: dict[str, Any] = {}
    balancing = inp["numa_kernel_numa_balancing"]
    if _text(balancing) == "leave":
        args["numa_balancing"] = None
    elif _text(balancing) == "auto":
        placements = _get(plan, "placements", [])
        args["numa_balancing"] = 0 if _seq(placements) and len(placements) > 0 else None
    else:
        args["numa_balancing"] = _int(balancing)
    zone = inp["numa_kernel_zone_reclaim_mode"]
    args["zone_reclaim_mode"] = None if _text(zone) == "leave" else _int(zone)
    for name in ("thp_enabled", "thp_defrag"):
        value = inp[f"numa_kernel_{name}"]
        args[name] = None if value == "leave" or _get(kernel, name, None) is None else value
    args["numad"] = inp["numa_kernel_numad"]
    if banned_text in ("leave", ""):
        args["irqbalance_banned_cpus"] = None
    elif banned == "auto":
        quiet = list(_get(cpus, "isolated", None) or []) + list(_get(cpus, "nohz_full", None) or [])
        try:
            # A partitioned host (numafleet_partition): every CPU outside the housekeeping set,
            # as TuneD's cpu-partitioning bans its isolated cores; stable across placement edits.
            fenced = partition.irqbalance_banned(plan, _get(cpus, "online", None) or [], quiet)
            quiet = quiet if fenced is None else fenced
            args["irqbalance_banned_cpus"] = format_cpulist(quiet) or None
        except (TypeError, ValueError):
            args["irqbalance_banned_cpus"] = None
    else:
        args["irqbalance_banned_cpus"] = banned_text
    devices = []
    if _bool_jinja(inp["numa_kernel_irq_affinity"]):
        usable = {
            node.get("id"): node.get("cpus_usable")
            for node in (_get(plan, "nodes", None) or [])
            if isinstance(node, Mapping)
        }
        for device in _get(numa, "pci_devices", None) or []:
            node = _get(device, "node", None)
            if (
                _get(device, "kind", None) in ("gpu", "nic")
                and node is not None
                and _hashable_in(node, usable)
                and usable.get(node)
            ):
                devices.append(
                    {"address": device["address"], "cpus": ",".join(_text(c) for c in usable[node])}
                )
    args["irq_affinity"] = devices
    args["sysfs_root"] = sysfs
    args["procfs_root"] = procfs
    out["kernel"] = args
    if errors:
        return errors
    checked = {key: args[key] for key in args if key not in ("sysfs_root", "procfs_root")}
    checked["root"] = _root(render_root)
    return _module_inputs.problems("numa_kernel", checked, host)


def _bool_jinja(value) -> bool:
    """Jinja truthiness (``if value``), without failing on odd objects."""
    try:
        return bool(value)
    except Exception:  # an object whose __bool__ fails is false here
        return False


def _mig_capable(plan) -> list:
    return [gpu for gpu in (_get(plan, "gpus", None) or []) if _bool_jinja(_get(gpu, "mig", None))]


def _mig_run(inp, plan, facts) -> bool:
    """__nvidia_mig_run of the role: whether the MIG layer runs."""
    capable = _mig_capable(plan)
    if not capable:
        return False
    migs = [gpu["mig"] for gpu in capable]
    pending = [
        _get(_get(gpu, "mig", None), "mode_pending", None)
        for gpu in (_get(_get(facts, "gpu_topology", {}), "gpus", None) or [])
    ]
    paths = _get(facts, "numafleet_state_paths")
    state = _text(_root(inp["nvidia_mig_render_root"])).rstrip("/") + "/etc/numafleet/mig.json"
    return bool(
        len(_get(plan, "mig_gpus", None) or []) > 0
        or "enabled" in [_get(m, "mode_current", None) for m in migs]
        or "enabled" in [_get(m, "mode", None) for m in migs]
        or "enabled" in pending
        or paths is _MISSING
        or _hashable_in(state, paths if isinstance(paths, (list, tuple)) else ())
    )


def _mig(host, inp, plan, facts, out):
    render_root = inp["nvidia_mig_render_root"]
    errors = []
    plan_ok = (
        _get(plan, "version", None) == 1
        and _seq(_get(plan, "gpus", None))
        and _seq(_get(plan, "mig_gpus", None))
        and _get(plan, "host", None) == host
    )
    if not plan_ok:
        errors.append(_plan_message(host, "nvidia_mig_plan", "gpus and mig_gpus lists", plan))
    if render_root is not None and not _root_ok(render_root):
        errors.append(_render_message(host, "nvidia_mig_render_root", render_root, long=False))
    parted = inp["nvidia_mig_parted_config"]
    if not (parted == "" or (isinstance(parted, str) and os.path.isabs(parted))):
        errors.append(
            f"host {host}: nvidia_mig_parted_config (numafleet_mig_parted_config in site.yml) is "
            f"'{_text(parted)}'; it must be an absolute path, or '' to write no mig-parted config. "
            "Fix the variable; nothing was changed."
        )
    if plan_ok and len(plan["gpus"]) == 0 and _bool_jinja(inp["nvidia_mig_require_gpu"]):
        errors.append(
            f"host {host}: nvidia_mig_require_gpu is true but the host's facts show no GPU under "
            "/sys/bus/pci/devices. Check the driver and the PCI devices, or set "
            "nvidia_mig_require_gpu: false (numafleet_require_gpu in site.yml) for hosts without GPUs."
        )
    if plan_ok and not _mig_capable(plan) and len(plan["mig_gpus"]) > 0:
        names = ", ".join(_text(_get(gpu, "gpu", "")) for gpu in plan["mig_gpus"])
        errors.append(
            f"host {host}: the plan declares MIG state for {names} but no GPU of the host reports "
            "a MIG mode; gather the GPU facts where NVML or nvidia-smi works."
        )
    args = {
        # As the role passed it: the module's argument spec converts or refuses it.
        "reset_ok": inp["nvidia_mig_reset_ok"],
        "backend": inp["nvidia_mig_backend"],
        "mig_parted_config": parted,
        "sysfs_root": inp["nvidia_mig_sysfs_root"],
        "procfs_root": inp["nvidia_mig_procfs_root"],
    }
    if _bool_jinja(inp["nvidia_mig_snapshot"]):  # default(omit, true): left out when empty
        args["snapshot"] = inp["nvidia_mig_snapshot"]
    out["mig"] = args
    if errors:
        return errors
    checked = {
        "gpus": plan["mig_gpus"],
        "backend": args["backend"],
        "mig_parted_config": parted,
        "root": _root(render_root),
    }
    return _module_inputs.problems("nvidia_mig", checked, host)


def _amd_run(inp, plan, facts) -> bool:
    """Whether the amd layer runs: the plan has AMD GPUs (amd_partitions), or an earlier run
    recorded AMD partition modes (its files are removed), or the state paths are unknown."""
    paths = _get(facts, "numafleet_state_paths")
    root = _text(_root(inp["amd_partition_render_root"])).rstrip("/")
    state = root + "/etc/numafleet/amd-partition.json"
    return bool(
        len(_get(plan, "amd_partitions", None) or []) > 0
        or (paths is _MISSING and _get(plan, "amd_partitions", None) is not None)
        or _hashable_in(state, paths if isinstance(paths, (list, tuple)) else ())
    )


def _amd(host, inp, plan, facts, out):
    render_root = inp["amd_partition_render_root"]
    errors = []
    gpus = _get(plan, "amd_partitions", [])
    if not (_get(plan, "version", None) == 1 and _seq(gpus) and _get(plan, "host", None) == host):
        errors.append(_plan_message(host, "amd_partition_plan", "an amd_partitions list", plan))
    if render_root is not None and not _root_ok(render_root):
        errors.append(_render_message(host, "amd_partition_render_root", render_root, long=False))
    backend = inp["amd_partition_backend"]
    if not _hashable_in(backend, ("auto", "amdsmi", "amd-smi", "sysfs")):
        errors.append(
            f"host {host}: amd_partition_backend (numafleet_amd_backend in site.yml) is "
            f"'{_text(backend)}'; use auto, amdsmi, amd-smi or sysfs. Fix the variable; nothing "
            "was changed."
        )
    if _text(inp["amd_partition_reset_ok"]).lower() not in ("true", "false", "yes", "no"):
        errors.append(
            f"host {host}: amd_partition_reset_ok (numafleet_amd_reset_ok in site.yml) is "
            f"'{_text(inp['amd_partition_reset_ok'])}'; use true (the amdgpu driver may be "
            "reloaded for a memory partition change) or false. Fix the variable; nothing was "
            "changed."
        )
    out["amd"] = {
        "reset_ok": _bool(inp["amd_partition_reset_ok"]),
        # Render mode writes the scratch tree's files: the sysfs backend, whatever was chosen.
        "backend": "sysfs" if render_root is not None else backend,
        "sysfs_root": inp["amd_partition_sysfs_root"],
        "procfs_root": inp["amd_partition_procfs_root"],
    }
    return errors


def _gpu_run(inp) -> bool:
    """Whether the gpu layer runs: only where GPU settings are declared."""
    return _seq(inp["nvidia_gpu_settings"]) and len(inp["nvidia_gpu_settings"]) > 0


def _gpu_facts_problems(host, settings, plan, facts) -> list:
    """Declared GPUs the facts do not show, and compute modes on MPS-shared or MIG-mode GPUs."""
    gpus = [
        gpu
        for gpu in (_get(_get(facts, "gpu_topology", {}), "gpus", None) or [])
        if _get(gpu, "vendor", None) == "nvidia"
    ]
    if _get(facts, "gpu_topology") is _MISSING:
        return []  # no facts: the module checks the GPUs itself
    shared = {
        _get(daemon, "gpu_address", None) for daemon in (_get(plan, "mps_daemons", None) or [])
    }
    errors = []
    for index, entry in enumerate(settings):
        name = str(entry["gpu"]).strip()
        address = gpu_settings.normalise_address(name)
        found = [
            gpu
            for gpu in gpus
            if (address and _get(gpu, "address", None) == address)
            or (not address and str(_get(gpu, "uuid", "")).lower() == name.lower())
        ]
        where = (
            f"host {host}: nvidia_gpu_settings[{index}] (numafleet_gpu_settings[{index}] in "
            "site.yml)"
        )
        if not found:
            known = ", ".join(str(_get(gpu, "address", "?")) for gpu in gpus) or "none"
            errors.append(
                f"{where}: GPU {name} is not an NVIDIA GPU of this host's facts (NVIDIA GPUs: "
                f"{known}); give one of their PCI addresses or UUIDs. Fix the variable; nothing "
                "was changed."
            )
            continue
        gpu = found[0]
        if entry.get("compute_mode") is None:
            continue
        if _get(gpu, "address", None) in shared:
            errors.append(
                f"{where}: compute_mode is declared for GPU {name}, but an MPS daemon of the plan "
                "shares it and its unit sets the compute mode; leave compute_mode out for this "
                "GPU. Fix the variable; nothing was changed."
            )
        elif _get(_get(gpu, "mig", None), "mode_current", None) == "enabled":
            errors.append(
                f"{where}: compute_mode is declared for GPU {name}, which is in MIG mode (NVML "
                "sets compute modes per MIG device there); leave compute_mode out for this GPU. "
                "Fix the variable; nothing was changed."
            )
    return errors


def _gpu(host, inp, plan, facts, out):
    render_root = inp["nvidia_gpu_render_root"]
    errors = []
    if _gpu_run(inp) and not (
        _get(plan, "version", None) == 1
        and _seq(_get(plan, "mps_daemons", None))
        and _get(plan, "host", None) == host
    ):
        errors.append(_plan_message(host, "nvidia_gpu_plan", "an mps_daemons list", plan))
    if render_root is not None and not _root_ok(render_root):
        errors.append(_render_message(host, "nvidia_gpu_render_root", render_root, long=False))
    args = {
        "gpus": inp["nvidia_gpu_settings"],
        "backend": inp["nvidia_gpu_backend"],
        "sysfs_root": inp["nvidia_gpu_sysfs_root"],
        "procfs_root": inp["nvidia_gpu_procfs_root"],
    }
    if _bool_jinja(inp["nvidia_gpu_snapshot"]):
        args["snapshot"] = inp["nvidia_gpu_snapshot"]
    out["gpu"] = args
    if errors:
        return errors
    checked = {"gpus": args["gpus"], "backend": args["backend"], "root": _root(render_root)}
    found = _module_inputs.problems("nvidia_gpu_settings", checked, host)
    if found or not _gpu_run(inp):
        return found
    return _gpu_facts_problems(host, args["gpus"], plan, facts)


def _mps_gpus(inp, facts) -> list:
    topology = inp["nvidia_mps_gpu_topology"]
    if topology is None:
        topology = _get(facts, "gpu_topology", {})
    return [
        gpu for gpu in (_get(topology, "gpus", None) or []) if _get(gpu, "vendor", None) == "nvidia"
    ]


def _mps_run(inp, plan, facts) -> bool:
    """__nvidia_mps_run of the role: whether the MPS layer runs."""
    if not _mps_gpus(inp, facts):
        return False
    paths = _get(facts, "numafleet_state_paths")
    manifest = _text(_root(inp["nvidia_mps_render_root"])).rstrip("/") + _text(
        inp["nvidia_mps_manifest_path"]
    )
    return bool(
        len(_get(plan, "mps_daemons", None) or []) > 0
        or paths is _MISSING
        or _hashable_in(manifest, paths if isinstance(paths, (list, tuple)) else ())
    )


def _mps(host, inp, plan, facts, out):
    render_root = inp["nvidia_mps_render_root"]
    errors = []
    if not (
        _get(plan, "version", None) == 1
        and _seq(_get(plan, "mps_daemons", None))
        and _get(plan, "host", None) == host
    ):
        errors.append(_plan_message(host, "nvidia_mps_plan", "an mps_daemons list", plan))
    if render_root is not None and not _root_ok(render_root):
        errors.append(
            _render_message(host, "nvidia_mps_render_root", render_root, long=False, site=False)
        )
    if not _mps_gpus(inp, facts) and _bool_jinja(inp["nvidia_mps_require_gpu"]):
        errors.append(
            f"host {host}: nvidia_mps_require_gpu is true but the host shows no NVIDIA GPU "
            "(gpu_topology facts list none). Set nvidia_mps_require_gpu: false to skip such hosts, "
            "or check the driver (nvidia-smi) and the facts."
        )
    args = {
        "unit_dir": inp["nvidia_mps_unit_dir"],
        "manifest_path": inp["nvidia_mps_manifest_path"],
        "nvidia_cuda_mps_control": inp["nvidia_mps_control_path"],
        "nvidia_smi": inp["nvidia_mps_nvidia_smi_path"],
    }
    out["mps"] = args
    if errors:
        return errors
    return _module_inputs.problems(
        "nvidia_mps", {"plan": plan, "root": _root(render_root), **args}, host
    )


def _units(host, inp, plan, facts, out):
    render_root = inp["pinned_services_render_root"]
    errors = []
    if not (
        _get(plan, "version", None) == 1
        and _seq(_get(plan, "placements", None))
        and _get(plan, "host", None) == host
    ):
        errors.append(_plan_message(host, "pinned_services_plan", "a placements list", plan))
    if render_root is not None and not _root_ok(render_root):
        errors.append(_render_message(host, "pinned_services_render_root", render_root))
    args = {
        "unit_dir": inp["pinned_services_unit_dir"],
        "manifest_path": inp["pinned_services_manifest_path"],
        "hardening": inp["pinned_services_hardening"],
        "preflight": inp["pinned_services_preflight"],
    }
    out["units"] = args
    if errors:
        return errors
    return _module_inputs.problems(
        "pinned_units", {"plan": plan, "root": _root(render_root), **args}, host
    )


_LAYERS = {
    "hugepages": ("hugepages_render_root", _hugepages),
    "kernel": ("numa_kernel_render_root", _kernel),
    "gpu": ("nvidia_gpu_render_root", _gpu),
    "amd": ("amd_partition_render_root", _amd),
    "mig": ("nvidia_mig_render_root", _mig),
    "mps": ("nvidia_mps_render_root", _mps),
    "units": ("pinned_services_render_root", _units),
}


def build(host: str, inputs: Mapping, plan, facts: Mapping, layers=ALL_LAYERS) -> ApplyArgs:
    """The host_apply arguments of ``host`` for ``layers``, and every input problem.

    ``inputs``: {role input: value} (site_inputs(), or a role's own variables); a missing input
    takes ROLE_DEFAULTS. ``plan``: ansible_facts.numafleet_plan of the host. ``facts``: the host's
    ansible_facts (numa, gpu_topology, numafleet_state_paths, os_family). ``layers``: a subset of
    ALL_LAYERS. Returns ApplyArgs: module_args {plan, layers (those that run, in ALL_LAYERS order;
    mig and mps only where their role would run the module), root, service_manager, restart, and
    one dict per requested layer}; reboot_ok (hugepages_reboot_ok | bool); problems: the roles'
    input-check messages, then the module's own refusals per layer whose checks passed. Never raises.
    """
    inp = dict(ROLE_DEFAULTS)
    if isinstance(inputs, Mapping):
        inp.update({key: value for key, value in inputs.items() if key in ROLE_DEFAULTS})
    facts = facts if isinstance(facts, Mapping) else {}
    wanted = [layer for layer in ALL_LAYERS if layer in tuple(layers or ())]
    out: dict[str, Any] = {}
    problems: list = []
    running = []
    for layer in wanted:
        dummy, check = _LAYERS[layer]
        try:
            problems.extend(check(host, inp, plan, facts, out))
        except Exception as exc:  # never a traceback for a bad input shape
            problems.append(
                f"host {host}: the inputs of the {layer} layer have a shape they cannot be read "
                f"in ({exc!r}). Fix the variables; nothing was changed."
            )
        if layer == "mig" and not _safe(_mig_run, inp, plan, facts):
            continue
        if layer == "amd" and not _safe(_amd_run, inp, plan, facts):
            continue
        if layer == "gpu" and not _safe(_gpu_run, inp):
            continue
        if layer == "mps" and not _safe(_mps_run, inp, plan, facts):
            continue
        running.append(layer)
    render_root = inp[_LAYERS[wanted[0]][0]] if wanted else None
    restart = inp["nvidia_mps_restart"] if wanted == ["mps"] else inp["pinned_services_restart"]
    module_args = {
        "plan": plan,
        "layers": running,
        "root": _root(render_root),
        "service_manager": "none" if render_root is not None else "systemd",
        "restart": restart,
        **out,
    }
    return ApplyArgs(module_args, _bool(inp["hugepages_reboot_ok"]), problems)


def _safe(function, *args) -> bool:
    try:
        return function(*args)
    except Exception:  # a bad shape was reported by the layer's checks
        return False


def measure_problems(host: str, host_vars: Mapping) -> list:
    """The measurement-settings check of drift_check.yml: a message per bad setting, [] when fine.

    Reads numafleet_verify_window_s (seconds, 0 to 3600), numafleet_verify_perf (auto, never) and
    numafleet_drift_fail (true, false, yes, no) of ``host_vars``; only the bad ones are named.
    """
    host_vars = host_vars if isinstance(host_vars, Mapping) else {}
    window = host_vars.get("numafleet_verify_window_s", 5)
    perf = host_vars.get("numafleet_verify_perf", "auto")
    fail = host_vars.get("numafleet_drift_fail", True)
    problems = []
    if not _measurement_ok(window, perf):
        problems.append(
            f"host {host}: numafleet_verify_window_s is '{_text(window)}' and "
            f"numafleet_verify_perf is '{_text(perf)}'; the window is a number of seconds from 0 "
            "to 3600 (e.g. 5; 0 = one sample) and perf is auto or never."
        )
    if _text(fail).lower() not in ("true", "false", "yes", "no"):
        problems.append(
            f"host {host}: numafleet_drift_fail is '{_text(fail)}'; use true (a host that drifted "
            "or failed a check fails the run) or false (report only)."
        )
    return problems


def _measurement_ok(window, perf) -> bool:
    """numafleet_verify_window_s is 0 to 3600 seconds (digits[.digits]), perf auto or never."""
    return (
        re.match(r"^[0-9]+([.][0-9]+)?\Z", _text(window)) is not None
        and float(_text(window)) <= 3600
        and _hashable_in(perf, ("auto", "never"))
    )


def verify_problems(host: str, host_vars: Mapping) -> list:
    """verify.yml's checks of the host variables: the render root and the measurement settings
    (numafleet_verify_window_s, numafleet_verify_perf); [] when they are right."""
    host_vars = host_vars if isinstance(host_vars, Mapping) else {}
    problems = []
    root = host_vars.get("numafleet_render_root")
    if root is not None and not _root_ok(root):
        problems.append(
            f"host {host}: numafleet_render_root is '{_text(root)}'; render mode needs an "
            "absolute directory other than /. To verify the host itself, leave it unset (null)."
        )
    window = host_vars.get("numafleet_verify_window_s", 5)
    perf = host_vars.get("numafleet_verify_perf", "auto")
    if not _measurement_ok(window, perf):
        problems.append(
            f"host {host}: numafleet_verify_window_s is '{_text(window)}' and "
            f"numafleet_verify_perf is '{_text(perf)}'; the window is a number of seconds from 0 "
            "to 3600 (e.g. 5; 0 = one sample) and perf is auto or never."
        )
    return problems


def _whole(value) -> bool:
    """An int (not a bool), or a float with no fraction: a whole percentage or count."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def guard_problems(host: str, host_vars: Mapping) -> list:
    """site.yml's check of the memory guard's host variables (role memory_guard), before the
    gate: numafleet_memory_warn_pct and numafleet_memory_act_pct whole numbers with
    1 <= warn < act <= 99, numafleet_memory_guard_interval 1 to 3600 seconds,
    numafleet_memory_guard_textfile_dir an absolute path other than / (or unset). Only when the
    guard's program is installed (numafleet_memory_guard, or numafleet_preflight not off); the
    types and choices are host_vars_check's. [] when they are right."""
    host_vars = host_vars if isinstance(host_vars, Mapping) else {}
    enabled = _bool(host_vars.get("numafleet_memory_guard", True))
    if not enabled and host_vars.get("numafleet_preflight", "warn") == "off":
        return []
    problems = []
    warn = host_vars.get("numafleet_memory_warn_pct", 80)
    act = host_vars.get("numafleet_memory_act_pct", 90)
    if not (_whole(warn) and _whole(act) and 1 <= warn < act <= 99):
        problems.append(
            f"host {host}: numafleet_memory_warn_pct is {_json(warn)} and "
            f"numafleet_memory_act_pct is {_json(act)}; the memory guard takes whole percentages "
            "of a NUMA node's memory with 1 <= warn < act <= 99, e.g. 80 and 90."
        )
    interval = host_vars.get("numafleet_memory_guard_interval", 15)
    if not (_whole(interval) and 1 <= interval <= 3600):
        problems.append(
            f"host {host}: numafleet_memory_guard_interval is {_json(interval)}; give the seconds "
            "between two rounds of the memory guard as a whole number from 1 to 3600, e.g. 15."
        )
    textfile = host_vars.get("numafleet_memory_guard_textfile_dir")
    if textfile is not None:
        why = ""
        try:  # as the role writes it into ReadWritePaths= (filter systemd_value, path)
            units.escape_path(textfile, "numafleet_memory_guard_textfile_dir")
        except NumaTuneError as exc:
            why = f" ({exc})"
        if why or not _root_ok(textfile) or posixpath.normpath(textfile) != textfile:
            problems.append(
                f"host {host}: numafleet_memory_guard_textfile_dir is {_json(textfile)}; give "
                "node_exporter's textfile collector directory as an absolute path other than /, "
                "written plainly (no '.', '..', '//' or trailing '/', no control characters), "
                f"e.g. /var/lib/node_exporter/textfile, or leave it unset for no metrics file{why}."
            )
    return problems


def name_host_variables(problems: list) -> list:
    """problems as site.yml and drift_check.yml report them: a message that names a role input
    but not the host variable it comes from there (hugepages_mounts[0], not
    numafleet_hugepages_mounts) gets that host variable named, so that the fix is where the user
    writes it; after a "role_input (set from var by site.yml ...): " label the role inputs the
    text names become their host variables. The role's own runs keep the role-input names
    alone."""
    sources = {
        role_input: var
        for role_input, var in role_input_sources().items()
        if role_input not in PLAN_INPUTS
    }
    named = []
    for text in problems:
        # "role_input (set from var by site.yml and drift_check.yml): ..." - the text after that
        # label names the variables the user writes, not the role inputs.
        label = re.search(r"\w+ \(set from \w+ by site\.yml and drift_check\.yml\): ", text)
        if label:
            head, body = text[: label.end()], text[label.end() :]
            for role_input, var in sources.items():
                body = re.sub(rf"(?<![\w.]){re.escape(role_input)}(?!\w)", var, body)
            text = head + body
        missing = sorted(
            {
                var
                for role_input, var in sources.items()
                if var not in text and re.search(rf"(?<![\w.]){re.escape(role_input)}(?!\w)", text)
            }
        )
        if missing:
            text = f"{text} Under site.yml and drift_check.yml set it with {' and '.join(missing)}."
        named.append(text)
    return named
