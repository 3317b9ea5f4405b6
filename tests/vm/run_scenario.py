"""Run `molecule test -s numa_vm` and report how long each action took (make vm).

    run_scenario.py [MOLECULE_ARGS...]     default: test -s numa_vm

Streams molecule's output unchanged, notes when each action starts (molecule's
"<scenario> ➜ <action>: Executing" lines), and at the end prints one line per action with its
seconds and writes them to reports/numa_vm/timings.json (with the guest's image build and boot
figures when molecule's create printed them). When molecule fails, prints the last 80 lines of
the guest's serial console (reports/numa_vm/guest/serial.log). Exits with molecule's status.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REPORT = REPO / "reports" / "numa_vm" / "timings.json"
SERIAL_LOG = REPO / "reports" / "numa_vm" / "guest" / "serial.log"
SERIAL_TAIL_LINES = 80
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "numa_vm ➜ create: Executing" on a terminal, "[numa_vm > create] Executing" in CI logs.
_ACTION = re.compile(r"(?:\S+ ➜ (\w+): |\[\S+ > (\w+)\] )Executing\s*$")
# numa_vm.py's own log lines, as create.yml shows them.
_FIGURES = {
    "image_build_s": re.compile(r"image ready in (\d+) s"),
    "boot_to_ssh_s": re.compile(r"guest up: ssh after (\d+) s"),
    "boot_to_running_s": re.compile(r"systemd \w+ after (\d+) s"),
}


def main(argv: list) -> int:
    args = argv or ["test", "-s", "numa_vm"]
    molecule = str(REPO / ".venv" / "bin" / "molecule")
    env = dict(os.environ, PATH=f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    started = time.monotonic()
    actions: list = []
    figures: dict = {}
    REPORT.unlink(missing_ok=True)
    interrupted = False
    with subprocess.Popen(
        [molecule, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    ) as proc:
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                plain = _ANSI.sub("", line)
                match = _ACTION.search(plain)
                if match:
                    actions.append([match.group(1) or match.group(2), time.monotonic() - started])
                for key, pattern in _FIGURES.items():
                    found = pattern.search(plain)
                    if found:
                        figures[key] = int(found.group(1))
            status = proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached molecule too, which stops without its destroy step: the guest
            # (its own session, by design) would keep running. Stop it here.
            interrupted = True
            proc.wait()
            status = 130
    if interrupted:
        print("\nnuma_vm scenario interrupted: stopping the guest (molecule destroy)", flush=True)
        subprocess.run([molecule, "destroy", "-s", "numa_vm"], cwd=REPO, env=env, check=False)
    total = time.monotonic() - started
    rows = []
    for index, (name, start) in enumerate(actions):
        end = actions[index + 1][1] if index + 1 < len(actions) else total
        rows.append({"action": name, "seconds": round(end - start, 1)})
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(
        json.dumps(
            {
                "molecule_args": args,
                "exit_status": status,
                "total_s": round(total, 1),
                "actions": rows,
                **figures,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nnuma_vm scenario: exit {status}, {total:.0f} s in all ({REPORT.relative_to(REPO)})")
    for row in rows:
        print(f"  {row['action']:<12} {row['seconds']:>7.1f} s")
    for key, value in figures.items():
        print(f"  {key:<18} {value:>5} s")
    if status != 0 and SERIAL_LOG.exists():
        lines = SERIAL_LOG.read_text(errors="replace").splitlines()[-SERIAL_TAIL_LINES:]
        print(f"\n--- last {len(lines)} lines of the guest's serial console ({SERIAL_LOG}) ---")
        print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
