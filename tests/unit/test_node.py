"""comm/node.py: threads per rank and one GPU per local rank, with faked device counts and
launcher environments (no GPU needed); ``place`` applies them through a faked backend."""

import pytest

from ssdmpi import backend
from ssdmpi.comm import node
from ssdmpi.comm.node import Node, choose_gpu, choose_threads
from ssdmpi.errors import UserError


def make_node(local_rank=0, local_size=4, cpus=16, node_cpus=16):
    return Node(host="n1", local_rank=local_rank, local_size=local_size, cpus=cpus, node_cpus=node_cpus)


# --- threads ----------------------------------------------------------------------------------

@pytest.mark.parametrize("local_size,node_cpus,cpus,expected", [
    (4, 16, 16, 4), (1, 16, 16, 16), (3, 16, 16, 5), (4, 2, 2, 1), (32, 16, 16, 1),
    (4, 16, 1, 1),   # the launcher bound this rank to one core: never more threads than its CPUs
])
def test_threads_share_the_node_between_its_ranks(local_size, node_cpus, cpus, expected):
    n, why = choose_threads(make_node(local_size=local_size, cpus=cpus, node_cpus=node_cpus), None, {})
    assert n == expected
    ranks = "1 local rank" if local_size == 1 else f"{local_size} local ranks"
    assert f"{node_cpus} usable CPUs on n1 / {ranks}" == why


@pytest.mark.parametrize("name", node.THREAD_VARIABLES)
def test_a_thread_variable_the_user_set_is_left_alone(name):
    n, why = choose_threads(make_node(), None, {name: "3"})
    assert n is None and why == f"{name}=3 set by the user"


def test_threads_flag_wins_over_variables():
    assert choose_threads(make_node(), 6, {"OMP_NUM_THREADS": "3"}) == (6, "--threads")


def test_empty_thread_variable_counts_as_unset():
    assert choose_threads(make_node(local_size=2), None, {"OMP_NUM_THREADS": ""})[0] == 8


# --- GPUs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("local_rank,count,expected", [(0, 4, 0), (3, 4, 3), (5, 4, 1), (1, 2, 1), (2, 1, 0)])
def test_one_gpu_per_local_rank(local_rank, count, expected):
    gpu, why, _ = choose_gpu(make_node(local_rank=local_rank, local_size=8), count, None, {})
    assert gpu == expected
    assert f"local rank {local_rank} of 8, {count} GPU(s) seen" == why


def test_more_local_ranks_than_gpus_share_and_say_so():
    _, _, shared = choose_gpu(make_node(local_rank=0, local_size=4), 2, None, {})
    assert shared and "4 ranks on n1 share 2 GPU(s)" in shared
    assert choose_gpu(make_node(local_rank=0, local_size=2), 2, None, {})[2] is None


@pytest.mark.parametrize("environ,why", [
    ({"CUDA_VISIBLE_DEVICES": "5"}, "CUDA_VISIBLE_DEVICES=5"),
    ({"SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "Slurm --gpus-per-task=1"),
    ({"SLURM_STEP_GPUS": "2"}, "SLURM_STEP_GPUS=2"),
])
def test_a_gpu_the_launcher_bound_is_used(environ, why):
    # local rank 3 would pick device 3 of 4; a launcher that bound the rank's GPU wins
    gpu, reason, shared = choose_gpu(make_node(local_rank=3), 4, None, environ)
    assert (gpu, reason, shared) == (0, f"bound by the launcher: {why}", None)


@pytest.mark.parametrize("environ", [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"SLURM_STEP_GPUS": "0,1,2,3"},
                                     {"CUDA_VISIBLE_DEVICES": ""}])
def test_several_visible_gpus_are_not_a_binding(environ):
    assert choose_gpu(make_node(local_rank=3), 4, None, environ)[0] == 3


def test_gpu_id_flag_wins_and_is_checked():
    assert choose_gpu(make_node(local_rank=3), 4, 1, {"CUDA_VISIBLE_DEVICES": "5"})[:2] == (1, "--gpu-id")
    with pytest.raises(UserError, match=r"--gpu-id 4 is not a GPU this rank can see \(devices 0..3\)"):
        choose_gpu(make_node(), 4, 4, {})
    with pytest.raises(UserError, match=r"--gpu-id 0 is not a GPU this rank can see \(no GPU\)"):
        choose_gpu(make_node(), 0, 0, {})


def test_no_gpu_means_cpu():
    assert choose_gpu(make_node(), 0, None, {}) == (None, "no GPU", None)


# --- place: applies the choice through the backend ----------------------------------------------

@pytest.fixture
def fake_backend(monkeypatch):
    """A backend with ``count`` GPUs: records ``bind_gpu`` and ``limit_threads``; ``select``
    takes the GPU when one is bound (restores the real backend's state afterwards)."""
    calls = {"bound": [], "threads": [], "count": 4}
    monkeypatch.setattr(backend, "_xp", backend._xp)
    monkeypatch.setattr(backend, "_device", backend._device)
    monkeypatch.setattr(backend, "_reason", backend._reason)
    monkeypatch.setattr(backend, "gpu_count", lambda: calls["count"])
    monkeypatch.setattr(backend, "bind_gpu", calls["bound"].append)
    monkeypatch.setattr(node, "limit_threads", calls["threads"].append)

    def select(device="auto"):
        if device != "cpu" and calls["count"]:
            backend._device, backend._reason = "gpu", "CuPy: GPU found: Fake H100 (CuPy 0)"
        elif device == "gpu":
            raise UserError("--device gpu requested but no GPU; use --device cpu or auto")
        else:
            backend._device = "cpu"

    monkeypatch.setattr(backend, "select", select)
    return calls


def test_place_binds_the_local_ranks_gpu_before_selecting(fake_backend):
    p = node.place(make_node(local_rank=2, local_size=4), "auto", None, None, environ={})
    assert fake_backend["bound"] == [2] and fake_backend["threads"] == [4]
    assert (p.device, p.gpu_id, p.threads) == ("gpu", 2, 4)
    assert "GPU 2 (local rank 2 of 4, 4 GPU(s) seen)" in p.describe()


def test_place_cpu_binds_nothing(fake_backend):
    p = node.place(make_node(), "cpu", 2, None, environ={})
    assert fake_backend["bound"] == [] and fake_backend["threads"] == [2]
    assert (p.device, p.gpu_id) == ("cpu", None)
    with pytest.raises(UserError, match="--gpu-id needs a GPU but --device is cpu"):
        node.place(make_node(), "cpu", None, 0, environ={})


def test_place_without_gpus(fake_backend):
    fake_backend["count"] = 0
    assert node.place(make_node(), "auto", None, None, environ={}).device == "cpu"
    with pytest.raises(UserError, match="--device gpu requested but no GPU"):
        node.place(make_node(), "gpu", None, None, environ={})
    with pytest.raises(UserError, match="--gpu-id 1 is not a GPU"):
        node.place(make_node(), "auto", None, 1, environ={})
    assert fake_backend["bound"] == []


def test_place_says_when_ranks_share_a_gpu(fake_backend):
    fake_backend["count"] = 1
    p = node.place(make_node(local_rank=1, local_size=2), "auto", None, None, environ={})
    assert p.gpu_id == 0 and "2 ranks on n1 share 1 GPU(s)" in p.shared_gpu


def test_limit_threads_limits_numpys_blas_and_libraries_loaded_later(monkeypatch):
    import os

    from threadpoolctl import threadpool_limits

    for name in node.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)   # restored afterwards
    with threadpool_limits(limits=None):   # restores the pools afterwards
        node.limit_threads(1)
        assert node.blas_threads() in (1, None)
        assert all(pool["num_threads"] == 1 for pool in node.blas_info())
    assert all(os.environ[name] == "1" for name in node.THREAD_VARIABLES)


def test_usable_cpus_is_this_process_affinity():
    import os

    assert node.usable_cpus() == set(os.sched_getaffinity(0))


def test_thread_variables_this_process_wrote_are_not_the_users(monkeypatch):
    """A second run in the same process (tests, the Python API) still chooses for itself."""
    from ssdmpi.comm import node as node_module

    for name in node_module.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(node_module, "_written", {})
    here = node_module.Node(host="h", local_rank=0, local_size=2, cpus=4, node_cpus=4)
    node_module.limit_threads(2)
    assert node_module.choose_threads(here, None) == (2, "4 usable CPUs on h / 2 local ranks")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")            # the user's own value wins
    assert node_module.choose_threads(here, None)[1] == "OMP_NUM_THREADS=3 set by the user"


def test_ranks_of_one_host_share_it_when_mpi_keeps_them_off_shared_memory():
    """``MPIR_CVAR_NOLOCAL=1`` (what bin/ssdmpi-netns sets, to force MPICH onto TCP) makes MPI's
    shared-memory split see one rank per "node"; the ranks still share the host's CPUs. Before the
    split by host name, each of 2 ranks on 2 CPUs took 2 BLAS threads (4x slower compute)."""
    import json

    from tests.conftest import run_cli

    proc = run_cli(["info", "--json"], ranks=2, timeout=120, env={"MPIR_CVAR_NOLOCAL": "1"},
                   unset=node.THREAD_VARIABLES)        # the node decides
    assert proc.returncode == 0, proc.stderr
    ranks = json.loads(proc.stdout)["ranks"]
    assert sorted(r["local_rank"] for r in ranks) == [0, 1] and {r["local_size"] for r in ranks} == {2}
    cpus = ranks[0]["node_cpus"]
    assert {r["threads"] for r in ranks} == {max(1, cpus // 2)}
