"""Checks 4-5 of the GPU proof kit: processes started the way the rendered units start them.

Nothing here changes a GPU setting: CUDA programs run in user space, and the MPS control daemon
runs in a private pipe directory and is told to quit at the end. The compute-mode change of the
MPS drop-in's ExecStartPre= is reported, never run.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import platform
import re
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from gpu_proof import Check, Context, Skip, c_environment, kill_group, run_command
from proof_facts import host_facts, nvidia_entries

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import (
    locality,
    mps,
    planner,
    units,
)
from ansible_collections.numafleet.tuning.plugins.module_utils.numa.cpulist import (
    format_cpulist,
    parse_cpulist,
)

PLACEMENT = "gpu-proof"
MPS_PLACEMENT = "gpu-proof-mps"
MPS_THREADS_PCT = 25
MPS_PINNED_MIB = 2048
PIN_MIB = 256
CLIENT_WAIT_S = 120
MPS_CYCLES = 3  # start -> settings right away -> read back -> quit; the last one runs a client
MPS_EXIT_WAIT_S = 15
MADE_UP_UUID = "GPU-00000000-0000-0000-0000-000000000000"
# set_mempolicy(2) numbers and MPOL_BIND (linux/mempolicy.h), for what systemd's NUMAPolicy=bind
# with NUMAMask= does to a service.
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "s390x": 237}
MPOL_BIND = 2
MPS_NAMES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


# ---------------------------------------------------------------------------------------------
# Facts -> plan -> unit


def gpu_facts_or_skip(ctx: Context) -> tuple:
    """(numa facts, gpu facts) as proof_facts.host_facts gives them; Skip without GPU facts."""
    numa, facts = host_facts(ctx)
    if facts is None:
        raise Skip("no GPU facts: neither NVML nor nvidia-smi answered")
    return numa, facts


def pick_gpu(facts: dict) -> dict:
    """The first NVIDIA GPU with a UUID, outside MIG mode, that runs no process; Skip if none."""
    busy = []
    for entry in nvidia_entries(facts):
        if not entry.get("uuid") or (entry.get("mig") or {}).get("mode_current") == "enabled":
            continue
        if entry.get("processes"):
            busy.append(f"{entry['address']} (PIDs {entry['processes']})")
            continue
        return entry
    if busy:
        raise Skip(
            f"every usable GPU runs processes: {', '.join(busy)}; the kit starts no CUDA work "
            "beside them"
        )
    raise Skip("no NVIDIA GPU with a UUID outside MIG mode (the kit never changes MIG mode)")


def plan_placement(numa: dict, facts: dict, entry: dict, name: str, extra: dict) -> tuple:
    """(plan, placement) of one placement on ``entry``'s GPU, as numa_plan would plan it, on
    the CPUs this process may use (the others are given to the planner as reserved: a kit
    confined by a cpuset, as in a container, plans inside it)."""
    allowed = set(os.sched_getaffinity(0))
    every = {cpu for node in numa["nodes"] for cpu in node.get("cpus") or ()}
    usable = [n for n in numa["nodes"] if allowed & set(n.get("cpus") or ())]
    if entry["node"] is not None:
        usable = [n for n in usable if n["id"] == entry["node"]] or usable
    cpus = max(1, min(4, len(allowed & set(usable[0]["cpus"])) if usable else 1))
    wanted = {
        "name": name,
        "exec": "/bin/true",
        "gpus": [entry["address"]],
        "cpus": cpus,
        "memory": "1G",
    }
    wanted.update(extra)
    policy = {"reserved_cpus": sorted(every - allowed)}
    plan = planner.plan_host("gpu-proof", numa, facts, [wanted], [], policy)
    placement = next(p for p in plan["placements"] if p["name"] == name)
    return plan, placement


def rendered_service(plan: dict, placement: dict) -> str:
    files = units.render_files(plan, unit_dir="/etc/systemd/system")
    for path, text in files.items():
        if os.path.basename(path) == placement["unit"]:
            return text
    raise AssertionError(f"no unit {placement['unit']} among {sorted(files)}")


def unit_settings(text: str) -> dict:
    """{key: [values]} of a rendered unit's [Service] section; Environment= as {name: value}.

    Enough of systemd.syntax(7) for what the collection renders: one setting per line, double
    quoted Environment= words, ``%%`` for a literal ``%``.
    """
    settings: dict = {"Environment": {}}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section != "Service" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if key == "Environment":
            for word in shlex.split(value):
                name, dummy, val = word.partition("=")
                settings["Environment"][name] = val.replace("%%", "%")
        else:
            settings.setdefault(key, []).append(value)
    return settings


# ---------------------------------------------------------------------------------------------
# Starting a process as systemd would pin it


def _set_mempolicy(nodes: list) -> Optional[str]:
    """MPOL_BIND to ``nodes`` for the calling process; None, or why it could not be set."""
    number = SET_MEMPOLICY.get(platform.machine())
    if number is None:
        return f"set_mempolicy: no syscall number known for {platform.machine()}"
    bits = max(nodes) + 1 if nodes else 1
    words = (bits + 63) // 64
    mask = (ctypes.c_ulong * words)()
    for node in nodes:
        mask[node // 64] |= 1 << (node % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, MPOL_BIND, mask, ctypes.c_ulong(words * 64 + 1)) != 0:
        return f"set_mempolicy: {os.strerror(ctypes.get_errno())}"
    return None


def pinning(cpus: list, mems: list):
    """preexec_fn doing what CPUAffinity= and NUMAPolicy=bind + NUMAMask= do before exec."""

    def apply() -> None:
        os.sched_setaffinity(0, cpus)
        why = _set_mempolicy(mems) if mems else None
        if why:
            os.write(2, f"gpu-proof: {why}\n".encode())

    return apply


@dataclasses.dataclass
class Client:
    process: subprocess.Popen
    events: list
    stderr: object  # the temporary file its stderr goes to (a pipe could fill and stall it)

    def event(self, kind: str) -> Optional[dict]:
        return next((e for e in self.events if e.get("event") == kind), None)


def start_client(
    ctx: Context,
    mode: str,
    env: dict,
    cpus: Optional[list] = None,
    mems: Optional[list] = None,
    wait_for: str = "ready",
) -> Client:
    """Start the client in its own process group and read its JSON lines until ``wait_for``,
    an error, its exit, or the time it may take (CLIENT_WAIT_S, within the kit's budget)."""
    argv = [ctx.python, ctx.client, mode, str(PIN_MIB)]
    stderr = tempfile.TemporaryFile(mode="w+b")
    process = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
        preexec_fn=pinning(cpus, mems or []) if cpus else None,
        start_new_session=True,
    )
    client = Client(process, [], stderr)
    waited = time.monotonic()
    try:
        _read_events(client, ctx.left_s(CLIENT_WAIT_S), wait_for)
    except BaseException:  # stopped meanwhile: the client must not outlive the kit
        kill_group(process.pid)
        raise
    if not any(e.get("event") in (wait_for, "error") for e in client.events) and (
        process.poll() is None
    ):
        client.events.append({"event": "timeout", "waited_s": round(time.monotonic() - waited)})
    return client


def _read_events(client: Client, wait_s: float, wait_for: str) -> None:
    """Read the client's JSON lines (without blocking on a partial one) for up to ``wait_s``."""
    process = client.process
    deadline = time.monotonic() + wait_s
    pending = b""
    descriptor = process.stdout.fileno()
    while time.monotonic() < deadline:
        ready, dummy, dummy = select.select([descriptor], [], [], 0.5)
        if not ready:
            if process.poll() is not None:
                return
            continue
        chunk = os.read(descriptor, 65536)
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            try:
                client.events.append(json.loads(text))
            except ValueError:
                client.events.append({"event": "text", "text": text[:400]})
        if any(e.get("event") in (wait_for, "error") for e in client.events):
            return


def stop_client(client: Client, wait_s: float = 20) -> str:
    """End the client (a line on stdin; its process group killed when it has not exited within
    ``wait_s``); the last 4000 characters of its stderr."""
    process = client.process
    try:
        if process.poll() is None:
            process.stdin.write(b"exit\n")
            process.stdin.flush()
    except OSError:
        pass
    try:
        process.wait(timeout=max(wait_s, 1))
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.wait()
    kill_group(process.pid)  # anything the client left behind in its group
    for stream in (process.stdin, process.stdout):
        try:
            stream.close()
        except OSError:
            pass
    client.stderr.seek(0, os.SEEK_END)
    size = client.stderr.tell()
    client.stderr.seek(max(0, size - 4000))
    text = client.stderr.read().decode(errors="replace")
    client.stderr.close()
    return text


def buffer_mapping(procfs_root: str, pid: int, address: int, numa_maps: str) -> dict:
    """The /proc/<pid>/maps range holding ``address`` and its line of ``numa_maps`` (that
    process's /proc/<pid>/numa_maps text), read with the collection's numa_maps parser:
    {range, path, numa_maps, kb_by_node}."""
    found: dict = {"range": None, "path": None, "numa_maps": None, "kb_by_node": None}
    base = Path(procfs_root, str(pid))
    for line in (base / "maps").read_text().splitlines():
        fields = line.split()
        start, dummy, end = fields[0].partition("-")
        if int(start, 16) <= address < int(end, 16):
            found["range"] = fields[0]
            found["path"] = fields[5] if len(fields) > 5 else None
            break
    if found["range"] is None:
        return found
    start = found["range"].split("-")[0]
    for line in numa_maps.splitlines():
        if line.split(" ", 1)[0].lstrip("0") == start.lstrip("0"):
            found["numa_maps"] = line
            maps = locality.parse_numa_maps(line, f"{base}/numa_maps")
            nodes: dict = {}
            for table in (maps.anon_kb_by_node, maps.huge_kb_by_node, maps.file_kb_by_node):
                for node, kb in table.items():
                    nodes[node] = nodes.get(node, 0) + kb
            found["kb_by_node"] = {str(node): kb for node, kb in sorted(nodes.items())}
            break
    return found


def policies(numa_maps: str) -> dict:
    """{policy word of a /proc/<pid>/numa_maps text: mappings} ({"bind:0": 40, "default": 2})."""
    seen: dict = {}
    for line in numa_maps.splitlines():
        fields = line.split()
        if len(fields) > 1:
            seen[fields[1]] = seen.get(fields[1], 0) + 1
    return dict(sorted(seen.items()))


def off_node_share(maps, mems: list) -> Optional[float]:
    """locality.offnode_share of a process's anonymous and hugetlb pages, as verify judges it."""
    inside: dict = {}
    for table in (maps.anon_kb_by_node, maps.huge_kb_by_node):
        for node, kb in table.items():
            inside[node] = inside.get(node, 0) + kb
    share = locality.offnode_share(inside, mems)
    return None if share is None else round(share, 4)


# ---------------------------------------------------------------------------------------------
# Check 4


def check_cuda_visibility(ctx: Context, check: Check) -> None:
    """Check 4: plan a placement on the GPU, render its unit, start a CUDA process with that
    unit's environment and pinning, and see what it sees and where its memory lands."""
    numa, facts = gpu_facts_or_skip(ctx)
    entry = pick_gpu(facts)
    plan, placement = plan_placement(numa, facts, entry, PLACEMENT, {})
    cpus, mems = placement["cpus"], placement["mems"]
    check.add(
        "plan",
        [g.get("uuid") for g in placement["gpus"]] == [entry["uuid"]],
        {
            "node": placement.get("memory_node"),
            "cpus": cpus,
            "mems": mems,
            "gpus": placement["gpus"],
            "warnings": placement["warnings"],
        },
        expected=f"the placement gets {entry['address']}",
    )
    text = rendered_service(plan, placement)
    settings = unit_settings(text)
    env = settings["Environment"]
    ctx.write("cuda-client.txt", f"## rendered unit {placement['unit']}\n{text}\n")
    check.add(
        "unit_environment",
        env.get("CUDA_VISIBLE_DEVICES") == entry["uuid"]
        and env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
        and settings.get("CPUAffinity") == [format_cpulist(cpus)]
        and settings.get("NUMAMask") == [format_cpulist(mems)],
        {
            "Environment": env,
            "CPUAffinity": settings.get("CPUAffinity"),
            "NUMAPolicy": settings.get("NUMAPolicy"),
            "NUMAMask": settings.get("NUMAMask"),
        },
        expected={
            "CUDA_VISIBLE_DEVICES": entry["uuid"],
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CPUAffinity": format_cpulist(cpus),
            "NUMAMask": format_cpulist(mems),
        },
    )
    unit_cpus = parse_cpulist(settings["CPUAffinity"][0]) if settings.get("CPUAffinity") else cpus
    unit_mems = parse_cpulist(settings["NUMAMask"][0]) if settings.get("NUMAMask") else mems
    client = start_client(ctx, "hold", c_environment(env), unit_cpus, unit_mems)
    words = None
    try:
        words = _judge_client(ctx, check, client, entry, unit_cpus, unit_mems)
    finally:
        err = stop_client(client, ctx.left_s(20))
        ctx.append(
            "cuda-client.txt",
            "## client events\n"
            + "".join(json.dumps(e, sort_keys=True) + "\n" for e in client.events)
            + f"## client stderr\n{err}\n",
        )
    _policy_item(check, words, unit_mems, err)
    check.add(
        "client_exit",
        client.process.returncode == 0,
        {
            "rc": client.process.returncode,
            "stderr": [line for line in err.splitlines() if line.strip()][-5:],
        },
    )
    control = start_client(
        ctx,
        "count",
        c_environment({**env, "CUDA_VISIBLE_DEVICES": MADE_UP_UUID}),
        wait_for="devices",
    )
    stop_client(control, ctx.left_s(20))
    seen = control.event("devices")
    check.add(
        "uuid_selects",
        seen is not None and seen.get("count") == 0,
        {"CUDA_VISIBLE_DEVICES": MADE_UP_UUID, "devices": seen},
        expected="no device: CUDA honours the UUID form rather than ignoring it",
    )


def _judge_client(
    ctx: Context, check: Check, client: Client, entry: dict, cpus: list, mems: list
) -> Optional[dict]:
    """Items of what the client saw and where its memory is; the policies of its mappings."""
    seen, ready = client.event("devices"), client.event("ready")
    error = client.event("error")
    devices = (seen or {}).get("devices") or []
    check.add(
        "visible_device",
        len(devices) == 1 and devices[0].get("uuid") == entry["uuid"],
        {
            "count": (seen or {}).get("count"),
            "devices": devices,
            "error": error,
            "framework": (seen or {}).get("framework"),
            "version": (seen or {}).get("version"),
        },
        expected=f"exactly {entry['uuid']}",
    )
    if devices and devices[0].get("address"):
        check.add(
            "device_address",
            devices[0]["address"] == entry["address"],
            devices[0]["address"],
            expected=entry["address"],
        )
    if ready is None:
        check.add(
            "pinned_buffer_node",
            False,
            {"events": client.events},
            expected="the client pinned its buffer and said ready",
        )
        return None
    pid = ready["pid"]
    base = Path(ctx.procfs_root, str(pid))
    status_text = _read(base / "status")
    if status_text is None:
        check.add("cpu_affinity", False, "the client exited before it was read")
        return None
    status = locality.parse_status(status_text, str(base / "status"))
    check.add(
        "cpu_affinity",
        list(status.cpus_allowed) == list(cpus) and ready.get("cpus_allowed") == list(cpus),
        {
            "Cpus_allowed_list": list(status.cpus_allowed),
            "sched_getaffinity": ready.get("cpus_allowed"),
        },
        expected=cpus,
    )
    if not (base / "numa_maps").exists():
        why = "this kernel has no /proc/<pid>/numa_maps (no CONFIG_NUMA, or a sandbox): "
        for name in ("pinned_buffer_node", "process_memory"):
            check.add(name, None, None, note=why + "it cannot tell where memory is")
        return None
    numa_maps = _read(base / "numa_maps")
    if numa_maps is None:
        check.add("process_memory", False, "the client exited before it was read")
        return None
    maps = locality.parse_numa_maps(numa_maps, str(base / "numa_maps"))
    words = policies(numa_maps)
    mapping = buffer_mapping(ctx.procfs_root, pid, int(ready["buffer_address"]), numa_maps)
    mapping.update(allocator=ready.get("allocator"), bytes=ready.get("buffer_bytes"))
    nodes = {int(node) for node in (mapping["kb_by_node"] or {})}
    if mapping["numa_maps"] is None:
        check.add(
            "pinned_buffer_node",
            None,
            mapping,
            note="the buffer's mapping is not in numa_maps: the kernel cannot tell its node",
        )
    elif not nodes:
        check.add(
            "pinned_buffer_node",
            None,
            mapping,
            note="numa_maps lists the buffer's mapping without per-node pages (a driver "
            "mapping): this machine cannot tell its node",
        )
    else:
        check.add("pinned_buffer_node", nodes <= set(mems), mapping, expected=f"nodes {mems}")
    share = off_node_share(maps, mems)
    check.add(
        "process_memory",
        share is not None and share <= 0.02,
        {
            "anon_kb_by_node": maps.anon_kb_by_node,
            "huge_kb_by_node": maps.huge_kb_by_node,
            "off_node_share": share,
        },
        expected="at most 2% of anonymous + hugetlb memory off the planned nodes",
    )
    return words


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _policy_item(check: Check, words: Optional[dict], mems: list, stderr: str) -> None:
    """Whether the client's mappings carry the memory policy NUMAPolicy=bind + NUMAMask= set."""
    bound = f"bind:{format_cpulist(mems)}"
    refused = [line for line in stderr.splitlines() if line.startswith("gpu-proof: set_mempolicy")]
    if refused:
        check.add("memory_policy", None, refused, note="the kernel refused set_mempolicy(2)")
    elif words is None:
        check.add("memory_policy", None, None, note="no numa_maps to read the policy from")
    else:
        check.add("memory_policy", bound in words, words, expected=f"mappings with {bound}")


# ---------------------------------------------------------------------------------------------
# Check 5


def mps_processes(procfs_root: str, pipe_dir: Optional[str] = None) -> dict:
    """{pid: argv0 basename} of the MPS control daemons and servers running now; with
    ``pipe_dir``, only those whose environment names that CUDA_MPS_PIPE_DIRECTORY (the kit's
    own: it never touches another daemon)."""
    found = {}
    wanted = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode() if pipe_dir else None
    for entry in Path(procfs_root).iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
            name = os.path.basename(argv0)
            if name not in MPS_NAMES:
                continue
            if wanted is not None and wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        found[int(entry.name)] = name
    return found


_POST = re.compile(
    r"echo (set_default_active_thread_percentage \d+|set_default_device_pinned_mem_limit 0 \d+M)"
    r" \| (?P<control>/\S+)"
)


def allowed_exec(value: str, control: str, kind: str) -> Optional[list]:
    """argv of an Exec*= line of the rendered MPS units when it is one the kit may run: the
    control daemon's start, quit or a set_default_* command; None for anything else."""
    argv = _exec_argv(value)
    if kind == "ExecStart":
        return argv if argv == [control, "-d"] else None
    if len(argv) != 3 or argv[:2] != [mps.SHELL, "-c"]:
        return None
    if kind == "ExecStop":
        return argv if argv[2] == f"echo quit | {control}" else None
    match = _POST.fullmatch(argv[2])
    return argv if match and match["control"] == control else None


def _exec_argv(value: str) -> list:
    """argv of an Exec*= value the collection renders (a leading + or - prefix dropped)."""
    return shlex.split(value.lstrip("+-"))


def _mps_setup(ctx: Context, check: Check) -> tuple:
    numa, facts = gpu_facts_or_skip(ctx)
    entry = pick_gpu(facts)
    control = ctx.which("nvidia-cuda-mps-control")
    if control is None:
        raise Skip("nvidia-cuda-mps-control is not in PATH")
    if entry.get("compute_mode") in ("prohibited", "exclusive_thread"):
        raise Skip(f"the GPU's compute mode is {entry['compute_mode']} (left as it is)")
    running = mps_processes(ctx.procfs_root)
    if running:
        raise Skip(f"an MPS daemon already runs here ({running}); left alone")
    plan, placement = plan_placement(
        numa,
        facts,
        entry,
        MPS_PLACEMENT,
        {
            "mps": {
                "active_thread_percentage": MPS_THREADS_PCT,
                "pinned_memory_limit": f"{MPS_PINNED_MIB}M",
            }
        },
    )
    daemons, warnings = mps.plan_daemons(plan)
    check.add(
        "plan",
        len(daemons) == 1 and not warnings,
        {
            "daemons": [d.as_dict() for d in daemons],
            "warnings": warnings,
            "client_environment": placement["environment"],
        },
    )
    if len(daemons) != 1:
        raise Skip("the plan has no MPS daemon to run")
    header = units.header_lines(units.DEFAULT_HEADER)
    smi = ctx.which("nvidia-smi") or mps.DEFAULT_NVIDIA_SMI
    template = mps.render_template(header, control)
    dropin = mps.render_dropin(daemons[0], header, control, smi)
    ctx.write(
        "mps-transcript.txt",
        f"## nvidia-mps@.service\n{template}\n## drop-in of {daemons[0].unit}\n{dropin}\n",
    )
    return entry, placement, daemons[0], control, template, dropin


def check_mps(ctx: Context, check: Check) -> None:
    """Check 5: MPS daemon as the rendered template + drop-in run it, in a private pipe dir."""
    entry, placement, daemon, control, template, dropin = _mps_setup(ctx, check)
    base = unit_settings(template)
    extra = unit_settings(dropin)
    check.add(
        "compute_mode_untouched",
        None,
        extra.get("ExecStartPre"),
        note="ExecStartPre= sets EXCLUSIVE_PROCESS and ExecStopPost= DEFAULT; the kit "
        "never changes a compute mode, so MPS ran in the GPU's current mode "
        f"({entry.get('compute_mode')})",
    )
    lines = {
        "start": allowed_exec(base["ExecStart"][0], control, "ExecStart"),
        "stop": allowed_exec(base["ExecStop"][0], control, "ExecStop"),
        "post": [allowed_exec(v, control, "ExecStartPost") for v in extra.get("ExecStartPost", [])],
    }
    refused = None in (lines["start"], lines["stop"], *lines["post"])
    check.add(
        "rendered_commands",
        not refused,
        {
            "ExecStart": base["ExecStart"],
            "ExecStop": base["ExecStop"],
            "ExecStartPost": extra.get("ExecStartPost"),
        },
        expected="only the control daemon's -d, quit and set_default_* commands (the kit runs "
        "no other line of the units)",
    )
    if refused:
        return
    top = Path(tempfile.mkdtemp(prefix="numafleet-mps-"))
    pipe, log = top / "pipe", top / "log"
    pipe.mkdir(mode=0o700)
    log.mkdir(mode=0o700)
    env = {
        name: value.replace("%i", daemon.instance) for name, value in base["Environment"].items()
    }
    env.update(CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(log))
    daemon_env = c_environment(env)
    private = dataclasses.replace(daemon, pipe_dir=str(pipe), log_dir=str(log))

    def runner(argv, stdin, environment):
        return ctx.run(
            argv, stdin=stdin, env=c_environment({**env, **(environment or {})}), cap_s=30
        )

    cycles = []
    try:
        for number in range(1, MPS_CYCLES + 1):
            cycles.append(
                _mps_cycle(
                    ctx,
                    check,
                    number,
                    lines,
                    daemon_env,
                    runner,
                    private,
                    control,
                    placement,
                    entry,
                )
            )
    finally:
        leftover = mps_processes(ctx.procfs_root, str(pipe))
        for pid in leftover:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _wait_gone(ctx.procfs_root, str(pipe), 5)
        logs = "".join(
            f"## {path.name}\n{path.read_text(errors='replace')[-4000:]}\n"
            for path in sorted(log.glob("*"))
            if path.is_file()
        )
        ctx.append("mps-transcript.txt", "## cycles\n" + json.dumps(cycles, indent=1) + f"\n{logs}")
        shutil.rmtree(top, ignore_errors=True)
    check.add(
        "nothing_left_running",
        not leftover,
        leftover,
        expected="no MPS control daemon or server of the kit's left after quit",
    )
    posts = [post for cycle in cycles for post in cycle.get("post", [])]
    check.add(
        "settings_right_after_start",
        bool(posts)
        and all(post["rc"] == 0 for post in posts)
        and all(cycle.get("read_back") == cycle.get("planned") for cycle in cycles),
        [{"post": c.get("post"), "read_back": c.get("read_back")} for c in cycles],
        expected=f"every ExecStartPost= command accepted at once, in all {MPS_CYCLES} starts",
        note="ExecStartPost= runs as soon as 'nvidia-cuda-mps-control -d' returns (Type=forking)",
    )


def _mps_cycle(ctx, check, number, lines, daemon_env, runner, private, control, placement, entry):
    cycle: dict = {"cycle": number}
    pipe = private.pipe_dir
    started = time.monotonic()
    # With the drop-in's CPUAffinity= and NUMAPolicy=bind + NUMAMask= applied first, as systemd
    # would; always a real process (no test runner stands in for the daemon's start).
    rc, out, err = run_command(
        lines["start"],
        env=daemon_env,
        timeout_s=ctx.left_s(30),
        preexec=pinning(list(private.cpus), list(private.mems)) if private.cpus else None,
    )
    cycle["start"] = {
        "rc": rc,
        "seconds": round(time.monotonic() - started, 3),
        "output": (out + err).strip()[:400],
    }
    if rc != 0:
        check.add(f"cycle{number}.start", False, cycle["start"])
        return cycle
    cycle["post"] = []
    for argv in lines["post"]:
        rc, out, err = ctx.run(argv, env=daemon_env, cap_s=30)
        cycle["post"].append(
            {
                "command": argv[2],
                "rc": rc,
                "after_s": round(time.monotonic() - started, 3),
                "output": (out + err).strip()[:400],
            }
        )
    found = mps.read_settings(runner, control, private)
    cycle["planned"] = {s.name: s.planned for s in found}
    cycle["read_back"] = {s.name: s.running for s in found}
    if number == MPS_CYCLES:
        _mps_client(ctx, check, control, runner, private, placement, entry, cycle)
    stopped = time.monotonic()
    rc, out, err = ctx.run(lines["stop"], env=daemon_env, cap_s=30)
    cycle["stop"] = {"rc": rc, "output": (out + err).strip()[:400]}
    _wait_gone(ctx.procfs_root, pipe, ctx.left_s(MPS_EXIT_WAIT_S))
    cycle["stop"]["gone_after_s"] = round(time.monotonic() - stopped, 3)
    return cycle


def _wait_gone(procfs_root: str, pipe_dir: str, wait_s: float) -> None:
    """Wait up to ``wait_s`` until no MPS process of the kit's pipe directory is left."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and mps_processes(procfs_root, pipe_dir):
        time.sleep(0.1)


def _mps_client(ctx, check, control, runner, private, placement, entry, cycle) -> None:
    env = dict(placement["environment"])
    env["CUDA_MPS_PIPE_DIRECTORY"] = private.pipe_dir
    client = start_client(ctx, "hold", c_environment(env))
    try:
        seen, ready = client.event("devices"), client.event("ready")
        devices = (seen or {}).get("devices") or []
        rc, out, err = runner([control], "get_server_list\n", {})
        servers = [int(word) for word in out.split() if word.isdigit()]
        smi = ctx.which("nvidia-smi")
        apps = ""
        if smi:
            dummy, apps, dummy = ctx.run(
                [smi, "--query-compute-apps=pid,process_name", "--format=csv,noheader"], cap_s=30
            )
        listed = [
            int(line.split(",")[0])
            for line in apps.splitlines()
            if line.split(",")[0].strip().isdigit()
        ]
        cycle["client"] = {
            "events": client.events,
            "server_list": out.strip(),
            "compute_apps": apps.strip(),
        }
        check.add(
            "client_through_mps",
            ready is not None and len(devices) == 1 and devices[0].get("uuid") == entry["uuid"],
            {"devices": devices, "error": client.event("error")},
            expected=f"the client runs on {entry['uuid']} through the daemon",
        )
        check.add(
            "server_in_nvidia_smi",
            bool(servers) and set(servers) <= set(listed),
            {"get_server_list": servers, "compute_apps": apps.strip().splitlines()},
            expected="the MPS server the daemon started is a compute process of the GPU",
        )
        # Under an MPS pinned-memory limit cudaMemGetInfo keeps the GPU's whole memory as total
        # and reports at most the limit as free (seen on an H200, driver 580.159.04).
        free = devices[0].get("memory_free_bytes") if devices else None
        limit = MPS_PINNED_MIB << 20
        check.add(
            "pinned_limit_seen_by_client",
            free is not None and free <= limit,
            {
                "memory_free_bytes": free,
                "memory_total_bytes": devices[0].get("memory_total_bytes") if devices else None,
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
            },
            expected=f"cudaMemGetInfo free at most {MPS_PINNED_MIB} MiB",
        )
    finally:
        cycle["client_stderr"] = stop_client(client, ctx.left_s(20))[-2000:]
