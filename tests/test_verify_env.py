"""What the verification suite controls in its processes' environment (issue 14 item 12)."""

from __future__ import annotations

from torchkiln.verify.proc import WORKER_SET, worker_environment


def test_debug_switches_and_launcher_variables_are_removed_numerics_pinned_the_rest_kept() -> None:
    env = worker_environment(
        {
            "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
            "TORCH_CPP_LOG_LEVEL": "INFO",
            "MASTER_PORT": "1",
            "RANK": "3",
            "TORCHELASTIC_RUN_ID": "x",
            "OMP_NUM_THREADS": "64",
            "CUDA_VISIBLE_DEVICES": "1",
            "GLOO_SOCKET_IFNAME": "eth1",
            "PATH": "/usr/bin",
        }
    )
    assert not {
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_CPP_LOG_LEVEL",
        "MASTER_PORT",
        "RANK",
        "TORCHELASTIC_RUN_ID",
    } & set(env)
    assert env["OMP_NUM_THREADS"] == "1" and all(env[k] == v for k, v in WORKER_SET.items())
    assert (
        env["CUDA_VISIBLE_DEVICES"] == "1"
        and env["GLOO_SOCKET_IFNAME"] == "eth1"
        and env["PATH"] == "/usr/bin"
    )
