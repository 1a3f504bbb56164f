"""The dispatch point: torch on CPU by default, RADIXMESH_KERNELS forcing one, loud on bad values."""

import pytest
import torch

from radixmesh.kernels.dispatch import kernel_set, select


def test_cpu_tensors_default_to_the_torch_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXMESH_KERNELS", raising=False)
    assert select(torch.zeros(1)).name == "torch"


def test_forcing_torch_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXMESH_KERNELS", "torch")
    assert select(torch.zeros(1)).name == "torch"


def test_an_unknown_implementation_is_refused_with_the_valid_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXMESH_KERNELS", "cuda")
    with pytest.raises(ValueError, match=r"\['torch', 'triton'\]"):
        select(torch.zeros(1))
    with pytest.raises(ValueError, match="unknown kernel implementation"):
        kernel_set("cuda")


def test_forced_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXMESH_KERNELS", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        select(torch.zeros(1))


@pytest.mark.gpu
def test_cuda_tensors_default_to_triton_and_cross_device_copies_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXMESH_KERNELS", raising=False)
    assert select(torch.zeros(1, device="cuda")).name == "triton"
    assert select(torch.zeros(1, device="cuda"), torch.zeros(1)).name == "torch"
