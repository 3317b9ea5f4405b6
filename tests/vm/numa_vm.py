"""The 2-NUMA-node QEMU test bed: build a Debian bookworm guest image, boot it, stop it.

    python3 tests/vm/numa_vm.py deps                   install the Debian packages it needs
    python3 tests/vm/numa_vm.py build                  build the guest image, or reuse the cached one
    python3 tests/vm/numa_vm.py up --state DIR         build if needed, boot, wait for ssh (DIR/vm.json)
    python3 tests/vm/numa_vm.py down --state DIR       stop the guest that `up` started in DIR (its PID)
    python3 tests/vm/numa_vm.py ssh --state DIR -- CMD run CMD in the guest as root

The guest: QEMU q35, 4 vCPUs as 2 sockets x 2 cores, two 2 GiB RAM backends as NUMA nodes 0
(CPUs 0-1) and 1 (CPUs 2-3), distances 10/20, and an NVMe controller behind a pxb-pcie expander
bridge with numa_node=1, so its sysfs ``numa_node`` reads 1. ssh is forwarded from 127.0.0.1 only,
on a port chosen free at boot. The root disk is opened with ``snapshot=on``: every boot starts from
the same image and nothing the guest writes reaches the cache.

The image (kernel, initrd, raw ext4 root disk and an ssh key made for it) is built with
mmdebstrap (minbase) and ``mkfs.ext4 -d`` (no loop devices, no mounts) into
``$NUMAFLEET_VM_CACHE`` (default ``${XDG_CACHE_HOME:-~/.cache}/numafleet/vm``)/<hash>, where <hash>
is the SHA-256 of this script's build recipe (build code, customize hook, packages, suite, mirror,
disk size): changing the recipe rebuilds, anything else reuses the image.

Acceleration: TCG unless KVM is proven to run a guest. A KVM probe boots the kernel for a few
seconds and waits for its first console line; its answer is cached per host boot. Force a choice
with NUMAFLEET_VM_ACCEL=tcg|kvm.

Every failure exits 1 with one message (and, for a failed boot, the tail of the guest's serial
console). Needs root or passwordless sudo for apt-get, mmdebstrap and mkfs.ext4.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import hashlib
import inspect
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SUITE = "bookworm"
MIRROR = os.environ.get("NUMAFLEET_VM_MIRROR", "http://deb.debian.org/debian")
HOST_PACKAGES = ("qemu-system-x86", "qemu-utils", "mmdebstrap", "e2fsprogs", "openssh-client")
HOST_COMMANDS = ("qemu-system-x86_64", "mmdebstrap", "mkfs.ext4", "ssh", "ssh-keygen")
GUEST_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "udev",
    "dbus",
    "openssh-server",
    "python3",
    "numactl",
    "linux-image-amd64",
    "initramfs-tools",
    "iproute2",
    "procps",
    "kmod",
)
DISK_SIZE = "2G"
# Guest shape; tests read it from vm.json rather than repeating it.
NODES = ({"id": 0, "cpus": "0-1", "memory": "2G"}, {"id": 1, "cpus": "2-3", "memory": "2G"})
NVME_ADDRESS = "0000:81:00.0"  # bus_nr=128 on the expander bridge: root port 80:00.0, NVMe 81:00.0
NVME_NODE = 1
KERNEL_ARGS = "root=/dev/vda rw console=ttyS0 panic=-1 mitigations=off"
BOOT_TIMEOUT_S = 480  # NUMAFLEET_VM_BOOT_TIMEOUT overrides it
SERIAL_TAIL_LINES = 80

# Runs in the guest's root directory ($1) after the packages are installed.
_CUSTOMIZE = r"""
set -eu
root="$1"
echo numa-vm > "$root/etc/hostname"
printf '127.0.1.1 numa-vm\n' >> "$root/etc/hosts"
printf '/dev/vda / ext4 defaults,noatime 0 1\n' > "$root/etc/fstab"
install -d -m 0700 "$root/root/.ssh"
install -m 0600 "$NUMAFLEET_VM_PUBKEY" "$root/root/.ssh/authorized_keys"
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n' > "$root/etc/systemd/network/50-dhcp.network"
chroot "$root" systemctl enable systemd-networkd.service
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
        e2scrub_reap.service systemd-networkd-wait-online.service getty@tty1.service; do
    chroot "$root" systemctl mask "$unit"
done
printf 'UseDNS no\nPermitRootLogin prohibit-password\n' > "$root/etc/ssh/sshd_config.d/numafleet-vm.conf"
"""


class VmError(Exception):
    """A failure with a message for the user; main() prints it and exits 1."""


def log(message: str) -> None:
    print(f"numa_vm: {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    explicit = os.environ.get("NUMAFLEET_VM_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "numafleet" / "vm"


def recipe_hash() -> str:
    """SHA-256 (16 hex digits) of everything that decides the image's content, nothing else.

    The build code (its syntax tree: comments and layout do not count), the customize hook,
    suite, mirror, package list and disk size: editing them rebuilds; editing how the guest is
    booted reuses the image.
    """
    build_code = ast.dump(ast.parse(inspect.getsource(_build_into)))  # comments, layout: no effect
    recipe = [build_code, _CUSTOMIZE, SUITE, MIRROR, DISK_SIZE, *GUEST_PACKAGES]
    return hashlib.sha256("\0".join(recipe).encode()).hexdigest()[:16]


def image_dir() -> Path:
    return cache_root() / recipe_hash()


def _privileged() -> list:
    """argv prefix for commands that need root: none as root, else sudo -n."""
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") is None:
        raise VmError("not root and no sudo: run as root or with passwordless sudo")
    return ["sudo", "-n"]


def _run(argv: list, what: str, env: dict | None = None, log_file: Path | None = None) -> None:
    """Run argv; on failure raise VmError naming `what` with the output's tail."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            check=False,
        )
    except FileNotFoundError:
        raise VmError(
            f"{what}: command not found: {argv[0]} (run: python3 tests/vm/numa_vm.py deps)"
        ) from None
    if log_file is not None:
        with log_file.open("a") as handle:
            handle.write(f"$ {shlex.join(argv)}\n{proc.stdout}\n")
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise VmError(f"{what} failed (exit {proc.returncode}): {shlex.join(argv)}\n{tail}")
    log(f"{what}: {time.monotonic() - started:.0f} s")


def cmd_deps(_args) -> None:
    """Install the host packages when a command is missing; fail loudly when that is impossible."""
    missing = [name for name in HOST_COMMANDS if shutil.which(name) is None]
    if not missing:
        log("host packages present")
        return
    if shutil.which("apt-get") is None:
        raise VmError(
            f"missing {', '.join(missing)} and no apt-get to install "
            f"{' '.join(HOST_PACKAGES)}; install them by hand"
        )
    priv = _privileged()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run([*priv, "apt-get", "update", "-qq"], "apt-get update", env=env)
    _run(
        [*priv, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *HOST_PACKAGES],
        "apt-get install " + " ".join(HOST_PACKAGES),
        env=env,
    )
    still = [name for name in HOST_COMMANDS if shutil.which(name) is None]
    if still:
        raise VmError(f"still missing after apt-get install: {', '.join(still)}")


def build_image() -> Path:
    """The image directory (vmlinuz, initrd.img, rootfs.img, id_ed25519), built when missing."""
    final = image_dir()
    if (final / "complete").exists():
        return final
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "complete").exists():  # built by a concurrent run meanwhile
            return final
        _build_into(final)
    return final


def _build_into(final: Path) -> None:
    started = time.monotonic()
    priv = _privileged()
    work = final.parent / f"tmp-{final.name}-{os.getpid()}"
    if work.exists():
        _run([*priv, "rm", "-rf", str(work)], "remove a stale build folder")
    work.mkdir()
    build_log = work / "build.log"
    log(f"building the guest image in {final} (about 2 minutes; log: {final / 'build.log'})")
    _run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "numafleet-vm",
            "-f",
            str(work / "id_ed25519"),
        ],
        "ssh-keygen",
        log_file=build_log,
    )
    rootfs = work / "rootfs"
    hook = work / "customize.sh"
    hook.write_text(_CUSTOMIZE)
    env = dict(os.environ, NUMAFLEET_VM_PUBKEY=str(work / "id_ed25519.pub"))
    timings = {}
    t0 = time.monotonic()
    _run(
        [
            *priv,
            "env",
            f"NUMAFLEET_VM_PUBKEY={env['NUMAFLEET_VM_PUBKEY']}",
            "mmdebstrap",
            "--mode=root",
            "--variant=minbase",
            "--include=" + ",".join(GUEST_PACKAGES),
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            f'--customize-hook=sh {shlex.quote(str(hook))} "$1"',
            SUITE,
            str(rootfs),
            MIRROR,
        ],
        "mmdebstrap",
        log_file=build_log,
    )
    timings["mmdebstrap_s"] = round(time.monotonic() - t0, 1)
    kernels = sorted(rootfs.glob("boot/vmlinuz-*"))
    initrds = sorted(rootfs.glob("boot/initrd.img-*"))
    if len(kernels) != 1 or len(initrds) != 1:
        raise VmError(
            f"expected one kernel and one initrd in {rootfs}/boot, found {kernels} {initrds}"
        )
    _run([*priv, "cp", str(kernels[0]), str(work / "vmlinuz")], "copy the kernel")
    _run([*priv, "cp", str(initrds[0]), str(work / "initrd.img")], "copy the initrd")
    t0 = time.monotonic()
    _run(
        [
            *priv,
            "mkfs.ext4",
            "-q",
            "-F",
            "-L",
            "numavm",
            "-d",
            str(rootfs),
            str(work / "rootfs.img"),
            DISK_SIZE,
        ],
        "mkfs.ext4 -d",
        log_file=build_log,
    )
    timings["mkfs_s"] = round(time.monotonic() - t0, 1)
    _run([*priv, "rm", "-rf", str(rootfs)], "remove the staging root")
    if priv:
        _run([*priv, "chown", "-R", f"{os.getuid()}:{os.getgid()}", str(work)], "chown the image")
    meta = {
        "suite": SUITE,
        "mirror": MIRROR,
        "kernel": kernels[0].name.removeprefix("vmlinuz-"),
        "packages": list(GUEST_PACKAGES),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timings": {**timings, "total_s": round(time.monotonic() - started, 1)},
    }
    (work / "image.json").write_text(json.dumps(meta, indent=2) + "\n")
    (work / "complete").touch()
    if final.exists():
        shutil.rmtree(final)
    work.rename(final)
    log(f"image ready in {time.monotonic() - started:.0f} s: kernel {meta['kernel']}")


def cmd_build(_args) -> None:
    print(build_image())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def choose_accel(image: Path) -> str:
    """'kvm' only when a KVM guest was seen printing its first console line, else 'tcg'."""
    forced = os.environ.get("NUMAFLEET_VM_ACCEL")
    if forced:
        if forced not in ("tcg", "kvm"):
            raise VmError(f"NUMAFLEET_VM_ACCEL is {forced!r}; use tcg or kvm")
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    cached = cache_root() / f"kvm-probe-{_boot_id()}.json"
    if cached.exists():
        return json.loads(cached.read_text())["accel"]
    log("probing KVM: does a KVM guest print its first console line within 20 s?")
    probe = [
        "qemu-system-x86_64",
        "-accel",
        "kvm",
        "-machine",
        "q35",
        "-cpu",
        "host",
        "-m",
        "256M",
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
        "-serial",
        "stdio",
        "-kernel",
        str(image / "vmlinuz"),
        "-append",
        "console=ttyS0 earlyprintk=ttyS0 panic=-1",
    ]
    accel, why = "tcg", "no console line within 20 s (the guest hangs)"
    with subprocess.Popen(
        probe, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    ) as proc:
        os.set_blocking(proc.stdout.fileno(), False)
        seen = b""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            seen += proc.stdout.read() or b""
            if b"Linux version" in seen:
                accel, why = "kvm", "a KVM guest ran"
                break
            if proc.poll() is not None:
                first = seen.decode(errors="replace").strip().splitlines()[:1]
                why = f"QEMU exited with {proc.returncode}: {first[0] if first else 'no output'}"
                break
            time.sleep(0.5)
        proc.kill()
    log(f"KVM probe: {why}; using {accel.upper()}")
    cached.write_text(json.dumps({"accel": accel, "why": why, "boot_id": _boot_id()}) + "\n")
    return accel


def qemu_argv(image: Path, state: Path, port: int, accel: str, append: str) -> list:
    argv = [
        "qemu-system-x86_64",
        "-name",
        f"numafleet-vm,process=numafleet-vm-{port}",
        "-accel",
        accel,
        "-machine",
        "q35",
        "-cpu",
        "host" if accel == "kvm" else "max",
        "-smp",
        "4,sockets=2,cores=2,threads=1",
        "-m",
        "4G",
        "-nodefaults",
        "-vga",
        "none",
        "-display",
        "none",
        "-no-reboot",
        "-serial",
        f"file:{state / 'serial.log'}",
    ]
    for node in NODES:
        argv += [
            "-object",
            f"memory-backend-ram,id=m{node['id']},size={node['memory']}",
            "-numa",
            f"node,nodeid={node['id']},cpus={node['cpus']},memdev=m{node['id']}",
        ]
    argv += [
        "-numa",
        "dist,src=0,dst=1,val=20",
        "-kernel",
        str(image / "vmlinuz"),
        "-initrd",
        str(image / "initrd.img"),
        "-append",
        f"{KERNEL_ARGS} {append}".strip(),
        "-drive",
        f"file={image / 'rootfs.img'},if=none,id=root,format=raw,snapshot=on",
        "-device",
        "virtio-blk-pci,drive=root,bus=pcie.0",
        "-netdev",
        f"user,id=net0,hostfwd=tcp:127.0.0.1:{port}-:22",
        "-device",
        "virtio-net-pci,netdev=net0,bus=pcie.0",
        "-device",
        f"pxb-pcie,id=pxb1,bus_nr=128,numa_node={NVME_NODE},bus=pcie.0",
        "-device",
        "pcie-root-port,id=rp1,bus=pxb1,chassis=1,slot=1",
        "-blockdev",
        "driver=null-co,node-name=nvme0,size=1073741824,read-zeroes=on",
        "-device",
        "nvme,serial=numafleet0,drive=nvme0,bus=rp1",
    ]
    return argv


def _start_ticks(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks) of a live process, else None.

    A PID plus its start time names one process: a recycled PID has another start time. A zombie
    (state Z: ended, not yet reaped by its parent) counts as ended.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def ssh_argv(vm: dict, *command: str, connect_timeout: int = 30, quiet: bool = True) -> list:
    """ssh argv for root on the guest (key of the image, no host key kept)."""
    return [
        "ssh",
        *(["-q"] if quiet else []),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-i",
        vm["identity_file"],
        "-p",
        str(vm["port"]),
        "root@127.0.0.1",
        *command,
    ]


def serial_tail(state: Path) -> str:
    path = state / "serial.log"
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no serial console log at {path})"
    return f"--- last {SERIAL_TAIL_LINES} lines of {path} ---\n" + "\n".join(
        lines[-SERIAL_TAIL_LINES:]
    )


def boot_timeout_default() -> int:
    """NUMAFLEET_VM_BOOT_TIMEOUT (seconds, default 480), checked."""
    text = os.environ.get("NUMAFLEET_VM_BOOT_TIMEOUT", str(BOOT_TIMEOUT_S))
    if not text.isdigit() or int(text) < 1:
        raise VmError(
            f"NUMAFLEET_VM_BOOT_TIMEOUT is {text!r}; give a whole number of seconds, e.g. 480"
        )
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of seconds")
    return int(text)


def read_vm(state: Path) -> dict | None:
    """The guest recorded in STATE/vm.json, None when there is none; VmError when it is unreadable."""
    vm_file = state / "vm.json"
    if not vm_file.exists():
        return None
    try:
        vm = json.loads(vm_file.read_text())
        if not isinstance(vm, dict) or not isinstance(vm.get("pid"), int):
            raise ValueError("no PID in it")
    except (OSError, ValueError) as exc:
        raise VmError(
            f"{vm_file} is unreadable ({exc}); if no guest of yours runs, remove it and run up again"
        ) from None
    return vm


def _running(vm: dict) -> bool:
    """Whether vm's QEMU process still runs: the PID with the recorded start time."""
    return vm.get("start_ticks") is not None and _start_ticks(vm["pid"]) == vm["start_ticks"]


def cmd_up(args) -> None:
    state = Path(args.state).resolve()
    state.mkdir(parents=True, exist_ok=True)
    timeout_s = args.timeout if args.timeout is not None else boot_timeout_default()
    with (state / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise VmError(f"another up or down on {state} is running; wait for it") from None
        vm = read_vm(state)
        if vm is not None:
            if _running(vm):
                raise VmError(
                    f"a guest started from {state} is still running (PID {vm['pid']}); run down first"
                )
            (state / "vm.json").unlink()
        _boot(state, timeout_s, args.append)


def _boot(state: Path, timeout_s: int, append: str) -> None:
    vm_file = state / "vm.json"
    image = build_image()
    accel = choose_accel(image)
    port = _free_port()
    argv = qemu_argv(image, state, port, accel, append)
    (state / "serial.log").unlink(missing_ok=True)
    qemu_log = state / "qemu.log"
    started = time.monotonic()
    with qemu_log.open("w") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    vm = {
        "pid": proc.pid,
        "start_ticks": _start_ticks(proc.pid),
        "port": port,
        "address": "127.0.0.1",
        "user": "root",
        "identity_file": str(image / "id_ed25519"),
        "accel": accel,
        "image": str(image),
        "serial_log": str(state / "serial.log"),
        "argv": argv,
        "nodes": list(NODES),
        "nvme": {"address": NVME_ADDRESS, "node": NVME_NODE},
    }
    vm_file.write_text(json.dumps(vm, indent=2) + "\n")
    log(f"booting ({accel}) PID {proc.pid}, ssh on 127.0.0.1:{port}, timeout {timeout_s} s")
    deadline = started + timeout_s
    try:
        system_state = _wait_until_up(vm, proc, deadline, timeout_s, qemu_log)
    except BaseException:  # a failed boot, a timeout or Ctrl-C: never leave the guest behind
        _stop(vm)
        vm_file.unlink(missing_ok=True)
        raise
    ssh_s = vm.pop("_ssh_s")
    vm.update(boot_to_ssh_s=round(ssh_s, 1), boot_to_running_s=round(time.monotonic() - started, 1))
    vm_file.write_text(json.dumps(vm, indent=2) + "\n")
    log(
        f"guest up: ssh after {ssh_s:.0f} s, systemd {system_state} after {vm['boot_to_running_s']:.0f} s"
    )
    print(json.dumps({key: vm[key] for key in ("address", "port", "user", "identity_file", "pid")}))


def _wait_until_up(vm: dict, proc, deadline: float, timeout_s: int, qemu_log: Path) -> str:
    """Wait for ssh, then for systemd; the system state. VmError (with the console) on failure."""
    state = qemu_log.parent
    started = deadline - timeout_s
    timed_out = VmError(
        f"the guest did not come up on 127.0.0.1:{vm['port']} within {timeout_s} s "
        f"(--timeout or NUMAFLEET_VM_BOOT_TIMEOUT); stopped it\n{serial_tail(state)}"
    )
    while True:
        if proc.poll() is not None:
            raise VmError(
                f"QEMU exited with {proc.returncode} before ssh answered:\n"
                f"{qemu_log.read_text(errors='replace')[-2000:]}\n{serial_tail(state)}"
            )
        left = deadline - time.monotonic()
        if left <= 0:
            raise timed_out
        try:
            probe = subprocess.run(
                ssh_argv(vm, "true", connect_timeout=min(30, max(1, int(left)))),
                capture_output=True,
                check=False,
                timeout=left + 5,
            )
        except subprocess.TimeoutExpired:
            raise timed_out from None
        if probe.returncode == 0:
            break
        time.sleep(min(3, max(0, deadline - time.monotonic())))
    vm["_ssh_s"] = time.monotonic() - started
    try:
        ready = subprocess.run(
            ssh_argv(vm, "systemctl", "is-system-running", "--wait"),
            capture_output=True,
            text=True,
            check=False,
            timeout=max(60, deadline - time.monotonic()),
        )
    except subprocess.TimeoutExpired:
        raise timed_out from None
    system_state = ready.stdout.strip()
    if system_state not in ("running", "degraded"):
        raise VmError(
            f"the guest's systemd reports {system_state!r}; stopped it\n{serial_tail(state)}"
        )
    if system_state == "degraded":
        failed = subprocess.run(
            ssh_argv(vm, "systemctl", "--failed", "--no-legend", "--plain"),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        log(f"guest is degraded; failed units:\n{failed.stdout}")
    return system_state


def _stop(vm: dict) -> bool:
    """Stop the QEMU process of vm (only if PID and start time still match); True if it ran."""
    pid = vm["pid"]
    if not _running(vm):
        return False
    os.kill(pid, signal.SIGTERM)
    for dummy in range(100):
        if not _running(vm):
            return True
        time.sleep(0.1)
    if _running(vm):
        os.kill(pid, signal.SIGKILL)
    return True


def cmd_down(args) -> None:
    state = Path(args.state).resolve()
    vm = read_vm(state)
    if vm is None:
        log(f"no guest recorded in {state / 'vm.json'}; nothing to stop")
        return
    stopped = _stop(vm)
    (state / "vm.json").unlink()
    log(
        f"stopped PID {vm['pid']}"
        if stopped
        else f"PID {vm['pid']} is no longer the guest (it ended, or the PID was reused); nothing stopped"
    )


def cmd_ssh(args) -> None:
    state = Path(args.state).resolve()
    vm = read_vm(state)
    if vm is None:
        raise VmError(f"no guest recorded in {state / 'vm.json'}; run up first")
    if not _running(vm) or "identity_file" not in vm or "port" not in vm:
        raise VmError(
            f"the guest recorded in {state / 'vm.json'} is not running; run down, then up"
        )
    os.execvp("ssh", ssh_argv(vm, *args.command, quiet=False))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("deps", help="install qemu, mmdebstrap, e2fsprogs, ssh (apt-get)").set_defaults(
        func=cmd_deps
    )
    sub.add_parser(
        "build", help="build or reuse the cached guest image; prints its folder"
    ).set_defaults(func=cmd_build)
    up = sub.add_parser("up", help="boot the guest; writes STATE/vm.json")
    up.add_argument("--state", required=True, help="folder for vm.json, serial.log and qemu.log")
    up.add_argument(
        "--append",
        default="",
        help="extra kernel command line, e.g. 'hugepagesz=2M hugepages=1:64'",
    )
    up.add_argument(
        "--timeout",
        type=_positive,
        default=None,
        help="seconds to wait for ssh and systemd (default NUMAFLEET_VM_BOOT_TIMEOUT, else 480)",
    )
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="stop the guest started from STATE")
    down.add_argument("--state", required=True)
    down.set_defaults(func=cmd_down)
    ssh = sub.add_parser("ssh", help="run a command in the guest")
    ssh.add_argument("--state", required=True)
    ssh.add_argument("command", nargs=argparse.REMAINDER)
    ssh.set_defaults(func=cmd_ssh)
    args = parser.parse_args(argv)
    if args.cmd == "ssh" and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    try:
        args.func(args)
    except VmError as exc:
        log(str(exc))
        return 1
    except subprocess.TimeoutExpired as exc:
        log(f"timed out: {shlex.join(exc.cmd)}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
