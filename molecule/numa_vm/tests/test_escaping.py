"""Awkward host_vars values reach systemd and the process exactly, on the guest's real systemd.

The unit tests parse rendered units with the quoting, specifier and `$` rules of systemd.syntax(7)
and systemd.service(5); here the guest's own systemd reads them: the running process's argv and
environment (/proc/<pid>/cmdline, /proc/<pid>/environ) and the unit's Description are compared
with what the host variables say, byte for byte.
"""

import json
import shlex

from vm_helpers import main_pid, placements, run_playbook, site, unit, wait_until_touched

testinfra_hosts = ["numa-vm"]

# Quotes, %, $ (alone, braced, doubled), backslashes (one at the end of an environment value,
# inside quotes), a semicolon word, non-ASCII text: each has its own escaping in the unit.
LABEL = 'it\'s "50%" of $HOME ${USER} $$ \\n back\\slash ; é'
DESCRIPTION = 'cpu-only: 100% "pinned" $HOME ${USER} %n back\\slash é'
ENVIRONMENT = {
    "NUMAFLEET_PROOF_QUOTES": "a \"quoted\" 'word' end\\",
    "NUMAFLEET_PROOF_SPECIFIERS": "%n %% %h 50%",
    "NUMAFLEET_PROOF_DOLLARS": "$HOME ${USER} $$ $",
    "NUMAFLEET_PROOF_SPACES": "  two leading, two trailing  ",
}


def test_awkward_values_reach_the_process_exactly(host, tmp_path):
    wanted = json.loads(json.dumps(placements()))
    awkward = next(p for p in wanted if p["name"] == "cpu-only")
    awkward["exec"] = f"{awkward['exec']} --label {shlex.quote(LABEL)}"
    awkward["description"] = DESCRIPTION
    awkward["environment"] = ENVIRONMENT
    try:
        proc, output, dummy = site(tmp_path, "awkward", wanted)
        assert proc.returncode == 0, output[-4000:]
        wait_until_touched(host, "cpu-only")
        pid = main_pid(host, "cpu-only")
        argv = host.file(f"/proc/{pid}/cmdline").content.rstrip(b"\0").split(b"\0")
        assert [word.decode() for word in argv] == shlex.split(awkward["exec"])
        environ = host.file(f"/proc/{pid}/environ").content.rstrip(b"\0").split(b"\0")
        seen = dict(item.decode().split("=", 1) for item in environ)
        assert {key: seen.get(key) for key in ENVIRONMENT} == ENVIRONMENT
        shown = host.run(f"systemctl show -p Description --value {unit('cpu-only')}")
        assert shown.stdout.rstrip("\n") == DESCRIPTION
    finally:
        proc, output, dummy = run_playbook("../site.yml")  # back to the scenario's placements
        assert proc.returncode == 0, output[-4000:]
