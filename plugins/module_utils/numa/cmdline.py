# Private to this collection: may change in any release.
"""Kernel CPU isolation on the kernel command line, and the /proc/cmdline reboot contract.

The isolated set is the host's online CPUs that services may use (ansible_facts.numa.allowed,
plus CPUs the running kernel isolates already) minus the housekeeping set
(numafleet_reserved_cpus), not the union of today's placements: adding or editing a placement
never changes the command line, so day-2 edits never need a reboot (TuneD's cpu-partitioning
profile keeps isolated_cores fixed the same way).

Modes (numafleet_kernel_isolation; Documentation/admin-guide/kernel-parameters.txt):

- ``nohz_full``: ``nohz_full=<isolated> rcu_nocbs=<isolated> irqaffinity=<housekeeping>``:
  the tick stops on an isolated CPU that runs one task, RCU callbacks run on housekeeping CPUs,
  and interrupts start on housekeeping CPUs. Needs CONFIG_NO_HZ_FULL, which is what creates
  /sys/devices/system/cpu/nohz_full (facts: kernel.nohz_full_supported).
- ``isolcpus``: ``isolcpus=managed_irq,domain,<isolated> irqaffinity=<housekeeping>``: the
  scheduler neither balances tasks onto nor across the isolated CPUs (a service with more than
  one CPU must pin its own threads), and managed interrupts avoid them where a queue has a
  housekeeping CPU (the ``managed_irq`` flag, Linux 5.6 or newer). nohz_full is not added:
  that is the other mode, and TuneD / OpenShift keep the two apart the same way.

Facts read here (read_cmdline_facts, published at the end of ansible_facts.numa.kernel):
``cmdline`` is <procfs_root>/cmdline (None when absent, as in recordings), and
``nohz_full_supported`` whether <sysfs_root>/devices/system/cpu/nohz_full exists (None when
the CPU directory itself is absent).
"""

from __future__ import annotations

import re
from typing import Optional

from .cpulist import format_cpulist, parse_cpulist
from .errors import NumaTuneError
from .osrelease import release_tuple
from .sysfs import Reader

MODES = ("none", "nohz_full", "isolcpus")
VARIABLE = "numafleet_kernel_isolation"
RESERVED_VARIABLE = "numafleet_reserved_cpus"
MANAGED_IRQ_KERNEL = (5, 6)
ARG_NAMES = ("nohz_full", "rcu_nocbs", "isolcpus", "irqaffinity")
# One argument, nothing the GRUB drop-in's double quotes or a shell would read: no space, quote,
# backslash, $ or backtick.
_ARG_RE = re.compile(r"^[A-Za-z0-9_.-]+(=[^\s\"'\\$`]+)?\Z")


class CmdlineError(NumaTuneError):
    """Kernel isolation cannot be planned for a host: str() names the variable and the fix."""


def read_cmdline_facts(reader: Reader) -> dict:
    """{"cmdline": text of <procfs_root>/cmdline stripped, or None when absent,
    "nohz_full_supported": whether <sysfs_root>/devices/system/cpu/nohz_full exists (the kernel
    creates it only with CONFIG_NO_HZ_FULL), None when that CPU directory is absent}."""
    text = reader.text(reader.proc("cmdline"), optional=True)
    cpu_dir = reader.sys("devices", "system", "cpu")
    supported: Optional[bool] = None
    if reader.isdir(cpu_dir):
        supported = reader.exists(f"{cpu_dir}/nohz_full")
    return {
        "cmdline": None if text is None else text.replace("\x00", " ").strip(),
        "nohz_full_supported": supported,
    }


def read_running_isolation(sysfs_root: str, procfs_root: str) -> dict:
    """{"isolated", "nohz_full": sorted CPUs of <sysfs_root>/devices/system/cpu/isolated and
    nohz_full (None when the file is absent or unreadable), "cmdline_known": whether
    <procfs_root>/cmdline exists}: what the running kernel isolates, for verify. Never raises."""
    reader = Reader(sysfs_root, procfs_root)
    base = reader.sys("devices", "system", "cpu")
    out: dict = {}
    for name in ("isolated", "nohz_full"):
        try:
            out[name] = reader.cpulist(f"{base}/{name}", optional=True)
        except NumaTuneError:
            out[name] = None
    out["cmdline_known"] = reader.exists(reader.proc("cmdline"))
    return out


def planned_isolation(args) -> dict:
    """{"isolated": CPUs of isolcpus=, "nohz_full": CPUs of nohz_full=} in ``args`` (kernel
    arguments as this file makes them); a key is absent when its argument is. No I/O."""
    out = {}
    for arg in args or ():
        if not isinstance(arg, str) or "=" not in arg:
            continue
        name, value = arg.split("=", 1)
        if name in ("isolcpus", "nohz_full"):
            cpus = value.split(",")
            # isolcpus=<flags>,<cpulist>: the flags are words, the CPUs digits and ranges
            text = ",".join(part for part in cpus if part[:1].isdigit())
            if not text:
                continue
            try:
                out["isolated" if name == "isolcpus" else "nohz_full"] = parse_cpulist(text)
            except (ValueError, NumaTuneError):
                continue
    return out


def parse_cmdline(text: Optional[str]) -> list:
    """The whitespace-separated arguments of a /proc/cmdline text ([] for None)."""
    return (text or "").split()


def missing_args(args, cmdline: Optional[str]) -> Optional[list]:
    """The entries of ``args`` not on the running kernel's command line ``cmdline`` (text of
    /proc/cmdline), in order; None when ``cmdline`` is None (unknown: a recording)."""
    if cmdline is None:
        return None
    running = set(parse_cmdline(cmdline))
    return [arg for arg in args if arg not in running]


def _int_set(value) -> set:
    """The integers of a facts CPU list; a value that is not a list or tuple (damaged facts:
    a bool, a number, a string) has none."""
    if not isinstance(value, (list, tuple)):
        return set()
    return {c for c in value if isinstance(c, int) and not isinstance(c, bool)}


def _cpus_of(numa: dict) -> list:
    """Online CPUs services may use: numa.allowed.cpus (else cpus.online) plus the CPUs the
    running kernel isolates already (isolcpus takes them out of PID 1's affinity), online only."""
    cpus = numa.get("cpus") if isinstance(numa.get("cpus"), dict) else {}
    online = _int_set(cpus.get("online"))
    allowed = numa.get("allowed") if isinstance(numa.get("allowed"), dict) else {}
    usable = allowed.get("cpus")
    base = _int_set(usable) if isinstance(usable, list) else set(online)
    isolated = _int_set(cpus.get("isolated"))
    nohz = _int_set(cpus.get("nohz_full"))
    return sorted((base | isolated | nohz) & online) if online else sorted(base)


def isolation_sets(numa: dict, reserved) -> tuple:
    """(isolated, housekeeping): sorted CPU lists of ansible_facts.numa ``numa`` and the
    housekeeping CPUs ``reserved`` (the plan's reserved_cpus); housekeeping is ``reserved``
    that is online. No I/O."""
    usable = _cpus_of(numa if isinstance(numa, dict) else {})
    keep = {c for c in reserved or () if isinstance(c, int)}
    housekeeping = sorted(keep & set(usable)) if usable else sorted(keep)
    return [c for c in usable if c not in keep], housekeeping


def isolation_args(mode: str, isolated, housekeeping) -> list:
    """Kernel arguments of ``mode`` (MODES) for the CPU lists; [] for none or no isolated CPU."""
    if mode == "none" or not isolated or not housekeeping:
        return []
    iso, keep = format_cpulist(sorted(isolated)), format_cpulist(sorted(housekeeping))
    if mode == "nohz_full":
        return [f"nohz_full={iso}", f"rcu_nocbs={iso}", f"irqaffinity={keep}"]
    if mode == "isolcpus":
        return [f"isolcpus=managed_irq,domain,{iso}", f"irqaffinity={keep}"]
    raise CmdlineError(f"{VARIABLE}: {mode!r} is not one of {', '.join(MODES)}")


def plan_isolation(mode, numa, reserved, name: str = VARIABLE) -> dict:
    """{"mode", "isolated_cpus", "housekeeping_cpus", "kernel_args"} of a host; raises
    CmdlineError naming the variable and the fix: an unknown mode; no housekeeping CPU
    (numafleet_reserved_cpus empty or offline); no CPU left to isolate; isolcpus (managed_irq)
    on a kernel older than 5.6 or of unknown release; nohz_full on a kernel without
    CONFIG_NO_HZ_FULL (facts kernel.nohz_full_supported false); facts without CPUs. Facts
    without the kernel keys (an older release's) skip the kernel checks. ``name``: the variable
    the user set the mode with. No I/O."""
    if mode not in MODES:
        raise CmdlineError(
            f"{name}: {mode!r} is not one of {', '.join(MODES)}; use none (default), "
            "nohz_full or isolcpus"
        )
    empty = {"mode": mode, "isolated_cpus": [], "housekeeping_cpus": [], "kernel_args": []}
    if mode == "none":
        return empty
    numa = numa if isinstance(numa, dict) else {}
    if not isinstance(numa.get("cpus"), dict):
        raise CmdlineError(
            f"{name}: {mode} needs the host's CPUs, and ansible_facts.numa is not set. "
            "Gather the facts with numafleet.tuning.numa_facts first (site.yml does)"
        )
    isolated, housekeeping = isolation_sets(numa, reserved)
    if not housekeeping:
        raise CmdlineError(
            f"{name}: {mode} isolates every CPU but the housekeeping set, and "
            f"{RESERVED_VARIABLE} names no online CPU. Set {RESERVED_VARIABLE} to the CPUs "
            "that keep the system, interrupts and kernel threads (e.g. '0-1'), or set "
            f"{name}: none"
        )
    if not isolated:
        raise CmdlineError(
            f"{name}: {RESERVED_VARIABLE} ({format_cpulist(housekeeping)}) covers every "
            "CPU services may use, so no CPU is left to isolate. Shrink "
            f"{RESERVED_VARIABLE}, or set {name}: none"
        )
    kernel = numa.get("kernel") if isinstance(numa.get("kernel"), dict) else {}
    if mode == "isolcpus" and "osrelease" in kernel:
        given = kernel.get("osrelease")
        release = release_tuple(given if isinstance(given, str) else None)
        if release is None or release < MANAGED_IRQ_KERNEL:
            shown = "unknown" if release is None else f"{release[0]}.{release[1]}"
            raise CmdlineError(
                f"{name}: isolcpus=managed_irq needs Linux 5.6 or newer, and the kernel "
                f"release is {shown} (ansible_facts.numa.kernel.osrelease). Upgrade the kernel, "
                f"use {name}: nohz_full, or none"
            )
    if mode == "nohz_full" and kernel.get("nohz_full_supported") is False:
        raise CmdlineError(
            f"{name}: nohz_full needs a kernel built with CONFIG_NO_HZ_FULL, and this one "
            "is not (/sys/devices/system/cpu/nohz_full is absent). Boot a kernel that has it "
            f"(most distribution kernels do), use {name}: isolcpus, or none"
        )
    return {
        "mode": mode,
        "isolated_cpus": isolated,
        "housekeeping_cpus": housekeeping,
        "kernel_args": isolation_args(mode, isolated, housekeeping),
    }


def placement_warnings(mode: str, placements) -> list:
    """One warning per placement of more than one CPU when ``mode`` is isolcpus (the scheduler
    does not balance tasks across isolated CPUs: the service must pin its own threads)."""
    if mode != "isolcpus":
        return []
    out = []
    for entry in placements or ():
        cpus = entry.get("cpus") if isinstance(entry, dict) else None
        if isinstance(cpus, list) and len(cpus) > 1:
            out.append(
                f"placement {entry.get('name')}: {VARIABLE} is isolcpus, and the scheduler does "
                f"not balance tasks across isolated CPUs: the service gets CPUs "
                f"{format_cpulist(sorted(cpus))} but threads it does not pin itself may all stay "
                "on one of them. Pin the service's threads (e.g. one per CPU), "
                f"or use {VARIABLE}: nohz_full"
            )
    return out


def check_args(args) -> list:
    """``args`` (a list of kernel arguments without whitespace or quotes) as a list of str;
    raises CmdlineError naming the kernel_args option."""
    if not isinstance(args, (list, tuple)):
        raise CmdlineError(f"kernel_args: {args!r} is not a list of kernel arguments")
    for index, arg in enumerate(args):
        if not isinstance(arg, str) or not _ARG_RE.match(arg):
            raise CmdlineError(
                f"kernel_args[{index}]: {arg!r} is not one kernel argument (name or name=value, "
                "no spaces, quotes, backslashes, $ or backticks)"
            )
    return list(args)


def cmdline_change(written, wanted, running: Optional[str]) -> dict:
    """The kernel command line part of the change plan (ansible_facts.numafleet_changes
    .kernel_cmdline): ``written`` the arguments the last apply wrote (numafleet_recorded
    .kernel_args), ``wanted`` the ones this run writes,
    ``running`` the text of /proc/cmdline (facts kernel.cmdline; None when unknown). Unknown
    ``written`` claims no change (``before`` is ``after``); the reboot check still applies.

    Returns {"before", "after": argument lists, "added", "removed": what the bootloader file or
    grubby call gains and loses, "changed": bool, "missing": the ``after`` arguments
    /proc/cmdline lacks (None when unknown), "reboot_required": changed, or missing non-empty}.
    No I/O.
    """
    after = [arg for arg in wanted or () if isinstance(arg, str)]
    # Unknown (facts of an older release, an unusable state file): no change is claimed.
    before = after if written is None else [arg for arg in written if isinstance(arg, str)]
    missing = missing_args(after, running)
    changed = before != after
    return {
        "before": before,
        "after": after,
        "added": [arg for arg in after if arg not in before],
        "removed": [arg for arg in before if arg not in after],
        "changed": changed,
        "missing": missing,
        "reboot_required": changed or bool(missing),
    }


def change_lines(change: dict) -> list:
    """The change plan lines of cmdline_change()'s result (none when nothing is owed)."""
    if change["changed"]:
        parts = [f"+ {arg}" for arg in change["added"]] + [f"- {arg}" for arg in change["removed"]]
        if not parts:  # the same arguments in another order
            parts = [" ".join(change["after"])]
        return [f"  kernel command line: {', '.join(parts)} (reboot required)"]
    if change["missing"]:
        return [
            "  kernel command line: reboot pending (/proc/cmdline lacks "
            f"{' '.join(change['missing'])}, written by an earlier run)"
        ]
    return []
