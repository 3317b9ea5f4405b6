# Private to this collection: may change in any release.
"""The apply modules' own input checks, run on the controller before the plan gate.

Each apply role passes its module the arguments it built from the role inputs (and the plan).
The module checks them with functions of the core (``module_utils/numa``) and refuses what they
refuse, but by then the roles before it have written their files on that host while the other
hosts went on. ``problems(module, args, host)`` runs the same core functions on the same
arguments, without reading or writing anything on a host, so that every value a module or a
renderer refuses is refused before the gate, in a message that names the host and the role input
(and the host variable site.yml sets it from). A rule added to a core check or renderer is so
refused before the gate without a change here.

Used by ``plugin_utils/_apply_args.py`` (the apply's input checks, which numa_plan runs before
site.yml's plan gate and the host_apply action before its module is sent), by the filter
``numafleet.tuning.module_input_problems`` and by ``tests/security``. Controller side only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    cmdline,
    gpu_settings,
    hugepages,
    kernel,
    mig,
    mps,
    units,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.errors import (
    NumaTuneError,
    escape_controls,
)

FIX = "Fix the variable; nothing was changed."
# The module option, for each apply module, -> (role input, host variable site.yml reads for it
# (_apply_args.site_inputs), or "" when the playbooks do not map it). An option left out is set by
# _apply_args.build itself.
NAMES = {
    "numa_hugepages": {
        "pools": ("hugepages_plan", ""),
        "boot_reserve_sizes_kb": ("hugepages_boot_reserve", "numafleet_hugepages_boot_reserve"),
        "bootloader": ("hugepages_bootloader", "numafleet_hugepages_bootloader"),
        "mounts": ("hugepages_mounts", "numafleet_hugepages_mounts"),
        "root": ("hugepages_render_root", "numafleet_render_root"),
        "kernel_args": ("hugepages_kernel_isolation", "numafleet_kernel_isolation"),
    },
    "numa_kernel": {
        "numa_balancing": ("numa_kernel_numa_balancing", "numafleet_numa_balancing"),
        "zone_reclaim_mode": ("numa_kernel_zone_reclaim_mode", "numafleet_zone_reclaim_mode"),
        "thp_enabled": ("numa_kernel_thp_enabled", "numafleet_thp_enabled"),
        "thp_defrag": ("numa_kernel_thp_defrag", "numafleet_thp_defrag"),
        "numad": ("numa_kernel_numad", "numafleet_numad"),
        "irqbalance_banned_cpus": (
            "numa_kernel_irqbalance_banned",
            "numafleet_irqbalance_banned",
        ),
        "irq_affinity": ("numa_kernel_irq_affinity", "numafleet_irq_affinity"),
        "root": ("numa_kernel_render_root", "numafleet_render_root"),
    },
    "nvidia_gpu_settings": {
        "gpus": ("nvidia_gpu_settings", "numafleet_gpu_settings"),
        "backend": ("nvidia_gpu_backend", "numafleet_mig_backend"),
        "root": ("nvidia_gpu_render_root", "numafleet_render_root"),
    },
    "nvidia_mig": {
        "gpus": ("nvidia_mig_plan", "numafleet_gpu_partitions"),
        "backend": ("nvidia_mig_backend", "numafleet_mig_backend"),
        "mig_parted_config": ("nvidia_mig_parted_config", "numafleet_mig_parted_config"),
        "root": ("nvidia_mig_render_root", "numafleet_render_root"),
    },
    "nvidia_mps": {
        "plan": ("nvidia_mps_plan", ""),
        "unit_dir": ("nvidia_mps_unit_dir", ""),
        "manifest_path": ("nvidia_mps_manifest_path", ""),
        "nvidia_cuda_mps_control": ("nvidia_mps_control_path", ""),
        "nvidia_smi": ("nvidia_mps_nvidia_smi_path", ""),
        "root": ("nvidia_mps_render_root", "numafleet_render_root"),
    },
    "pinned_units": {
        "plan": ("pinned_services_plan", ""),
        "unit_dir": ("pinned_services_unit_dir", ""),
        "manifest_path": ("pinned_services_manifest_path", ""),
        "root": ("pinned_services_render_root", "numafleet_render_root"),
    },
}
MODULES = tuple(sorted(NAMES))
# Linux's PATH_MAX and NAME_MAX: a longer render root cannot be created or written below.
PATH_MAX = 4096
NAME_MAX = 255


class _Bad(NumaTuneError):
    """A value of the wrong kind for a check (the module's argument spec would refuse it)."""


def _expanded(option: str, value: str) -> str:
    """value; raises _Bad when Ansible would expand it in a path option on the host."""
    if "$" in value or value.startswith("~"):
        raise _Bad(
            f"{option} is {_show(value)}; the module's path options expand $NAME and ~ on the "
            "host (to another path than the one checked and shown here): write the path out "
            "without $ or a leading ~"
        )
    return value


def _root(value) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise _Bad(f"root is {_show(value)}; give / (the host itself) or an absolute directory")
    units.check_text(value, "root")
    _expanded("root", value)
    # A root with .. components is fine (inventories name render roots relative to their own
    # directory, {{ inventory_dir }}/../...): it is a directory of the host, never a unit value.
    return _fits("root", value)


def _fits(option: str, path: str) -> str:
    """path; raises _Bad when Linux cannot create it (PATH_MAX, NAME_MAX: ENAMETOOLONG)."""
    size = len(path.encode("utf-8", "surrogatepass"))
    longest = max(len(part.encode("utf-8", "surrogatepass")) for part in path.split("/"))
    if size >= PATH_MAX or longest > NAME_MAX:
        shown = _show(path if size <= 80 else path[:60] + "...")
        raise _Bad(
            f"{option}: {shown} is a path of {size} bytes with a name of {longest}; Linux takes "
            f"paths below {PATH_MAX} bytes with names of at most {NAME_MAX}: give a shorter one"
        )
    return path


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{what} is {_show(value)}, not a string")
    return value


def _hugepages_checks(args: dict, offered_kb, numa_facts=None) -> list:
    def mounts():
        entries = args.get("mounts") or []
        sizes = offered_kb
        if sizes is None:  # no facts: the size check is left to the module
            sizes = [e.get("size_kb") for e in entries if isinstance(e, dict)]
        for mount in hugepages.parse_mounts(list(entries), [s for s in sizes if s]):
            hugepages.render_mount(mount)

    return [
        ("pools", lambda: hugepages.parse_pools(args.get("pools") or [])),
        (
            "boot_reserve_sizes_kb",
            lambda: hugepages.parse_sizes(
                list(args.get("boot_reserve_sizes_kb") or []), "boot_reserve_sizes_kb"
            ),
        ),
        ("bootloader", lambda: _choice(args, "bootloader", ("auto", *hugepages.BOOTLOADERS))),
        ("mounts", mounts),
        ("root", lambda: _root(args.get("root", "/"))),
        # The kernel release of the facts (kernel.osrelease) against the boot reservations.
        (
            "boot_reserve_sizes_kb",
            lambda: hugepages.check_boot_release(
                args.get("pools") or [],
                args.get("boot_reserve_sizes_kb") or [],
                numa_facts,
                _role_input("numa_hugepages", "boot_reserve_sizes_kb"),
            ),
        ),
        # auto below a render root (a recording has no bootloader files): decided here, before
        # the gate, not by the module after it.
        (
            "bootloader",
            lambda: hugepages.check_render_bootloader(
                args.get("pools") or [],
                args.get("boot_reserve_sizes_kb") or [],
                args.get("bootloader", "auto"),
                args.get("root", "/"),
                _role_input("numa_hugepages", "bootloader"),
                _role_input("numa_hugepages", "boot_reserve_sizes_kb"),
                list(args.get("kernel_args") or []),
            ),
        ),
        ("kernel_args", lambda: cmdline.check_args(args.get("kernel_args") or [])),
    ]


def _role_input(module: str, option: str) -> str:
    """The role input that sets a module option (what a role's user writes)."""
    return NAMES[module][option][0]


def _kernel_checks(args: dict) -> list:
    params = dict(args)
    params.setdefault("root", "/")
    params.setdefault("service_manager", "systemd")
    return [
        ("", lambda: kernel.parse_options(params)),
        ("root", lambda: _root(params["root"])),
    ]


def _mig_checks(args: dict) -> list:
    def files():
        parted = args.get("mig_parted_config") or None
        if parted is not None:
            parted = units.check_host_path("mig_parted_config", _text(parted, "mig_parted_config"))
            _fits("mig_parted_config", parted)
        empty = mig.Outcome((), (), (), (), (), ())
        mig.desired_files(
            empty,
            mig.DEFAULT_STATE_PATH,
            mig.DEFAULT_BOOT_PROGRAM_PATH,
            units.DEFAULT_UNIT_DIR,
            parted,
        )

    return [
        ("gpus", lambda: mig.parse_request(args.get("gpus") or [])),
        ("backend", lambda: _choice(args, "backend", ("auto", "nvml", "nvidia-smi"))),
        ("mig_parted_config", files),
        ("root", lambda: _root(args.get("root", "/"))),
    ]


def _gpu_checks(args: dict) -> list:
    return [
        ("gpus", lambda: gpu_settings.parse_settings(args.get("gpus") or [])),
        ("backend", lambda: _choice(args, "backend", ("auto", "nvml", "nvidia-smi"))),
        ("root", lambda: _root(args.get("root", "/"))),
    ]


def _mps_checks(args: dict) -> list:
    def render():
        daemons, dummy = mps.plan_daemons(args.get("plan"))
        unit_dir = units.check_host_path(
            "unit_dir", _option(args, "unit_dir", units.DEFAULT_UNIT_DIR)
        )
        files = mps.render_files(
            daemons,
            args.get("header", units.DEFAULT_HEADER),
            unit_dir,
            _option(args, "nvidia_cuda_mps_control", mps.DEFAULT_CONTROL),
            _option(args, "nvidia_smi", mps.DEFAULT_NVIDIA_SMI),
        )
        for path in files:
            _fits("unit_dir", path)

    return [
        ("plan", render),
        ("manifest_path", lambda: _path(args, "manifest_path", mps.DEFAULT_MANIFEST_PATH)),
        ("root", lambda: _root(args.get("root", "/"))),
    ]


def _pinned_checks(args: dict) -> list:
    def render():
        unit_dir = units.check_host_path(
            "unit_dir", _option(args, "unit_dir", units.DEFAULT_UNIT_DIR)
        )
        files = units.render_files(
            args.get("plan"),
            args.get("header", units.DEFAULT_HEADER),
            bool(args.get("hardening", True)),
            unit_dir,
            args.get("preflight", units.DEFAULT_PREFLIGHT),
        )
        for path in files:
            _fits("unit_dir", path)

    return [
        ("plan", render),
        ("manifest_path", lambda: _path(args, "manifest_path", units.DEFAULT_MANIFEST_PATH)),
        ("root", lambda: _root(args.get("root", "/"))),
    ]


def _choice(args: dict, option: str, choices: tuple):
    value = args.get(option, choices[0])
    if value not in choices:
        raise _Bad(f"{option} is {_show(value)}; use one of {', '.join(choices)}")
    return value


def _option(args: dict, option: str, default: str) -> str:
    """A path option of the module (type path: Ansible expands $NAME and ~ in it)."""
    return _expanded(option, _text(args.get(option, default), option))


def _path(args: dict, option: str, default: str) -> str:
    return _fits(option, units.check_host_path(option, _option(args, option, default)))


def _show(value) -> str:
    """JSON text of value (control characters escaped), or repr() of what JSON cannot write."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def offered_sizes_kb(numa_facts) -> list:
    """Page sizes (kB) of the hugepage pools of ansible_facts.numa's nodes; [] when unknown."""
    sizes = set()
    for node in (numa_facts or {}).get("nodes") or []:
        for pool in (node or {}).get("hugepages") or []:
            size = (pool or {}).get("size_kb")
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                sizes.add(size)
    return sorted(sizes)


def problems(module: str, args: dict, host: str, numa_facts=None) -> list:
    """One message per module option of ``args`` the core would refuse; [] when all pass.

    ``module``: one of MODULES; ``args``: the module arguments the role's apply task passes;
    ``numa_facts``: ansible_facts.numa (the page sizes the kernel offers), or None. Raises
    ValueError for an unknown module (a bug of the caller).
    """
    if module not in NAMES:
        raise ValueError(f"unknown module {module!r}; one of {', '.join(MODULES)}")
    if not isinstance(args, dict):
        return [f"host {host}: {module}: the arguments are {_show(args)}, not a mapping. {FIX}"]
    checks: dict[str, Callable[[], list]] = {
        "numa_hugepages": lambda: _hugepages_checks(
            args, None if numa_facts is None else offered_sizes_kb(numa_facts), numa_facts
        ),
        "numa_kernel": lambda: _kernel_checks(args),
        "nvidia_gpu_settings": lambda: _gpu_checks(args),
        "nvidia_mig": lambda: _mig_checks(args),
        "nvidia_mps": lambda: _mps_checks(args),
        "pinned_units": lambda: _pinned_checks(args),
    }
    out = []
    for option, check in checks[module]():
        try:
            check()
        except NumaTuneError as exc:
            out.append(_message(module, option, str(exc), host))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            # A shape the check did not expect: the module would end in a traceback there.
            text = f"{option or module} has a shape the module cannot read ({exc!r})"
            out.append(_message(module, option, text, host))
    return out


def _message(module: str, option: str, text: str, host: str) -> str:
    if text.startswith(f"host {host}: "):
        text = text[len(f"host {host}: ") :]
    # The option the message starts with (unit_dir: ..., mounts[0].group is ...), else the one
    # the check was for.
    named = [name for name in NAMES[module] if re.match(rf"{name}\b", text)]
    names = NAMES[module][max(named, key=len)] if named else NAMES[module].get(option)
    if names is None:
        label = module
    elif names[1]:
        label = f"{names[0]} (set from {names[1]} by site.yml and drift_check.yml)"
    else:
        label = names[0]
    return escape_controls(f"host {host}: {label}: {text.rstrip('.')}. {FIX}")
