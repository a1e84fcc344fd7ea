"""The snapshot keeps environment variables by name, with the credentials inside values redacted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.checks.launch_port import launch_port
from gpudoctor.engine import CheckContext
from gpudoctor.probe.environment import allowed, allowed_env
from gpudoctor.probe.host import master_port
from gpudoctor.safety.redact import MARKER
from tests.helpers.snapshots import load
from tests.paths import REFERENCE

# The variables the checks lint (issue 10's list): every one is kept by name.
LINTED = """NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_IB_HCA NCCL_CROSS_NIC NCCL_MIN_NCHANNELS
NCCL_MAX_NCHANNELS NCCL_BUFFSIZE NCCL_CUMEM_ENABLE NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_IGNORE_CPU_AFFINITY
NCCL_ALGO NCCL_PROTO NCCL_P2P_LEVEL NCCL_P2P_DISABLE NCCL_SHM_DISABLE NCCL_NVLS_ENABLE NCCL_IB_DISABLE
NCCL_SOCKET_IFNAME TORCH_NCCL_BLOCKING_WAIT TORCH_NCCL_ASYNC_ERROR_HANDLING NCCL_BLOCKING_WAIT
NCCL_ASYNC_ERROR_HANDLING CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER CUDA_LAUNCH_BLOCKING PYTORCH_CUDA_ALLOC_CONF
MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE SLURM_NTASKS""".split()

# Secret-looking names under the prefixes the old allow-list let through whole.
NEVER = ["NCCL_PASSWORD", "TORCH_SECRET_KEY", "CUDA_TOKEN", "PYTORCH_API_KEY", "NCCL_SOCKET_MAGIC", "ROLE_SECRET"]


def nccl_documented_names() -> list[str]:
    """The section titles of NCCL's env.rst as recorded in tests/reference (the documented set)."""
    text = (REFERENCE / "nccl_env_variables.md").read_text(encoding="utf-8")
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    return block.split()


@pytest.mark.parametrize("name", LINTED)
def test_every_linted_variable_is_kept(name: str) -> None:
    assert allowed(name)


def test_every_documented_nccl_variable_is_kept_but_the_socket_magic() -> None:
    names = nccl_documented_names()
    assert len(names) > 100, "the recorded list is incomplete"
    assert sorted(n for n in names if not allowed(n)) == ["NCCL_SOCKET_MAGIC"]


@pytest.mark.parametrize("name", NEVER)
def test_secret_names_under_known_prefixes_are_dropped(name: str) -> None:
    assert allowed_env({name: "s3cr3t-value", "NCCL_DEBUG": "INFO"}) == {"NCCL_DEBUG": "INFO"}


def test_a_kept_value_that_does_not_fit_its_variables_grammar_is_replaced() -> None:
    env = allowed_env(
        {
            "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1,token=ib-tok-123",
            "MASTER_ADDR": "admin:hunter2@10.0.0.1",
            "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p?secret=xyz",
            "CUDA_VISIBLE_DEVICES": "GPU-5a2b3c4d-1111-2222-3333-444455556666",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        }
    )
    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-5a2b3c4d-1111-2222-3333-444455556666",
        "MASTER_ADDR": MARKER,
        "NCCL_DEBUG_FILE": MARKER,
        "NCCL_IB_HCA": f"mlx5_0:1,mlx5_1:1,{MARKER}",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }


MIG = "MIG-GPU-5a2b3c4d-1111-2222-3333-444455556666/1/0"
ALLOC = "backend:cudaMallocAsync,roundup_power2_divisions:[256:1,>:8]"
# (variable, value, shown): each kept variable's grammar keeps its real settings whole.
GRAMMAR_CASES = [
    ("MASTER_ADDR", "node-017.cluster.local", "node-017.cluster.local"),
    ("MASTER_ADDR", "fe80::1%eth0", "fe80::1%eth0"),
    ("MASTER_ADDR", "10.0.0.1 --token x", MARKER),
    ("NCCL_COMM_ID", "10.0.0.1:29400", "10.0.0.1:29400"),
    ("NCCL_IB_HCA", "^=mlx5_1:1,mlx5_4", "^=mlx5_1:1,mlx5_4"),
    ("NCCL_SOCKET_IFNAME", "^docker0,lo", "^docker0,lo"),
    ("NCCL_SOCKET_IFNAME", "=eth0,Zm9vYmFyMTIzNDU2Nzg5MGFi", f"=eth0,{MARKER}"),
    ("NCCL_ALGO", "allreduce:tree,ring;broadcast:ring", "allreduce:tree,ring;broadcast:ring"),
    ("NCCL_PROTO", "^LL128", "^LL128"),
    ("NCCL_DEBUG_SUBSYS", "INIT,NET,^GRAPH", "INIT,NET,^GRAPH"),
    ("NCCL_DEBUG_FILE", "/scratch/logs/nccl.%h.%p.log", "/scratch/logs/nccl.%h.%p.log"),
    ("NCCL_NET_PLUGIN", "libnccl-net-ofi.so", "libnccl-net-ofi.so"),
    ("NCCL_IB_ADDR_RANGE", "10.0.0.0/8", "10.0.0.0/8"),
    ("NCCL_DEBUG_TIMESTAMP_FORMAT", "[%F %T] ", "[%F %T] "),
    ("CUDA_VISIBLE_DEVICES", f"0,1,{MIG}", f"0,1,{MIG}"),
    ("PYTORCH_CUDA_ALLOC_CONF", ALLOC, ALLOC),
    ("TORCH_LOGS", "+dynamo,-inductor,graph_breaks", "+dynamo,-inductor,graph_breaks"),
    ("SLURM_NTASKS_PER_NODE", "8(x2)", "8(x2)"),
    ("SLURM_GPUS_PER_NODE", "gpu:h100:8", "gpu:h100:8"),
    ("ROLE_NAME", "R4nd0mAlph4Num3r1cStr1ngOf36Chars", MARKER),
    ("NCCL_NET", "AWS Libfabric", "AWS Libfabric"),
    ("OMP_NUM_THREADS", "8", "8"),
]


@pytest.mark.parametrize(("name", "value", "shown"), GRAMMAR_CASES)
def test_each_kept_variable_is_shown_by_its_grammar(name: str, value: str, shown: str) -> None:
    assert allowed_env({name: value}) == {name: shown}


def test_gd222_does_not_repeat_a_password_in_master_addr() -> None:
    status = master_port({"MASTER_ADDR": "admin:hunter2@no-such-host.invalid", "MASTER_PORT": "29500"})
    snapshot = load("h100_sxm_8x")
    snapshot = replace(snapshot, host=replace(snapshot.host, master_port=status), env={"MASTER_PORT": "29500"})
    (finding,) = launch_port(CheckContext(snapshot))
    assert finding.code == "GD222"
    assert "hunter2" not in finding.message and "hunter2" not in str(finding.evidence)
    assert f"MASTER_ADDR '{MARKER}'" in finding.message


def test_a_master_port_that_is_not_a_number_is_not_repeated_verbatim() -> None:
    status = master_port({"MASTER_PORT": "Zm9vYmFyMTIzNDU2Nzg5MGFiY2RlZg"})
    assert "Zm9vYmFy" not in status.detail and MARKER in status.detail
