"""`make bench`: every benchmark in turn; pass --quick for fewer repetitions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ("preferred.py", "allocate.py", "react.py", "footprint.py", "scale.py")


def main() -> int:
    failed = []
    for script in SCRIPTS:
        print(f"\n### bench/{script}", flush=True)
        # preferred.py takes an iteration count; the others take --quick.
        quick = "--quick" in sys.argv[1:]
        args = (["--iterations", "2000"] if quick else []) if script == "preferred.py" else sys.argv[1:]
        if subprocess.run([sys.executable, str(HERE / script), *args], check=False).returncode:
            failed.append(script)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
