"""tests/deploy: the deployment files checked offline (no cluster, no docker daemon)."""
from __future__ import annotations

import sys
from pathlib import Path

# om_fixtures (the pyACL emulator's model files) lives with the NPU tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "npu"))
