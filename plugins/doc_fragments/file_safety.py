# Copyright: numafleet.tuning contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """How the writing modules write files below their root, and the per-host lock they hold."""

    # Notes only: ansible-doc wants an options key in every fragment.
    DOCUMENTATION = r"""
options: {}
notes:
  - Files below O(root) are read, written and removed without following a symbolic link in any
    directory of their path (a linked directory fails the task naming it); a link at a file
    itself is replaced by the file, never written through. Directories made get mode C(0755) and
    files C(0644) (programs C(0755)) whatever the umask; writes are atomic (temporary file,
    fsync, rename).
  - Outside check mode the module holds the per-host lock C(/run/numafleet/apply.lock) (below
    O(root); C(flock), the holder's PID written in it) from its first read of the host's files to
    its last write. A second run waits up to 120 seconds, then fails naming the lock and the PID.
    Check mode takes no lock; it only reads, and every file is replaced in one rename, so it sees
    each file whole. A O(root) that does not exist yet is not locked.
"""

    # The modules that remove the unit files a manifest lists (pinned_units, nvidia_mps).
    MANIFEST = r"""
options: {}
notes:
  - Only files this module wrote are disabled and removed. The manifest (version 2) records the
    sha256 of every file written. A listed file that is no longer planned is removed only when it
    has a name numafleet gives its files (C(numafleet-*.service), C(numafleet*.slice),
    C(nvidia-mps@.service), C(<unit>.d/50-numafleet.conf)), is in O(unit_dir), is a regular file
    and still has the recorded sha256; a version 1 manifest (no sha256) is trusted only for
    files that start with O(header). Any other listed file (a vendor or admin unit, a path
    outside O(unit_dir), a file edited since it was written, a link) is kept, not disabled,
    reported in RV(kept) and as a warning (in check mode too), and left out of the next manifest.
"""
