"""GPU proof kit: prove the collection's NVIDIA code paths on a real NVIDIA GPU host.

    tests/gpu/run.sh [OUT_DIR]              # what operators and CI-less sessions run
    python3 tests/gpu/gpu_proof.py --out DIR [--budget-s 420]

Five checks, each a list of named items with the values observed (README.md beside this file):

1. ``nvml_facts``: the facts reader (``gpu.read_gpu_state`` + ``read_gpu_topology``) on the real
   NVML, against sysfs;
2. ``nvidia_smi_xml``: the real ``nvidia-smi -q -x`` through ``gpu_smi``, field by field against
   NVML;
3. ``mig_listings``: ``nvidia-smi mig -lgip`` / ``-lgipp`` and the planner's MIG inputs;
4. ``cuda_visibility``: a CUDA process started with the pinning and environment the rendered unit
   of a planned placement gives it sees exactly its GPU; its pinned host buffer's node;
5. ``mps``: an MPS control daemon in a private pipe directory, set up by the rendered
   ``ExecStartPost=`` lines, read back, used by a CUDA client, then quit.

Nothing here changes GPU settings: no MIG mode, GPU/compute instance, compute mode, persistence,
clocks, power or reset (the MPS drop-in's compute-mode ``ExecStartPre=`` is reported, never run).

Output in ``--out``: ``gpu-proof.json`` (every item), ``gpu-proof.md`` (summary) and the raw
outputs (``nvidia-smi-q-x.xml``, ``nvidia-smi-mig.txt``, ``nvml-snapshot.json``,
``cuda-client.txt``, ``mps-transcript.txt``). The JSON is rewritten after every check, so a run
stopped by its caller still leaves what it had. Exit status: 0 when no item failed (a host
without an NVIDIA driver skips every check), 1 when one did, 2 when the kit itself broke.

Standard library only, plus what the host has (nvidia-ml-py, PyTorch or CuPy); the collection's
module_utils are imported from this checkout, without Ansible.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

KIT_VERSION = 1
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PASS, FAIL, SKIPPED = "pass", "fail", "skipped"
JSON_NAME, SUMMARY_NAME = "gpu-proof.json", "gpu-proof.md"
# Every file a run writes into the evidence directory (a new run removes the old ones first).
EVIDENCE = (
    JSON_NAME,
    SUMMARY_NAME,
    "nvml-snapshot.json",
    "nvidia-smi-q-x.xml",
    "nvidia-smi-mig.txt",
    "cuda-client.txt",
    "mps-transcript.txt",
)
NO_DRIVER = "no NVIDIA driver"
DEFAULT_BUDGET_S = 420
# Where driver containers and CUDA images keep the NVIDIA tools when PATH does not name them.
DRIVER_DIRS = ("/usr/local/nvidia/bin", "/usr/local/cuda/bin", "/usr/bin", "/usr/sbin")


def import_collection(repo: Path = REPO) -> None:
    """Make ``ansible_collections.numafleet.tuning`` importable from ``repo`` (no Ansible needed).

    Uses the checkout's ``.collections`` link when ``make setup`` made it, else a link in a
    temporary directory (the checkout is not written to).
    """
    try:
        import ansible_collections.numafleet.tuning.plugins.module_utils.numa.gpu  # noqa: F401
    except ImportError:
        pass
    else:
        return
    made = repo / ".collections"
    if (made / "ansible_collections" / "numafleet" / "tuning" / "plugins").is_dir():
        sys.path.insert(0, str(made))
        return
    top = Path(tempfile.mkdtemp(prefix="numafleet-gpu-proof-"))
    atexit.register(shutil.rmtree, top, True)
    (top / "ansible_collections" / "numafleet").mkdir(parents=True)
    (top / "ansible_collections" / "numafleet" / "tuning").symlink_to(repo)
    sys.path.insert(0, str(top))


# ---------------------------------------------------------------------------------------------
# Results


# The AMD section runs whether or not an NVIDIA driver is here (it skips itself without AMD GPUs).
AMD_CHECK = "amd_facts"


@dataclass
class Item:
    """One named pass/fail/skipped finding with what was observed and what was expected."""

    name: str
    status: str
    observed: object = None
    expected: object = None
    note: str = ""

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "observed": self.observed,
            "expected": self.expected,
            "note": self.note,
        }


@dataclass
class Check:
    """One of the checks: its items, or why it was skipped or broke."""

    id: str
    title: str
    items: list = field(default_factory=list)
    skipped: Optional[str] = None
    error: Optional[str] = None
    seconds: float = 0.0

    def add(self, name: str, ok, observed=None, expected=None, note: str = "") -> Item:
        """Append an item; ``ok`` True -> pass, False -> fail, None -> skipped."""
        status = SKIPPED if ok is None else PASS if ok else FAIL
        item = Item(name, status, observed, expected, note)
        self.items.append(item)
        return item

    @property
    def status(self) -> str:
        if self.error is not None or any(item.status == FAIL for item in self.items):
            return FAIL
        if self.skipped is not None or all(item.status == SKIPPED for item in self.items):
            return SKIPPED
        return PASS

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "skipped": self.skipped,
            "error": self.error,
            "seconds": round(self.seconds, 2),
            "items": [item.as_dict() for item in self.items],
        }


class Skip(Exception):
    """Raised by a check that cannot run here; the message says why."""


# ---------------------------------------------------------------------------------------------
# What the checks share


def run_command(
    argv: list,
    stdin: Optional[str] = None,
    env: Optional[dict] = None,
    timeout_s: float = 60,
    preexec: Optional[Callable] = None,
) -> tuple:
    """(rc, stdout, stderr) of ``argv``; rc 124 when it ran past ``timeout_s`` (its whole process
    group is killed then), 127 when it cannot be started. ``preexec`` runs in the child before
    exec (the pinning systemd would apply)."""
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            errors="replace",
            start_new_session=True,
            preexec_fn=preexec,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, "", f"{argv[0]}: {exc.strerror or exc}"
    try:
        out, err = process.communicate(stdin, timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        out, err = process.communicate()
        return 124, out or "", f"timed out after {timeout_s:.0f} s\n{err or ''}"
    return process.returncode, out, err


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (what the kit started with start_new_session)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def c_environment(extra: Optional[dict] = None) -> dict:
    """The kit's environment without CUDA_* and MPS variables, C locale, plus ``extra``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CUDA_", "NVIDIA_VISIBLE")) and key not in ("LANGUAGE",)
    }
    env.update({"LC_ALL": "C", "LANG": "C"})
    env.update(extra or {})
    return env


def find_tool(name: str) -> Optional[str]:
    """``name`` in PATH, else in one of DRIVER_DIRS; None when it is nowhere."""
    found = shutil.which(name)
    if found is None:
        for directory in DRIVER_DIRS:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return found


@dataclass
class Context:
    """Inputs and shared results of one run; tests build one over fakes and fixture trees."""

    out: Path
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    which: Callable = find_tool
    runner: Callable = run_command
    nvml: object = None  # the pynvml module, or a pynvml-like fake
    nvml_reason: Optional[str] = None
    python: str = sys.executable
    client: str = str(HERE / "cuda_client.py")
    deadline: float = 0.0
    driver: Optional[str] = None  # why there is no NVIDIA driver, None when there is one
    driver_problem: Optional[str] = None  # a driver or GPU is there but does not answer
    listing: Optional[dict] = None  # nvidia-smi -L when it was run
    # Filled by the checks for the later ones.
    nvml_state: object = None
    smi_state: object = None
    gpu_facts: Optional[dict] = None
    numa_facts: Optional[dict] = None
    files: dict = field(default_factory=dict)

    def left_s(self, cap: float) -> float:
        """Seconds a step may take: ``cap``, or what is left of the budget (at least 1)."""
        if not self.deadline:
            return cap
        return max(1.0, min(cap, self.deadline - time.monotonic()))

    def run(
        self, argv: list, stdin: Optional[str] = None, env: Optional[dict] = None, cap_s: float = 60
    ) -> tuple:
        return self.runner(
            argv, stdin, env if env is not None else c_environment(), self.left_s(cap_s)
        )

    def write(self, name: str, text: str) -> str:
        """Write one raw output file into the out directory; its path."""
        path = self.out / name
        path.write_text(text, encoding="utf-8")
        self.files[name] = str(path)
        return str(path)

    def append(self, name: str, text: str) -> None:
        path = self.out / name
        with path.open("a", encoding="utf-8") as handle:
            handle.write(text)
        self.files[name] = str(path)


def load_pynvml() -> tuple:
    """(pynvml, None) or (None, why not): nvidia-ml-py's module, never the deprecated package."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as exc:
        return None, f"nvidia-ml-py is not installed ({exc})"
    return pynvml, None


def nvidia_present(ctx: Context) -> list:
    """Signs that this host has an NVIDIA driver or GPU: /proc/driver/nvidia, a PCI device of
    vendor 0x10de, an nvidia-smi binary."""
    signs = []
    if Path(ctx.procfs_root, "driver", "nvidia").exists():
        signs.append(f"{ctx.procfs_root}/driver/nvidia exists")
    for vendor in sorted(Path(ctx.sysfs_root, "bus", "pci", "devices").glob("*/vendor")):
        try:
            if vendor.read_text().strip().lower() == "0x10de":
                signs.append(f"NVIDIA PCI device {vendor.parent.name}")
                break
        except OSError:
            continue
    smi = ctx.which("nvidia-smi")
    if smi:
        signs.append(f"nvidia-smi at {smi}")
    return signs


def driver_absent(ctx: Context) -> Optional[str]:
    """Why this host has no NVIDIA driver, or None when NVML or nvidia-smi answers, or when
    there are signs of a driver or GPU that does not answer (then the checks run and fail, as a
    broken driver is what a bug report is for). ``nvidia-smi -L`` is kept in ctx.listing."""
    reasons, listed = [], False
    smi = ctx.which("nvidia-smi")
    if smi is None:
        reasons.append("nvidia-smi is not in PATH")
    else:
        rc, out, err = ctx.run([smi, "-L"], cap_s=30)
        ctx.listing = {"rc": rc, "stdout": out[-2000:], "stderr": err[-2000:]}
        listed = rc == 0 and "GPU " in out
        if not listed:
            first = (err or out).strip().splitlines()
            reasons.append(f"nvidia-smi -L exited {rc}: {first[0] if first else 'no output'}")
    if ctx.nvml is not None:
        try:
            ctx.nvml.nvmlInit()
        except Exception as exc:
            reasons.append(f"nvmlInit: {exc}")
        else:
            try:
                ctx.nvml.nvmlShutdown()
            except Exception:
                pass
            return None
    else:
        reasons.append(ctx.nvml_reason or "nvidia-ml-py is not installed")
    if listed:
        return None
    signs = nvidia_present(ctx)
    if signs:
        ctx.driver_problem = f"{'; '.join(reasons)} although there are {', '.join(signs)}"
        return None
    return f"{NO_DRIVER} ({'; '.join(reasons)})"


def collection_identity(ctx: Context) -> dict:
    """Which collection code this run tested: galaxy.yml's version, the checkout's commit (and
    whether it had changes), and where module_utils was imported from."""
    from ansible_collections.numafleet.tuning.plugins.module_utils import numa

    root = Path(numa.__file__).resolve().parents[3]
    version = None
    galaxy = root / "galaxy.yml"
    if galaxy.is_file():
        for line in galaxy.read_text().splitlines():
            if line.startswith("version:"):
                version = line.split(":", 1)[1].strip().strip("\"'")
    commit = changed = None
    git = shutil.which("git")
    if git and (root / ".git").exists():
        rc, out, dummy = ctx.run([git, "-C", str(root), "rev-parse", "HEAD"], cap_s=10)
        commit = out.strip() if rc == 0 else None
        rc, out, dummy = ctx.run([git, "-C", str(root), "status", "--porcelain"], cap_s=10)
        changed = bool(out.strip()) if rc == 0 else None
    return {
        "version": version,
        "commit": commit,
        "uncommitted_changes": changed,
        "module_utils": str(root / "plugins" / "module_utils" / "numa"),
    }


def host_info(ctx: Context) -> dict:
    info = {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpus_allowed": sorted(os.sched_getaffinity(0)),
        "uid": os.getuid(),
        "root": os.geteuid() == 0,
        "collection": collection_identity(ctx),
        "nvidia_smi_L": ctx.listing,
        "numa_nodes": sorted(
            entry.name for entry in Path(ctx.sysfs_root, "devices/system/node").glob("node[0-9]*")
        ),
        "pid1": Path(ctx.procfs_root, "1/comm").read_text(errors="replace").strip()
        if Path(ctx.procfs_root, "1/comm").is_file()
        else None,
        "tools": {
            name: ctx.which(name)
            for name in ("nvidia-smi", "nvidia-cuda-mps-control", "systemctl", "numactl", "perf")
        },
    }
    for module in ("pynvml", "torch", "cupy"):
        try:
            from importlib import metadata

            dist = {"pynvml": "nvidia-ml-py", "torch": "torch", "cupy": None}[module]
            if dist is None:
                names = [
                    d.metadata["Name"]
                    for d in metadata.distributions()
                    if (d.metadata["Name"] or "").startswith("cupy")
                ]
                dist = names[0] if names else "cupy"
            info[f"{module}_version"] = metadata.version(dist)
        except Exception:
            info[f"{module}_version"] = None
    return info


# ---------------------------------------------------------------------------------------------
# The run


def all_checks() -> list:
    """(id, title, function) of the checks, in the order they run."""
    import proof_amd
    import proof_facts
    import proof_runtime

    return [
        ("nvml_facts", "NVML facts through the facts reader", proof_facts.check_nvml),
        (
            "nvidia_smi_xml",
            "nvidia-smi -q -x through the parser, against NVML",
            proof_facts.check_smi_xml,
        ),
        (
            "mig_listings",
            "nvidia-smi mig -lgip/-lgipp and the planner's MIG inputs",
            proof_facts.check_mig_listings,
        ),
        (
            "cuda_visibility",
            "a CUDA process under a planned unit's pinning and environment",
            proof_runtime.check_cuda_visibility,
        ),
        (
            "mps",
            "MPS control daemon set up as the rendered drop-in does, used, quit",
            proof_runtime.check_mps,
        ),
        (
            AMD_CHECK,
            "AMD Instinct facts (sysfs, KFD, amdsmi) against rocminfo and amd-smi",
            proof_amd.check_amd_facts,
        ),
    ]


def run_checks(ctx: Context, checks: list, report: Callable) -> list:
    """Run ``checks`` in order; each result is reported as soon as it is known."""
    results = []
    stopped = False
    for check_id, title, function in checks:
        check = Check(check_id, title)
        started = time.monotonic()
        if ctx.driver is not None and check_id != AMD_CHECK:
            check.skipped = ctx.driver
        elif stopped:
            check.skipped = "the run was stopped before this check"
        elif ctx.deadline and time.monotonic() > ctx.deadline:
            check.skipped = "the kit's time budget was spent before this check"
        else:
            try:
                function(ctx, check)
            except Skip as exc:
                check.skipped = str(exc)
            except Stopped as exc:
                check.error = str(exc)
                stopped = True
            except Exception:
                check.error = traceback.format_exc(limit=8)
        check.seconds = time.monotonic() - started
        results.append(check)
        report(results)
    return results


def summary_markdown(document: dict) -> str:
    """The short Markdown summary of a gpu-proof.json document."""
    host = document["host"]
    lines = [
        "# GPU proof kit",
        "",
        f"- when: {document['started']} ({document['seconds']:.0f} s), kit version "
        f"{document['kit_version']}",
        f"- host: kernel {host.get('kernel')}, Python {host.get('python')}, NUMA nodes "
        f"{len(host.get('numa_nodes') or [])}, PID 1 {host.get('pid1')}",
        f"- driver: {document.get('driver_version') or 'none'}; GPUs: "
        f"{', '.join(document.get('gpus') or []) or 'none'}",
        f"- nvidia-ml-py {host.get('pynvml_version')}, torch {host.get('torch_version')}, "
        f"cupy {host.get('cupy_version')}",
        f"- tested: numafleet.tuning {(host.get('collection') or {}).get('version')} at "
        f"{(host.get('collection') or {}).get('commit') or 'no git commit'} "
        f"({(host.get('collection') or {}).get('module_utils')})",
        f"- user: uid {host.get('uid')}" + ("" if host.get("root") else " (not root)"),
        f"- result: **{document['status']}** ({document['counts']})",
        f"- files: {', '.join(document.get('files') or []) or 'none'}",
        "",
        "| check | status | items (status) |",
        "| --- | --- | --- |",
    ]
    for check in document["checks"]:
        if check["skipped"]:
            detail = f"skipped: {check['skipped']}"
        elif check["error"]:
            detail = "the check broke: " + check["error"].strip().splitlines()[-1]
        else:
            detail = ", ".join(f"{item['name']} ({item['status']})" for item in check["items"])
        lines.append(f"| {check['id']} | {check['status']} | {detail.replace('|', '/')} |")
    failed = [
        (check["id"], item)
        for check in document["checks"]
        for item in check["items"]
        if item["status"] == FAIL
    ]
    if failed:
        lines += ["", "## Failed items", ""]
        for check_id, item in failed:
            observed = json.dumps(item["observed"], sort_keys=True)[:400]
            expected = json.dumps(item["expected"], sort_keys=True)[:200]
            lines.append(
                f"- {check_id}/{item['name']}: observed {observed}"
                + (f"; expected {expected}" if item["expected"] is not None else "")
                + (f"; {item['note']}" if item["note"] else "")
            )
    notes = [
        (check["id"], item)
        for check in document["checks"]
        for item in check["items"]
        if item["note"] and item["status"] != FAIL
    ]
    if notes:
        lines += ["", "## Notes", ""]
        lines += [f"- {check_id}/{item['name']}: {item['note']}" for check_id, item in notes]
    return "\n".join(lines) + "\n"


def document_of(ctx: Context, results: list, started: str, seconds: float, host: dict) -> dict:
    counts: dict = {}
    for check in results:
        counts[check.status] = counts.get(check.status, 0) + 1
    status = FAIL if counts.get(FAIL) else PASS if counts.get(PASS) else SKIPPED
    gpus = []
    if ctx.gpu_facts:
        gpus = [
            f"{entry['address']} {entry.get('name') or entry['vendor']}"
            for entry in ctx.gpu_facts["gpus"]
        ]
    driver = None
    for state in (ctx.nvml_state, ctx.smi_state):
        if state is not None:
            driver = (
                driver or state.nvml.get("driver_version") or state.nvidia_smi.get("driver_version")
            )
    return {
        "format": "numafleet.tuning/gpu-proof",
        "kit_version": KIT_VERSION,
        "started": started,
        "seconds": round(seconds, 1),
        "status": status,
        "counts": ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
        "driver": ctx.driver,
        "driver_version": driver,
        "gpus": gpus,
        "host": host,
        "checks": [check.as_dict() for check in results],
        "files": sorted(ctx.files),
    }


class Stopped(Exception):
    """SIGTERM (run.sh's outer limit, or the operator) arrived during a check."""


def _stop(signum, frame) -> None:
    # Once: a second SIGTERM must not break into the cleanup the first one starts.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stopped(f"stopped by signal {signum} (run.sh's 480 s limit, or the operator)")


def prepare_out(out: Path) -> Optional[str]:
    """Make ``out`` and drop a previous run's evidence files; why it cannot be used, or None."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in EVIDENCE:
            if (out / name).is_file() or (out / name).is_symlink():
                (out / name).unlink()
        probe = out / ".gpu-proof-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        return f"gpu-proof: cannot write the evidence to {out}: {exc.strerror or exc}"
    return None


def main(argv: Optional[list] = None, ctx: Optional[Context] = None, checks=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--out",
        default=os.environ.get("OUT") or "gpu-proof-out",
        help="directory for the evidence (default: $OUT, else ./gpu-proof-out)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help="seconds the whole run may take (default %(default)s)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    problem = prepare_out(out)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    import_collection()
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    if ctx is None:
        nvml, reason = load_pynvml()
        ctx = Context(out=out, nvml=nvml, nvml_reason=reason)
    ctx.out = out
    ctx.deadline = started + args.budget_s
    previous = signal.signal(signal.SIGTERM, _stop)
    host: dict = {}
    written: dict = {}  # the document last written, and its summary

    def report(results: list) -> None:
        document = document_of(ctx, results, started_at, time.monotonic() - started, host)
        written.update(document=document, summary=summary_markdown(document))
        (out / JSON_NAME).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
        (out / SUMMARY_NAME).write_text(written["summary"])

    try:
        ctx.driver = driver_absent(ctx)
        host.update(host_info(ctx))
        chosen = list(checks if checks is not None else all_checks())
        if ctx.driver_problem:
            chosen.insert(0, ("driver", "the NVIDIA driver answers", driver_check))
        results = run_checks(ctx, chosen, report)
    except Stopped as exc:  # before the first check: what there is, and why it stopped
        results = [Check("setup", "driver detection and host facts", error=str(exc))]
        report(results)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(written["summary"], end="")
    print(f"evidence: {out}")
    if any(check.error for check in results):
        return 2
    return 1 if written["document"]["status"] == FAIL else 0


def driver_check(ctx: Context, check: Check) -> None:
    """A driver or GPU is there but neither NVML nor nvidia-smi answers: that is a failure."""
    check.add(
        "answers",
        False,
        {"problem": ctx.driver_problem, "nvidia_smi_L": ctx.listing},
        expected="NVML or nvidia-smi -L lists the GPUs",
    )


if __name__ == "__main__":
    # The checks import this file as the module gpu_proof: run that one, not a second copy
    # named __main__ (whose Skip and Stopped classes the checks would not raise).
    sys.path.insert(0, str(HERE))
    import gpu_proof

    sys.exit(gpu_proof.main())
