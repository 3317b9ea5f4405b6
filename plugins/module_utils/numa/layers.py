# Private to this collection: may change in any release.
"""The apply layers (hugepages, kernel, gpu, amd, mig, mps, units) as one function each, behind ``run``.

The apply modules (numa_hugepages, numa_kernel, nvidia_gpu_settings, amd_partition, nvidia_mig,
nvidia_mps, pinned_units) and
host_apply call ``run(layer, params, host)``; it returns the module result of that layer (the
same keys the module returns) and raises LayerError (``msg`` and ``ran``). ``host`` is anything
with the attributes and methods of ``ModuleHost`` (an AnsibleModule adapted by it, or a test
double): ``check_mode``, ``diff``, ``run_command(argv, **kw)``, ``get_bin_path(name,
required=False)``, ``warn(text)``.

The caller holds the host lock (``lock(root, check_mode)``) around every layer it runs, so that
host_apply holds one lock for all of them. Each layer imports its core files when it runs: a
run of the units layer alone never imports the MIG, NVML or hugepage code.

``handler_argvs`` and ``merged_would_run`` turn layer results into the commands the roles'
handlers ran (the handler pass of host_apply) and into one ``would_run`` list; both do no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

from .errors import NumaTuneError

LAYERS = ("hugepages", "kernel", "gpu", "amd", "mig", "mps", "units")
ENVIRON = {"LC_ALL": "C", "LANG": "C"}
_SYSTEMD = dict(type="str", choices=["systemd", "none"], default="systemd")

# Defaults repeated from the core files (mig.py, mps.py, units.py) so that building a spec imports
# none of them; tests/unit/plugins/module_utils/numa/test_layers.py checks that they agree.
_MIG_STATE_PATH = "/etc/numafleet/mig.json"
_MIG_BOOT_PROGRAM_PATH = "/usr/local/libexec/numafleet-mig"
_MIG_PARTED_PATH = "/etc/numafleet/mig-parted.yaml"
_MPS_MANIFEST_PATH = "/etc/numafleet/mps-units.json"
_AMD_STATE_PATH = "/etc/numafleet/amd-partition.json"
_AMD_BOOT_PROGRAM_PATH = "/usr/local/libexec/numafleet-amd-partition"
_MPS_CONTROL = "/usr/bin/nvidia-cuda-mps-control"
_MPS_NVIDIA_SMI = "/usr/bin/nvidia-smi"
_UNITS_HEADER = "# Managed by numafleet.tuning"
_UNIT_DIR = "/etc/systemd/system"
_UNITS_MANIFEST_PATH = "/etc/numafleet/manifest.json"
_UNITS_PLAN_PATH = "/etc/numafleet/plan.json"

_MIG_LAYOUT = dict(
    profile=dict(type="str", required=True),
    start=dict(type="int"),
    compute_profile=dict(type="str"),
)
_MIG_GPU = dict(
    gpu=dict(type="str", required=True),
    uuid=dict(type="str"),
    mode=dict(type="str", choices=["enabled", "disabled"], default="enabled"),
    layout=dict(type="list", elements="dict", default=[], options=_MIG_LAYOUT),
)

# No choices= on compute_mode: the core accepts either case and names the choices itself.
_GPU_SETTING = dict(
    gpu=dict(type="str", required=True),
    persistence=dict(type="bool"),
    compute_mode=dict(type="str"),
    application_clocks=dict(
        type="dict",
        options=dict(
            memory_mhz=dict(type="int", required=True),
            graphics_mhz=dict(type="int", required=True),
        ),
    ),
    power_limit_w=dict(type="int"),
)

# Each layer's module argument_spec (the module's DOCUMENTATION documents the same options).
SPECS = {
    "hugepages": dict(
        pools=dict(
            type="list",
            elements="dict",
            required=True,
            options=dict(
                node=dict(type="int", required=True),
                size_kb=dict(type="int", required=True),
                count=dict(type="int", required=True),
            ),
        ),
        sysfs_root=dict(type="path", default="/sys"),
        procfs_root=dict(type="path", default="/proc"),
        root=dict(type="path", default="/"),
        service_manager=_SYSTEMD,
        boot_reserve_sizes_kb=dict(type="list", elements="int", default=[]),
        bootloader=dict(type="str", choices=["auto", "grub_d", "grubby", "none"], default="auto"),
        kernel_args=dict(type="list", elements="str", default=[]),
        mounts=dict(
            type="list",
            elements="dict",
            default=[],
            options=dict(
                path=dict(type="str", required=True),
                size_kb=dict(type="int", required=True),
                mode=dict(type="str", default="1770"),
                group=dict(type="str"),
            ),
        ),
    ),
    "kernel": dict(
        # No choices=: AnsibleModule refuses an explicit null against them, and null means
        # "leave alone" here. The core checks the values (kernel.parse_options).
        numa_balancing=dict(type="int"),
        zone_reclaim_mode=dict(type="int"),
        thp_enabled=dict(type="str"),
        thp_defrag=dict(type="str"),
        numad=dict(type="str", default="leave"),
        irqbalance_banned_cpus=dict(type="str"),
        irq_affinity=dict(
            type="list",
            elements="dict",
            default=[],
            options=dict(
                irq=dict(type="int"),
                address=dict(type="str"),
                cpus=dict(type="str", required=True),
            ),
        ),
        sysfs_root=dict(type="path", default="/sys"),
        procfs_root=dict(type="path", default="/proc"),
        root=dict(type="path", default="/"),
        service_manager=_SYSTEMD,
    ),
    "gpu": dict(
        gpus=dict(type="list", elements="dict", default=[], options=_GPU_SETTING),
        mps_gpus=dict(type="list", elements="str", default=[]),
        backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
        snapshot=dict(type="path"),
        root=dict(type="path", default="/"),
        service_manager=_SYSTEMD,
        procfs_root=dict(type="path", default="/proc"),
        sysfs_root=dict(type="path", default="/sys"),
    ),
    "amd": dict(
        # plan.amd_partitions entries, checked by the core (amd_partition.plan_changes).
        gpus=dict(type="list", elements="dict", required=True),
        reset_ok=dict(type="bool", default=False),
        owned_units=dict(type="list", elements="str", default=[]),
        backend=dict(type="str", choices=["auto", "amdsmi", "amd-smi", "sysfs"], default="auto"),
        root=dict(type="path", default="/"),
        state_path=dict(type="path", default=_AMD_STATE_PATH),
        boot_program_path=dict(type="path", default=_AMD_BOOT_PROGRAM_PATH),
        unit_dir=dict(type="path", default=_UNIT_DIR),
        service_manager=_SYSTEMD,
        procfs_root=dict(type="path", default="/proc"),
        sysfs_root=dict(type="path", default="/sys"),
    ),
    "mig": dict(
        gpus=dict(type="list", elements="dict", required=True, options=_MIG_GPU),
        reset_ok=dict(type="bool", default=False),
        owned_units=dict(type="list", elements="str", default=[]),
        backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
        snapshot=dict(type="path"),
        root=dict(type="path", default="/"),
        state_path=dict(type="path", default=_MIG_STATE_PATH),
        boot_program_path=dict(type="path", default=_MIG_BOOT_PROGRAM_PATH),
        unit_dir=dict(type="path", default=_UNIT_DIR),
        mig_parted_config=dict(type="str", default=_MIG_PARTED_PATH),
        service_manager=_SYSTEMD,
        procfs_root=dict(type="path", default="/proc"),
        sysfs_root=dict(type="path", default="/sys"),
    ),
    "mps": dict(
        plan=dict(type="dict", required=True),
        root=dict(type="path", default="/"),
        unit_dir=dict(type="path", default=_UNIT_DIR),
        manifest_path=dict(type="path", default=_MPS_MANIFEST_PATH),
        header=dict(type="str", default=_UNITS_HEADER),
        service_manager=_SYSTEMD,
        nvidia_cuda_mps_control=dict(type="path", default=_MPS_CONTROL),
        nvidia_smi=dict(type="path", default=_MPS_NVIDIA_SMI),
    ),
    "units": dict(
        plan=dict(type="dict", required=True),
        root=dict(type="path", default="/"),
        unit_dir=dict(type="path", default=_UNIT_DIR),
        manifest_path=dict(type="path", default=_UNITS_MANIFEST_PATH),
        plan_path=dict(type="path", default=_UNITS_PLAN_PATH),
        header=dict(type="str", default=_UNITS_HEADER),
        hardening=dict(type="bool", default=True),
        preflight=dict(type="str", default="warn", choices=["enforce", "warn", "off"]),
        service_manager=_SYSTEMD,
    ),
}

# Layers whose module result has carried `ran` on failure (the others fail with `msg` only).
_RAN_ON_FAILURE = ("kernel", "gpu", "mps", "units")


class LayerError(Exception):
    """A layer failed: ``msg`` is the complete message, ``ran`` the commands it ran before.

    ``ran`` is None for the layers whose module never reported it on failure (hugepages, mig).
    """

    def __init__(self, msg: str, ran: Optional[list] = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.ran = ran


class ModuleHost:
    """The host protocol over an AnsibleModule: its check_mode, _diff, run_command, ...

    ``load_pynvml()`` gives the pynvml module or None (the module file imports it: the core
    imports nothing outside the standard library); without it the mig layer has no NVML.
    ``load_amdsmi()`` likewise gives the amdsmi module or None (the amd layer's amdsmi backend).
    """

    def __init__(self, module, load_pynvml=None, load_amdsmi=None) -> None:
        self.module = module
        self.load_pynvml = load_pynvml
        self.load_amdsmi = load_amdsmi
        self.check_mode = bool(module.check_mode)
        self.diff = bool(module._diff)

    def run_command(self, argv, **kw):
        return self.module.run_command(argv, **kw)

    def get_bin_path(self, name: str, required: bool = False):
        return self.module.get_bin_path(name, required=required)

    def warn(self, text: str) -> None:
        self.module.warn(text)


@contextmanager
def lock(root: str, check_mode: bool) -> Iterator[None]:
    """Hold files.host_lock(root) (not in check mode); a LockError becomes LayerError."""
    if check_mode:
        yield
        return
    from . import files

    try:
        held = files.host_lock(root)
        held.__enter__()
    except NumaTuneError as exc:
        raise LayerError(str(exc)) from None
    try:
        yield
    finally:
        held.__exit__(None, None, None)


def run(layer: str, params: dict, host) -> dict:
    """The module result of ``layer`` (one of LAYERS) for its validated ``params``.

    Warnings go through ``host.warn`` (the result has none); ``diff`` is in the result only when
    ``host.diff``. Raises LayerError (every NumaTuneError of the core becomes one). The caller
    holds the host lock (``lock``).
    """
    ran: list = []
    try:
        return _RUNNERS[layer](params, host, ran)
    except NumaTuneError as exc:
        raise LayerError(str(exc), ran if layer in _RAN_ON_FAILURE else None) from None


def run_module(module, layer: str, load_pynvml=None, load_amdsmi=None) -> None:
    """Lock + run + exit_json/fail_json for one of the thin apply modules; never returns."""
    host = ModuleHost(module, load_pynvml, load_amdsmi)
    try:
        with lock(module.params["root"], host.check_mode):
            result = run(layer, module.params, host)
    except LayerError as exc:
        extra = {} if exc.ran is None else {"ran": exc.ran}
        module.fail_json(msg=exc.msg, **extra)
    module.exit_json(**result)


def _hugepages(params: dict, host, ran: list) -> dict:
    from . import hugepages

    plan = hugepages.plan_hugepages(
        pools=params["pools"],
        sysfs_root=params["sysfs_root"],
        procfs_root=params["procfs_root"],
        root=params["root"],
        service_manager=params["service_manager"],
        boot_reserve_sizes_kb=params["boot_reserve_sizes_kb"],
        bootloader=params["bootloader"],
        mounts=params["mounts"],
        extra_kernel_args=params.get("kernel_args") or (),
    )
    if not host.check_mode:
        hugepages.apply_hugepages(plan)
    result = plan.as_result(host.check_mode, host.diff)
    for warning in result.pop("warnings"):
        host.warn(warning)
    return result


def _kernel(params: dict, host, ran: list) -> dict:
    from . import kernel

    def binary(name: str):
        """Path of ``systemctl`` (required) or ``timeout`` (optional)."""
        return host.get_bin_path(name, required=name == "systemctl")

    systemd = params["service_manager"] == "systemd"
    desired = kernel.parse_options(params)
    state = kernel.read_state(desired, params["sysfs_root"], params["procfs_root"], params["root"])
    services = {}
    for unit in kernel.units_to_query(desired, state) if systemd else []:
        argvs = kernel.query_argvs(binary("systemctl"), binary("timeout"), unit)
        outs = [host.run_command(argv, environ_update=dict(ENVIRON))[1] for argv in argvs]
        services[unit] = kernel.parse_service_state(*outs)
    change = kernel.plan_change(desired, state, services)
    warnings = list(change.warnings)
    if not host.check_mode:
        warnings += kernel.write_runtime(change.runtime)
        kernel.write_files(params["root"], change.files)
        for args in change.commands if systemd else ():
            argv = kernel.command_argv(binary("systemctl"), binary("timeout"), args)
            rc, dummy, err = host.run_command(argv, environ_update=dict(ENVIRON))
            line = " ".join(("systemctl",) + tuple(args))
            if rc != 0:
                raise LayerError(
                    f"{line} failed (rc {rc}): {err.strip()}; the kernel settings and "
                    "files are written: fix the unit by hand and run again",
                    ran,
                )
            ran.append(line)
    for warning in warnings:
        host.warn(warning)
    result = dict(
        changed=change.changed,
        settings=[setting.as_dict() for setting in change.settings],
        files=[file_change.as_dict() for file_change in change.files],
        would_run=change.would_run(),
        ran=ran,
        drift=kernel_drift(change.settings),
    )
    if host.diff:
        result["diff"] = change.as_diff()
    return result


def kernel_drift(settings) -> list:
    """The kernel layer's ``drift``: [{setting, planned, actual, reason}] of the settings that
    differ from the plan before the run (kernel.Setting ``before`` is what the host shows:
    /proc/sys/kernel/numa_balancing, /proc/sys/vm/zone_reclaim_mode, the THP selectors under
    /sys/kernel/mm/transparent_hugepage, numad, IRQBALANCE_BANNED_CPUS, and
    /proc/irq/N/smp_affinity_list as ``irq_affinity[N]``)."""
    return [
        {
            "setting": s.name,
            "planned": s.after,
            "actual": s.before,
            "reason": "",
            "pending": False,
        }
        for s in settings
        if s.changed
    ]


def _no_nvml():
    return None


def host_runner(host):
    """``runner(argv) -> (rc, out, err)`` over ``host.run_command`` with the C locale (ENVIRON):
    what the core's layers take to run a tool."""

    def runner(argv):
        return host.run_command(argv, environ_update=dict(ENVIRON))

    return runner


def _report(result: dict, host) -> dict:
    """``result`` of a GPU layer (gpu, amd) as the module returns it: its ``warnings`` go to
    ``host.warn`` and leave it, its ``diff`` stays only when ``host.diff``."""
    for warning in result.pop("warnings"):
        host.warn(warning)
    if not host.diff:
        result.pop("diff")
    return result


class _GpuHost:
    """What gpu_settings.run needs of the host: commands, binaries, NVML and GPU holders."""

    def __init__(self, host, params: dict) -> None:
        self.host = host
        self.params = params
        self.load_nvml = getattr(host, "load_pynvml", None) or _no_nvml

    def runner(self, argv):
        return host_runner(self.host)(argv)

    def which(self, name: str):
        return self.host.get_bin_path(name)

    def holders(self) -> list:
        import os

        from .mig_holders import read_holders

        return read_holders(
            self.params["procfs_root"], self.params["sysfs_root"], exclude_pids=(os.getpid(),)
        )

    def minors(self) -> dict:
        from .mig_holders import read_gpu_minors

        return read_gpu_minors(self.params["procfs_root"])


def _gpu(params: dict, host, ran: list) -> dict:
    from . import gpu_settings

    result = gpu_settings.run(dict(params), host.check_mode, _GpuHost(host, params), ran)
    return _report(result, host)


def _amd(params: dict, host, ran: list) -> dict:
    """The amd layer: amd_partition.run with the host's runner, which and amdsmi loader."""
    import os

    from . import amd_partition

    result = amd_partition.run(
        dict(params),
        host.check_mode,
        host_runner(host),
        host.get_bin_path,
        getattr(host, "load_amdsmi", None),
        exclude_pids=(os.getpid(),),
    )
    ran.extend(result["ran"])
    return _report(result, host)


def _mig(params: dict, host, ran: list) -> dict:
    from . import mig_nvml

    load = getattr(host, "load_pynvml", None) or _no_nvml
    result = mig_nvml.run(dict(params), host.check_mode, host_runner(host), host.get_bin_path, load)
    result["drift"] = mig_drift(result, bool(params.get("snapshot")))
    for item in result["kept"]:
        host.warn(f"{item['path']}: {item['reason']}")
    if not host.diff:
        result.pop("diff")
    return result


_GI_LINE = re.compile(r"^(\S+@[0-9]+)")


def _instances(lines) -> str:
    """ "mode enabled; 2g.20gb@0, 3g.40gb@4" from a GPU's diff lines (mode, then GI lines)."""
    lines = list(lines or ())
    if not lines:
        return "absent"
    found = sorted(m.group(1) for m in map(_GI_LINE.match, lines[1:]) if m)
    return f"{lines[0]}; {', '.join(found) or 'no instances'}"


def mig_drift(result: dict, render: bool) -> list:
    """The MIG layer's ``drift``: one {setting: "GPU <address> MIG layout", planned, actual,
    reason, pending} per planned GPU whose mode or instances (profile@placement start) as read
    (NVML, nvidia-smi or the snapshot) differ from the plan. ``pending`` is true only for a GPU
    whose MIG mode change waits for a GPU reset (``reset_required``): in render mode the
    snapshot keeps such a change pending as the driver does; every other difference is drift
    (a render apply writes its changes into the snapshot, so a difference after it is a change
    of the recording)."""
    waiting = {
        str(gpu.get("address")): bool(gpu.get("reset_required"))
        for gpu in result.get("gpus") or ()
        if isinstance(gpu, dict)
    }
    out = []
    for entry in result.get("diff") or ():
        header = str(entry.get("before_header") or "")
        if not header.startswith("GPU "):
            continue
        actual = _instances(str(entry.get("before") or "").splitlines())
        planned = _instances(str(entry.get("after") or "").splitlines())
        if actual == planned:
            continue
        pending = waiting.get(header[4:], False)
        reason = ""
        if pending:
            reason = "the MIG mode change is pending until the GPU is reset" + (
                " (render mode: the snapshot keeps it pending, as the driver does)"
                if render
                else ""
            )
        out.append(
            {
                "setting": f"{header} MIG layout",
                "planned": planned,
                "actual": actual,
                "reason": reason,
                "pending": pending,
            }
        )
    return out


def mps_drift(settings: list) -> list:
    """The MPS layer's ``drift``: one {setting: "<unit> <name>", planned, actual, reason} per
    default a running daemon reports other than the plan (``mps.sync_settings`` entries:
    get_default_active_thread_percentage and get_default_device_pinned_mem_limit 0 asked
    through nvidia-cuda-mps-control with the daemon's CUDA_MPS_PIPE_DIRECTORY)."""
    out = []
    for entry in settings:
        for name in ("active_thread_percentage", "pinned_memory_limit_mib"):
            value = entry.get(name) or {}
            planned, running = value.get("planned"), value.get("running")
            if planned is not None and running is not None and planned != running:
                out.append(
                    {
                        "setting": f"{entry.get('unit')} {name}",
                        "planned": planned,
                        "actual": running,
                        "reason": "",
                        "pending": False,
                    }
                )
    return out


def _disable(host, units, systemctl: str, names, ran: list, kept: str) -> None:
    """``systemctl disable --now`` each unit of ``names`` (appended to ``ran``); LayerError.

    ``kept`` completes the failure message: "drop-in is kept: stop the daemon".
    """
    timeout = host.get_bin_path("timeout")
    for unit in names:
        argv = units.disable_argv(systemctl, timeout, unit)
        rc, dummy, err = host.run_command(argv, environ_update=dict(ENVIRON))
        if rc != 0:
            raise LayerError(
                f"systemctl disable --now {unit} failed (rc {rc}): {err.strip()}; "
                f"its {kept} by hand and run again",
                ran,
            )
        ran.append(f"systemctl disable --now {unit}")


def _mps(params: dict, host, ran: list) -> dict:
    from . import mps, units

    root, systemd = params["root"], params["service_manager"] == "systemd"
    control = params["nvidia_cuda_mps_control"]
    settings, live = [], False

    def runner(argv, stdin, environ):
        return host.run_command(
            argv, data=stdin, binary_data=True, environ_update=dict(ENVIRON, **environ)
        )

    daemons, warnings = mps.plan_daemons(params["plan"])
    unit_dir = units.check_host_path("unit_dir", params["unit_dir"])
    manifest_path = units.check_host_path("manifest_path", params["manifest_path"])
    desired = mps.render_files(daemons, params["header"], unit_dir, control, params["nvidia_smi"])
    manifest = units.read_manifest(root, manifest_path)
    mps.check_manifest_owner(manifest_path, manifest.files)
    owned, kept = units.removable(root, manifest, desired, unit_dir, params["header"])
    current = units.read_files(root, set(desired) | set(owned))
    changes = units.plan_changes(current, desired, owned)
    manifest_change = units.plan_manifest(manifest, desired)
    actions = mps.plan_actions(changes, daemons)
    systemctl = host.get_bin_path("systemctl", required=True) if systemd else None
    if systemd:
        settings, synced, live = mps.sync_settings(
            runner, systemctl, control, daemons, actions, not host.check_mode
        )
        ran.extend(synced)
    else:
        # Render mode: the recording below root stands for the running daemons (mps.py). A
        # daemon restarted in this run takes the planned defaults (ExecStartPost=) unless
        # host_apply runs with restart never ("restart", set by host_apply only).
        recording = mps.read_recording(root)
        settings = mps.recorded_settings(recording, daemons, actions)
        keep = set(actions.restart) if params.get("restart") == "never" else set()
        live = bool(mps_drift(settings)) or mps.recording_stale(root, daemons, recording, keep)
        if not host.check_mode:
            mps.write_recording(root, daemons, recording, keep)
    if not host.check_mode:
        if systemd:
            _disable(
                host, units, systemctl, actions.disable, ran, "drop-in is kept: stop the daemon"
            )
        units.write_files(root, changes)
        units.write_manifest(root, manifest_change)

    for warning in warnings + [item.message() for item in kept]:
        host.warn(warning)
    every = changes + ([manifest_change] if manifest_change else [])
    handlers = systemd and not host.check_mode
    result = dict(
        changed=live or any(change.state != "unchanged" for change in every),
        files=[change.as_dict() for change in every],
        daemons=[daemon.as_dict() for daemon in daemons],
        units=actions.units,
        reload_needed=actions.reload_needed,
        would_run=actions.would_run(),
        ran=ran,
        settings=settings,
        drift=mps_drift(settings),
        skipped=warnings,
        kept=[item.as_dict() for item in kept],
        handler_restart=list(actions.restart) if handlers else [],
        handler_start=list(actions.start) if handlers else [],
    )
    if host.diff:
        result["diff"] = [change.as_diff() for change in every if change.state != "unchanged"]
        if result["drift"]:
            header = "MPS daemon defaults (running)"
            result["diff"].append(
                {
                    "before_header": header,
                    "after_header": header,
                    "before": "".join(_mps_line(d, "actual") for d in result["drift"]),
                    "after": "".join(_mps_line(d, "planned") for d in result["drift"]),
                }
            )
    return result


def _mps_line(drift: dict, key: str) -> str:
    """ "<name>: <value> (<unit>)" of an MPS drift entry (the drift report names the setting)."""
    unit, dummy, name = str(drift["setting"]).rpartition(" ")
    return f"{name}: {drift[key]} ({unit})\n"


def _units(params: dict, host, ran: list) -> dict:
    from . import partition, units

    root, systemd = params["root"], params["service_manager"] == "systemd"
    unit_dir = units.check_host_path("unit_dir", params["unit_dir"])
    manifest_path = units.check_host_path("manifest_path", params["manifest_path"])
    desired = units.render_files(
        params["plan"], params["header"], params["hardening"], unit_dir, params["preflight"]
    )
    plan_path = units.check_host_path("plan_path", params["plan_path"])
    manifest = units.read_manifest(root, manifest_path)
    owned, kept = units.removable(root, manifest, desired, unit_dir, params["header"])
    current = units.read_files(root, set(desired) | set(owned))
    changes = units.plan_changes(current, desired, owned)
    manifest_change = units.plan_manifest(manifest, desired)
    plan_change = units.plan_record_change(root, plan_path, params["plan"])
    # Placements whose MIG instance does not exist yet are written, never started; those that
    # waited in the recorded plan and wait no more are started now.
    waiting = units.waiting_units(params["plan"])
    waited = units.recorded_waiting(plan_change.before)
    if plan_change.state == "create" and not desired and not manifest.files:
        plan_change = None  # nothing planned, nothing written before: nothing to record
    actions = units.plan_actions(changes, waiting, waited)
    would_run = actions.would_run()
    # The partition's system.conf.d drop-in removed: PID 1 gets every allowed CPU back after
    # the re-exec (partition.pid1_reset_argv); none when it is written or unchanged.
    reset = None
    if any(partition.is_manager_file(c.path) and c.state == "remove" for c in changes):
        reset = partition.pid1_reset_argv(params["plan"])
    if reset is not None:
        would_run.insert(would_run.index("systemctl daemon-reexec") + 1, " ".join(reset))
    if not host.check_mode:
        if systemd and actions.disable:
            systemctl = host.get_bin_path("systemctl", required=True)
            _disable(
                host, units, systemctl, actions.disable, ran, "unit file is kept: stop the unit"
            )
        units.write_files(root, changes)
        units.write_manifest(root, manifest_change)
        if plan_change is not None:
            units.write_files(root, [plan_change])

    for item in kept:
        host.warn(item.message())
    for unit in sorted(set(waiting) & set(actions.units["changed"])):
        waits = waiting[unit]
        if "partition" in waits:  # AMD: a logical GPU of a compute partition still to be made
            what, device = waits.get("partition"), "logical GPU"
        else:
            what, device = f"MIG instance {waits.get('mig_instance')}", "MIG device"
        host.warn(
            f"{unit}: its unit file changed, but it is not restarted: it waits for {what} "
            f"({waits.get('reason')}). If it runs (started by hand), it runs as before, "
            f"without its planned {device}: stop it until it exists"
        )
    every = [change for change in changes + [manifest_change, plan_change] if change is not None]
    handlers = systemd and not host.check_mode
    state = _effective_units(params, host, desired, changes)
    result = dict(
        changed=any(change.state != "unchanged" for change in every),
        files=[change.as_dict() for change in every],
        units=actions.units,
        slices=actions.slices,
        reload_needed=actions.reload_needed,
        reexec_needed=actions.reexec_needed,
        rewritten=list(actions.rewritten),
        pid1_affinity_reset=reset or [],
        would_run=would_run,
        ran=ran,
        kept=[item.as_dict() for item in kept],
        handler_restart=list(actions.restart) if handlers else [],
        handler_try_restart=list(actions.try_restart) if handlers else [],
        handler_start=list(actions.start) if handlers else [],
        waiting=actions.waiting_dicts(),
        effective=state["effective"],
        foreign_overrides=state["foreign_overrides"],
    )
    if host.diff:
        result["diff"] = [change.as_diff() for change in every if change.state != "unchanged"]
    return result


def _effective_units(params: dict, host, desired: dict, changes: list) -> dict:
    """effective.effective_state of the planned units, with the files as this run leaves them.

    On the host itself (root /, service_manager systemd, systemctl found) the live properties
    come from one read-only ``systemctl show`` of every unit (also in check mode).
    """
    from . import effective, units

    overlay = {change.path: change.after for change in changes}
    pending = {units.unit_of(c.path) for c in changes if c.state != "unchanged"}
    show = None
    systemctl = None
    if params["service_manager"] == "systemd" and params["root"] == "/":
        systemctl = host.get_bin_path("systemctl")
    if systemctl:

        def show(names):
            rc, out, dummy = host.run_command(
                effective.show_argv(systemctl, names), environ_update=dict(ENVIRON)
            )
            return out if rc == 0 else None

    return effective.effective_state(params["root"], desired, overlay, pending, show)


_RUNNERS = {
    "hugepages": _hugepages,
    "kernel": _kernel,
    "gpu": _gpu,
    "amd": _amd,
    "mig": _mig,
    "mps": _mps,
    "units": _units,
}

# The MIG boot unit's file name, as mig.UNIT_NAME.
MIG_UNIT = "numafleet-mig.service"
# The AMD partition boot unit's file name, as amd_partition.UNIT_NAME.
AMD_UNIT = "numafleet-amd-partition.service"
HUGEPAGES_UNIT = "numafleet-hugepages.service"
_RESTART_LINE = re.compile(r"^systemctl (try-)?restart ")


def _changed_mig_unit(result: dict, name: str = MIG_UNIT) -> Optional[dict]:
    """The boot unit ``name``'s entry in a layer result's files when it changed, else None."""
    for entry in result.get("files") or ():
        if entry.get("path", "").endswith("/" + name) and entry.get("state") != "unchanged":
            return entry
    return None


def _reload_needed(results: dict) -> bool:
    """Whether a layer wrote or removed a unit file (systemd must reload once)."""
    hp, mig = results.get("hugepages") or {}, results.get("mig") or {}
    mounts = (
        hp.get("handler_mount_stop")
        or hp.get("handler_mount_restart")
        or hp.get("handler_mount_start")
    )
    if hp.get("handler_enable") or mounts or _changed_mig_unit(mig):
        return True
    if _changed_mig_unit(results.get("amd") or {}, AMD_UNIT):
        return True
    return any((results.get(name) or {}).get("reload_needed") for name in ("mps", "units"))


def handler_argvs(results: dict, restart: str = "auto", awaited=()) -> list:
    """The handler pass after the layers, in order: a list of argv lists; no I/O.

    ``results``: layer name -> that layer's result (service_manager systemd, not check mode: the
    handler_* lists are filled). The order is the roles' handlers': hugepages' mount units
    disabled; ONE daemon-reload when any layer wrote or removed a unit file (then
    daemon-reexec when the units layer changed the partition's system.conf.d drop-in); the hugepages unit
    enabled, mounts restarted and started; the boot loader updated; the MIG boot unit enabled
    (when written, not removed); MPS daemons enabled and restarted (``restart`` auto) and started; pinned
    units restarted and try-restarted (``restart`` auto) and started; then ``awaited`` units
    try-restarted (``restart`` auto).
    """
    auto = restart == "auto"
    hp = results.get("hugepages") or {}
    mig, mps, units = (results.get(name) or {} for name in ("mig", "mps", "units"))
    argvs = [["systemctl", "disable", "--now", unit] for unit in hp.get("handler_mount_stop") or ()]
    if _reload_needed(results):
        argvs.append(["systemctl", "daemon-reload"])
    if (results.get("units") or {}).get("reexec_needed"):
        # The partition's system.conf.d drop-in changed: PID 1 reads it when it re-executes.
        argvs.append(["systemctl", "daemon-reexec"])
        reset = (results.get("units") or {}).get("pid1_affinity_reset")
        if reset:  # the drop-in was removed: PID 1 keeps its affinity otherwise
            argvs.append(list(reset))
    if hp.get("handler_enable"):
        argvs.append(["systemctl", "enable", HUGEPAGES_UNIT])
    argvs += [["systemctl", "restart", unit] for unit in hp.get("handler_mount_restart") or ()]
    argvs += [
        ["systemctl", "enable", "--now", unit] for unit in hp.get("handler_mount_start") or ()
    ]
    if hp.get("cmdline_changed", hp.get("reboot_required")) and hp.get("bootloader") == "grub_d":
        argvs.append(["update-grub"])
    argvs += [list(argv) for argv in hp.get("grubby_argvs") or ()]
    unit = _changed_mig_unit(results.get("amd") or {}, AMD_UNIT)
    if unit is not None and unit.get("state") != "remove":
        argvs.append(["systemctl", "enable", AMD_UNIT])
    unit = _changed_mig_unit(mig)
    if unit is not None and unit.get("state") != "remove":
        argvs.append(["systemctl", "enable", MIG_UNIT])
    if auto:
        for name in mps.get("handler_restart") or ():
            argvs += [["systemctl", "enable", name], ["systemctl", "restart", name]]
    argvs += [["systemctl", "enable", "--now", name] for name in mps.get("handler_start") or ()]
    if auto:
        argvs += [["systemctl", "restart", name] for name in units.get("handler_restart") or ()]
        argvs += [["systemctl", "try-restart", n] for n in units.get("handler_try_restart") or ()]
    argvs += [["systemctl", "enable", "--now", name] for name in units.get("handler_start") or ()]
    if auto:
        argvs += [["systemctl", "try-restart", name] for name in awaited]
    return argvs


def merged_would_run(results: dict, restart: str = "auto", awaited=()) -> list:
    """Every layer's ``would_run`` in layer order with ONE ``systemctl daemon-reload`` (where the
    first layer had it); restart lines of mps and units dropped when ``restart`` is never (as the
    pinned_services role's report does); then ``systemctl try-restart UNIT`` for ``awaited``.
    ``systemctl daemon-reexec`` (the partition's system.conf.d changed) follows the reload."""
    lines, reload_seen = [], False
    for name in LAYERS:
        for line in (results.get(name) or {}).get("would_run") or ():
            if line == "systemctl daemon-reload":
                if reload_seen:
                    continue
                reload_seen = True
            elif restart == "never" and name in ("mps", "units") and _RESTART_LINE.match(line):
                continue
            lines.append(line)
    if restart == "auto":
        lines += [f"systemctl try-restart {unit}" for unit in awaited]
    if "systemctl daemon-reexec" in lines and "systemctl daemon-reload" in lines:
        # As the handler pass runs them: right after the one reload (handler_argvs).
        moved = [line for line in lines if line == "systemctl daemon-reexec"]
        moved += [line for line in lines if line.startswith("taskset ")]
        lines = [line for line in lines if line not in moved]
        at = lines.index("systemctl daemon-reload") + 1
        lines[at:at] = moved
    return lines


# The plan lists each layer reads (host_apply derives the layer's options from them).
_PLAN_LISTS = {
    "hugepages": ("nodes",),
    "kernel": (),
    "gpu": ("mps_daemons",),
    "amd": (),  # amd_partitions is present only on hosts with AMD GPUs
    "mig": ("mig_gpus", "placements", "mps_daemons"),
    "mps": ("mps_daemons",),
    "units": ("placements",),
}
# The options host_apply supplies to each layer: a layer's dict may not set them.
SUPPLIED = {
    "hugepages": ("root", "service_manager", "pools"),
    "kernel": ("root", "service_manager"),
    "gpu": ("root", "service_manager", "mps_gpus"),
    "amd": ("root", "service_manager", "gpus", "owned_units"),
    "mig": ("root", "service_manager", "gpus", "owned_units"),
    "mps": ("root", "service_manager", "plan"),
    "units": ("root", "service_manager", "plan"),
}
_PLAN_FIX = (
    "pass the host's plan as numafleet.tuning.numa_plan publishes it "
    "(plan: '{{ ansible_facts.numafleet_plan }}'), made by this release of the collection"
)


def check_plan(plan, host: Optional[str] = None, enabled=LAYERS) -> None:
    """Refuse a plan the ``enabled`` layers cannot use; raises LayerError naming the fix.

    The plan must be a dict of version 1, made for ``host`` (when given), with the lists the
    layers read: nodes (hugepages), mig_gpus, placements and mps_daemons (mig), mps_daemons (mps),
    placements (units).
    """
    if not isinstance(plan, dict):
        raise LayerError(f"plan: a {type(plan).__name__} is not a plan; {_PLAN_FIX}")
    who = f"host {plan.get('host') if host is None else host}: "
    if plan.get("version") != 1:
        raise LayerError(f"{who}plan: version {plan.get('version')!r} is not 1; {_PLAN_FIX}")
    if host is not None and plan.get("host") != host:
        raise LayerError(
            f"{who}plan: the plan was made for host {plan.get('host')!r}, not {host}; {_PLAN_FIX}"
        )
    for layer in (name for name in LAYERS if name in enabled):
        for key in _PLAN_LISTS[layer]:
            if not isinstance(plan.get(key), list):
                raise LayerError(
                    f"{who}plan: {key} is not a list (layer {layer} reads it); {_PLAN_FIX}"
                )


def supplied_params(layer: str, plan: dict, root: str, service_manager: str) -> dict:
    """The options of ``layer`` host_apply derives from the plan, ``root`` and ``service_manager``.

    hugepages: ``pools`` = one {node, size_kb, count} per plan.nodes[].hugepages[]; amd: ``gpus``
    = plan.amd_partitions ([] when absent), ``owned_units`` = their owned_units; mig: ``gpus``
    = plan.mig_gpus, ``owned_units`` = the units of plan.placements and plan.mps_daemons (entries
    with a unit); mps, units: ``plan``. Shapes are the plan's (check_plan first).
    """
    params = {"root": root, "service_manager": service_manager}
    if layer == "hugepages":
        params["pools"] = [
            {"node": node.get("id"), "size_kb": pool.get("size_kb"), "count": pool.get("count")}
            for node in plan.get("nodes") or []
            for pool in node.get("hugepages") or []
        ]
    elif layer == "mig":
        params["gpus"] = plan.get("mig_gpus") or []
        params["owned_units"] = [
            entry["unit"]
            for entry in (plan.get("placements") or []) + (plan.get("mps_daemons") or [])
            if isinstance(entry, dict) and entry.get("unit")
        ]
    elif layer == "amd":
        gpus = [g for g in plan.get("amd_partitions") or [] if isinstance(g, dict)]
        params["gpus"] = gpus
        params["owned_units"] = sorted(
            {str(unit) for gpu in gpus for unit in gpu.get("owned_units") or ()}
        )
    elif layer == "gpu":
        params["mps_gpus"] = sorted(
            {
                str(entry["gpu_address"])
                for entry in plan.get("mps_daemons") or []
                if isinstance(entry, dict) and entry.get("gpu_address")
            }
        )
    elif layer in ("mps", "units"):
        params["plan"] = plan
    return params


def replan(plan: dict, settings: dict, host, layer: str = "mig") -> dict:
    """The host's plan made again after the ``layer`` (mig or amd) changed the GPUs; raises
    LayerError.

    The GPUs are read again as numa_facts (gpu: true) reads them, with ``settings`` sysfs_root,
    procfs_root and gpu_snapshot; the planner is called as the numa_plan action calls it with
    ``settings`` numa (read again when empty), placements, tenants, policy, hugepages_extra and
    mig_gpus (numafleet_gpu_partitions, else numafleet_mig_gpus: the one partition list of both
    vendors), and
    ``plan`` as the recorded plan, so that placements keep their resources; its
    awaiting_restart is carried over. ``host`` is the host protocol (its load_pynvml is used).
    """
    from . import facts, planner

    runner = host_runner(host)

    def load_nvml():
        module = (getattr(host, "load_pynvml", None) or _no_nvml)()
        return (module, None) if module else (None, "nvidia-ml-py (import pynvml) is not installed")

    name = plan.get("host")
    what = "the AMD partition change" if layer == "amd" else "the MIG change"
    gather = {
        "sysfs_root": settings.get("sysfs_root") or "/sys",
        "procfs_root": settings.get("procfs_root") or "/proc",
        "gpu": True,
        "gpu_snapshot": settings.get("gpu_snapshot"),
        "nvidia_smi": "auto",
        "nvidia_smi_timeout": 30,
    }
    try:
        gathered, dummy = facts.gather_facts(
            gather, host.check_mode, runner, host.get_bin_path, load_nvml
        )
        recorded = planner.parse_recorded(
            name, {"state": "present", "plan": plan}, _UNITS_PLAN_PATH
        )
        new = planner.plan_host(
            name,
            settings.get("numa") or gathered["numa"],
            gathered["gpu_topology"],
            settings.get("placements") or [],
            settings.get("tenants") or [],
            settings.get("policy") or {},
            hugepages_extra=settings.get("hugepages_extra") or [],
            mig_gpus=settings.get("mig_gpus") or [],
            recorded=recorded,
            recorded_daemons=plan.get("mps_daemons"),
        )
    except NumaTuneError as exc:
        raise LayerError(
            f"host {name}: re-planning after {what} failed: {exc}; "
            f"{'the partition modes are' if layer == 'amd' else 'the MIG layout is'} "
            "applied: fix the input and run again"
        ) from None
    new["awaiting_restart"] = list(plan.get("awaiting_restart") or [])
    return new


def summary(plan: dict) -> str:
    """planner.plan_summary of ``plan`` (one line)."""
    from . import planner

    return planner.plan_summary(plan)
