"""What the tests and the benchmarks share: the agent as a process, kubelet stand-ins, host trees, a fake
npu-smi, and the paths of the repository's fixtures.

    from tests.support import FIXTURES
    from tests.support.agent_process import fake_agent
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# How long the tests' helpers wait for what the agent does in a moment on an idle machine: two cores shared by
# several people can make that moment many seconds. A wait that ends early costs nothing more.
PATIENCE = 30.0
FIXTURES = ROOT / "tests" / "fixtures" / "npu-smi"
CONSTRUCTED = ROOT / "tests" / "fixtures" / "npu-smi-constructed"
