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

# Tests the suite gates on the backend's name (gloo's, or a list of names) although what
# they test is generic to a CPU process group, and whose bodies do not branch on the name:
# braid runs them unchanged. A test is unskipped only if its skip reason still starts with
# the gate named here, so a test PyTorch changes is not run blindly. (The reasons name sets
# of backends, whose order changes from run to run: hence prefixes.)
GATED_BY_NAME = {
    "Only gloo backend supports timeouts": ["test_barrier_timeout_group", "test_barrier_timeout_full_group"],
    "Only Gloo backend supports sparse all reduce": ["test_sparse_all_reduce_sum"],
    "GLOO Batch Send Recv CPU": ["test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags"],
    "get_future is only supported on mpi, nccl and gloo": ["test_get_future"],
    "Test requires backend braid to be one of": [
        *(f"test_all_reduce_coalesced_{g}{op}" for g in ("", "group_", "full_group_")
          for op in ("sum", "product", "min", "max")),
        "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_scatter_object_list",
        "test_grads_same_across_ranks_with_no_sync"],
}
if os.environ["BACKEND"] == "braid":
    for why, names in GATED_BY_NAME.items():
        for name in names:
            fn = getattr(DistributedTest._DistTestBase, name)
            if getattr(fn, "__unittest_skip__", False) and getattr(fn, "__unittest_skip_why__", "").startswith(why):
                fn.__unittest_skip__ = False


def _record_outcomes(path):
    """Writes {test name: [outcome, seconds, detail]} to `path` at exit (scripts/torch_suite.sh
    reads it to compare backends); outcome is pass, fail, error, skip, xfail or xpass."""
    import atexit
    import json
    import time
    import unittest

    results, started = {}, {}
    cls = unittest.TextTestResult

    def name(test):
        return test.id().rsplit(".", 1)[-1]

    def hook(method, outcome, detail=None):
        orig = getattr(cls, method)

        def wrapped(self, test, *rest):
            t = time.monotonic() - started.get(name(test), time.monotonic())
            results[name(test)] = [outcome, round(t, 2), detail(rest) if detail else ""]
            return orig(self, test, *rest)
        setattr(cls, method, wrapped)

    orig_start = cls.startTest

    def start(self, test):
        started[name(test)] = time.monotonic()
        return orig_start(self, test)
    cls.startTest = start
    def why(rest):  # the last error line of the failure (torch appends a repro hint after it)
        lines = [ln for ln in str(rest[0][1]).strip().splitlines() if "PYTORCH_PRINT_REPRO" not in ln] if rest else []
        return next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "")[:300]
    hook("addSuccess", "pass")
    hook("addFailure", "fail", why)
    hook("addError", "error", why)
    hook("addSkip", "skip", lambda rest: str(rest[0])[:300])
    hook("addExpectedFailure", "xfail")
    hook("addUnexpectedSuccess", "xpass")

    def dump():
        with open(path, "w") as f:
            json.dump(results, f, indent=0, sort_keys=True)
    atexit.register(dump)


if os.environ.get("BRAID_SUITE_RESULTS") and __name__ == "__main__":  # not in the spawned ranks
    _record_outcomes(os.environ["BRAID_SUITE_RESULTS"])


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
