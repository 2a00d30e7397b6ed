"""`make bench`: every benchmark in turn; pass --quick for fewer repetitions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = (
    "preferred",
    "allocate",
    "react",
    "vnpu",
    "footprint",
    "scale",
    "cluster",
    "hostile",
    "dra_prepare",
    "dra_carve",
    "training",
    "network",
)


def main() -> int:
    failed = []
    for script in SCRIPTS:
        print(f"\n### bench/{script}.py", flush=True)
        # preferred.py takes an iteration count; the others take --quick.
        quick = "--quick" in sys.argv[1:]
        args = (["--iterations", "2000"] if quick else []) if script == "preferred" else sys.argv[1:]
        command = [sys.executable, "-m", f"bench.{script}", *args]
        if subprocess.run(command, cwd=HERE.parent, check=False).returncode:
            failed.append(script)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
