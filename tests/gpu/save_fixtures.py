"""Keep a GPU proof kit run as unit-test fixtures: tests/unit/fixtures/gpu_proof/<gpu>-<driver>/.

    python3 tests/gpu/save_fixtures.py EVIDENCE_DIR

Copies the run's evidence files (gpu-proof.json and .md, the raw nvidia-smi outputs, the NVML
snapshot, the client and MPS transcripts) and adds a row to the directory's PROVENANCE.md.
tests/unit/gpu_kit/test_recorded_runs.py replays every directory there. Refuses to overwrite an
existing recording (delete it first to replace it).
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "unit" / "fixtures" / "gpu_proof"
KEPT = (
    "gpu-proof.json",
    "gpu-proof.md",
    "nvidia-smi-q-x.xml",
    "nvidia-smi-mig.txt",
    "nvml-snapshot.json",
    "cuda-client.txt",
    "mps-transcript.txt",
)
HEADER = """# Provenance of the recorded GPU proof kit runs (`tests/unit/fixtures/gpu_proof/`)

Test-only material: the evidence of `tests/gpu/run.sh` on real NVIDIA GPU hosts, copied unchanged
by `tests/gpu/save_fixtures.py`. `tests/unit/gpu_kit/test_recorded_runs.py` replays each
directory through the collection's parsers and the kit's comparisons.

| directory | recorded | GPU | driver | host | kit |
|---|---|---|---|---|---|
"""


def slug(document: dict) -> str:
    """<gpu model>-<driver>, e.g. h200-580.159.04, from a gpu-proof.json document."""
    names = [entry.split(" ", 1)[1] for entry in document.get("gpus") or [] if " " in entry]
    model = names[0] if names else "unknown-gpu"
    model = re.sub(r"^nvidia[\s-]+", "", model.lower())
    model = re.sub(r"[^a-z0-9.]+", "-", model).strip("-")
    return f"{model}-{document.get('driver_version') or 'no-driver'}"


def main(argv: list) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    source = Path(argv[1])
    document = json.loads((source / "gpu-proof.json").read_text())
    if not document.get("driver_version"):
        print(f"{source}: this run found no NVIDIA driver; nothing worth keeping", file=sys.stderr)
        return 1
    target = FIXTURES / slug(document)
    if target.exists():
        print(f"{target} exists; delete it first to replace it", file=sys.stderr)
        return 1
    target.mkdir(parents=True)
    copied = []
    for name in KEPT:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
            copied.append(name)
    provenance = FIXTURES / "PROVENANCE.md"
    if not provenance.exists():
        provenance.write_text(HEADER)
    host = document.get("host") or {}
    row = (
        f"| `{target.name}/` | {document.get('started') or datetime.date.today()} | "
        f"{', '.join(document.get('gpus') or [])} | {document.get('driver_version')} | "
        f"kernel {host.get('kernel')}, Python {host.get('python')}, "
        f"{len(host.get('numa_nodes') or [])} NUMA node(s) | v{document.get('kit_version')}, "
        f"{document.get('status')} ({document.get('counts')}) |\n"
    )
    with provenance.open("a") as handle:
        handle.write(row)
    print(f"{target}: {', '.join(copied)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
