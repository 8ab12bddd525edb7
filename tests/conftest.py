"""Shared fixtures of the unit tests."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_cpu_thread():
    """The test models are tiny: each step is a few small matrix products, where a second CPU
    thread only adds synchronisation (10x slower on a busy 2-core machine). Run the unit tests
    on one thread and restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # the first optimizer built in a process pays a one-off lazy import (about 1-2 s here);
    # pay it once, so no single test is charged for it
    torch.optim.Adam(torch.nn.Linear(1, 1).parameters())
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_device_check(monkeypatch):
    """The root conftest turns the notebooks' device check on for the whole process (the
    kernels nbval starts inherit it); unit tests call `setup()` too, so switch it off for each
    of them, and remove a check a test installed."""
    from course import devicecheck

    monkeypatch.delenv("SEQ_DEVICE_CHECK", raising=False)
    monkeypatch.delenv("SEQ_DEVICE", raising=False)
    yield
    devicecheck.remove()
