"""How `--ray-address` joins Ray (no Ray started here): a cluster on loopback, or a private
one, keeps every address on 127.0.0.1; GPUs are declared only where they are used."""

from __future__ import annotations

import pytest

from headrace.router.ray_cluster import init_kwargs, uses_cuda


@pytest.mark.parametrize("address", ["local", "127.0.0.1:6379", "localhost:6379"])
def test_a_cluster_on_this_machine_stays_on_loopback(address: str) -> None:
    kwargs = init_kwargs(address)
    assert kwargs["address"] == address and kwargs["_node_ip_address"] == "127.0.0.1"


def test_a_private_ray_has_no_dashboard_and_a_small_object_store() -> None:
    kwargs = init_kwargs("local")
    assert kwargs["include_dashboard"] is False and kwargs["object_store_memory"] <= 256 << 20


@pytest.mark.parametrize("address", ["auto", "ray://127.0.0.1:10001", "10.1.2.3:6379"])
def test_a_real_cluster_or_a_client_lets_ray_pick_the_node_address(address: str) -> None:
    kwargs = init_kwargs(address)
    assert "_node_ip_address" not in kwargs and "include_dashboard" not in kwargs


def test_gpus_are_declared_for_cuda_or_auto_on_a_gpu_cluster() -> None:
    assert uses_cuda("cuda", {}) and uses_cuda("cuda:1", {"CPU": 8})
    assert uses_cuda("auto", {"CPU": 8, "GPU": 2})
    assert not uses_cuda("auto", {"CPU": 8}) and not uses_cuda("cpu", {"GPU": 2})
