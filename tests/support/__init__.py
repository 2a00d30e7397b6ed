"""What the tests and the benchmarks share: the agent as a process, kubelet stand-ins, host trees, a fake
npu-smi, and the paths of the repository's fixtures.

    from tests.support import FIXTURES
    from tests.support.agent_process import fake_agent
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "npu-smi"
CONSTRUCTED = ROOT / "tests" / "fixtures" / "npu-smi-constructed"
