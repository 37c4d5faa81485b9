"""PyTorch's DistributedTest against a backend (BACKEND=braid by default), with spawned ranks:
scripts/torch_suite.sh runs it. The braid backend is added to the suite's sets of plugin,
subgroup and DDP backends (DistTestCases.backend_feature), as the suite expects of an
out-of-tree backend."""
import os
import tempfile

os.environ.setdefault("BACKEND", "braid")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="braid-torch-suite-"))
import braid.torch  # noqa: E402,F401 registers the backend, in every spawned rank too
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if os.environ["BACKEND"] == "braid":
    for feature in ("plugin", "subgroup", "ddp"):
        DistTestCases.backend_feature[feature].add("braid")
from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
