"""numafleet.tuning stand-in for ansible-test's get-pip bootstrap script.

ansible-test downloads get-pip.py from ci-files.testing.ansible.com, which is unreachable here,
unless ~/.ansible/test/cache/get_pip_<version>.py exists; .ci/sanity copies this file there.
ansible-test runs it inside a new virtual environment made without pip, as
`python get_pip_<version>.py --disable-pip-version-check pip==<version> --no-setuptools --no-wheel`.
It installs pip from the interpreter's bundled wheel (ensurepip), then installs the requested
packages from the package index with the same arguments; --no-setuptools and --no-wheel are
get-pip options, so setuptools is removed afterwards instead (ensurepip brings it on Python < 3.12).
"""

from __future__ import annotations

import subprocess
import sys

GET_PIP_ONLY = ("--no-setuptools", "--no-wheel")


def main() -> None:
    """Bootstrap pip into sys.executable's environment; raises CalledProcessError on failure."""
    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
    python = [sys.executable, "-m"]
    subprocess.run([*python, "ensurepip", "--upgrade", "--default-pip"], check=True)
    subprocess.run([*python, "pip", "install", *args], check=True)
    if "--no-setuptools" in sys.argv[1:]:
        subprocess.run(
            [*python, "pip", "uninstall", "--yes", "--quiet", "setuptools"],
            check=False,  # absent on Python >= 3.12, where ensurepip no longer ships it
        )


if __name__ == "__main__":
    main()
