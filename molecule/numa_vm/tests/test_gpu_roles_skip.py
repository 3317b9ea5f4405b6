"""The guest has no GPU: the MIG and MPS roles of site.yml skip it and leave nothing behind."""

import pytest

testinfra_hosts = ["numa-vm"]


@pytest.mark.parametrize(
    "path",
    [
        "/etc/numafleet/mig.json",
        "/etc/numafleet/mig-parted.yaml",
        "/usr/local/libexec/numafleet-mig",
        "/etc/systemd/system/numafleet-mig.service",
        "/etc/systemd/system/nvidia-mps@.service",
        "/etc/numafleet/mps-units.json",
    ],
)
def test_no_gpu_artefacts(host, path):
    assert not host.file(path).exists


def test_the_guest_really_has_no_gpu(host):
    """What makes the roles skip: no display-class PCI device from NVIDIA (vendor 0x10de)."""
    vendors = host.check_output("cat /sys/bus/pci/devices/*/vendor").split()
    assert vendors and "0x10de" not in vendors
