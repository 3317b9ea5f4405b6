"""Selecting a GPU by render node, on the real 2-node guest's systemd and kernel.

An AMD logical GPU whose UUID its siblings share is handed to its unit by render node: the plan's
``device_allow`` becomes ``DevicePolicy=closed`` and ``DeviceAllow=<path> rw`` (units.py), and
ROCm skips every GPU whose render node it may not open (ENOENT or EPERM). The guest has no GPU,
so two render nodes are made with mknod (DRM major 226, minors 200 and 201, which no driver
serves). The unit the collection's renderer writes for a placement allowed renderD200 runs a
probe that opens both: the kernel's device cgroup refuses renderD201 with EPERM before any
driver is asked, and lets renderD200 through to the driver (which has none: ENXIO or ENODEV).
The same probe run as root outside the unit gets no EPERM, so the refusal is the unit's.
"""

import base64
import errno
import json
import sys
import time

from vm_helpers import REPO, record

sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.numafleet.tuning.plugins.module_utils.numa import units

testinfra_hosts = ["numa-vm"]

UNIT = "numafleet-render-proof.service"
ALLOWED, OTHER = "/dev/dri/renderD200", "/dev/dri/renderD201"
PROBE = "/usr/local/libexec/numafleet-render-probe"
RESULT = "/run/numafleet-render-probe.json"
PROBE_TEXT = f"""#!/usr/bin/python3
import json, os, sys
out = {{}}
for path in ({ALLOWED!r}, {OTHER!r}):
    try:
        os.close(os.open(path, os.O_RDWR))
        out[path] = 0
    except OSError as exc:
        out[path] = exc.errno
with open(sys.argv[1], "w") as handle:
    json.dump(out, handle)
"""


def plan() -> dict:
    """A plan of one placement selected by render node, as numa_plan writes its entry."""
    return {
        "version": 1,
        "host": "numa-vm",
        "placements": [
            {
                "name": "render-proof",
                "unit": UNIT,
                "unit_kind": "service",
                "argv": ["/usr/bin/python3", PROBE, RESULT],
                "slice": "numafleet.slice",
                "cpus": [1],
                "mems": [0],
                "environment": {},
                "device_allow": ["/dev/kfd", ALLOWED],
                "hardening": True,
            }
        ],
        "tenants": [],
    }


def put(host, path: str, text: str, mode: str) -> None:
    data = base64.b64encode(text.encode()).decode()
    host.check_output(f"install -d {path.rsplit('/', 1)[0]}")
    host.check_output(f"echo {data} | base64 -d > {path} && chmod {mode} {path}")


def probe_result(host, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = host.run(f"cat {RESULT}")
        if out.rc == 0 and out.stdout.strip():
            return json.loads(out.stdout)
        time.sleep(1)
    raise AssertionError(f"{UNIT} wrote no {RESULT}: {host.run(f'systemctl status {UNIT}').stdout}")


def test_the_device_cgroup_lets_the_unit_open_only_its_render_node(host):
    files = units.render_files(plan())
    (path,) = files
    text = files[path]
    assert f"DevicePolicy=closed\nDeviceAllow=/dev/kfd rw\nDeviceAllow={ALLOWED} rw\n" in text
    try:  # the scenario connects as root
        host.check_output("install -d /dev/dri")
        for node, minor in ((ALLOWED, 200), (OTHER, 201)):
            host.run(f"test -e {node} || mknod -m 0666 {node} c 226 {minor}")
        put(host, PROBE, PROBE_TEXT, "0755")
        host.run(f"rm -f {RESULT}")
        # outside any unit: no cgroup device rule, so no EPERM for either node
        host.check_output(f"/usr/bin/python3 {PROBE} {RESULT}")
        outside = probe_result(host)
        host.run(f"rm -f {RESULT}")
        put(host, path, text, "0644")
        host.check_output("systemctl daemon-reload")
        host.check_output(f"systemctl start {UNIT}")
        inside = probe_result(host)
        shown = host.check_output(f"systemctl show -p DevicePolicy -p DeviceAllow {UNIT}")
    finally:
        host.run(f"systemctl stop {UNIT}")
        host.run(f"rm -f {path} {PROBE} {RESULT} {ALLOWED} {OTHER}")
        host.run("systemctl daemon-reload")
    record(
        "render_node_selection",
        {
            "outside_errno": outside,
            "unit_errno": inside,
            "systemctl_show": shown.splitlines(),
        },
    )
    assert errno.EPERM not in outside.values(), outside
    assert inside[OTHER] == errno.EPERM, inside
    assert inside[ALLOWED] in (0, errno.ENXIO, errno.ENODEV), inside
    assert "DevicePolicy=closed" in shown
    assert f"{ALLOWED} rw" in shown
