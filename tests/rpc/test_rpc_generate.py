"""Gemma 3 split across two pyggml RPC servers on loopback gives the local greedy text."""

import pytest

from helpers.rpc_util import running_server
from pyggml.cli.main import main


@pytest.mark.model  # the default model
def test_generate_over_two_rpc_servers_matches_local(capsys):
    args = ["generate", "-p", "The capital of France is", "-n", "5", "--temp", "0", "-c", "256", "-t", "1"]
    assert main([*args, "-q"]) == 0
    local = capsys.readouterr().out
    with running_server() as a, running_server() as b:
        endpoints = f"127.0.0.1:{a.port},127.0.0.1:{b.port}"
        assert main([*args, "--rpc", endpoints, "-ngl", "99"]) == 0
        out, err = capsys.readouterr()
    assert out == local and local.strip()
    assert "RPC" in err  # the devices that took the layers are reported
