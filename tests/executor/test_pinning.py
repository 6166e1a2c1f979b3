"""Pinned host buffers: registrations after the first run on threads and are joined before the
run starts; a failure among them is an error, a failing first one the logged fallback. CUDA's
cudaHostRegister is replaced by a recorder, so this runs on the CPU."""

import threading

import pytest
import torch

from executor import host_memory


def _fake_register(codes):
    calls = []

    def register(t):
        calls.append((threading.current_thread().name, t.numel()))
        return codes[min(len(calls) - 1, len(codes) - 1)]

    return register, calls


def test_first_registration_inline_the_rest_on_threads(monkeypatch):
    register, calls = _fake_register([0])
    monkeypatch.setattr(host_memory, "_register", register)
    host = host_memory.HostMemory(pin=True)
    ts = [host.empty(n, torch.float32) for n in (10, 20, 30, 40)]
    host.wait()
    assert sorted(n for _, n in calls) == [10, 20, 30, 40]
    assert calls[0][0] == threading.current_thread().name
    assert all(name.startswith("pin") for name, _ in calls[1:])
    assert host.registered == ts


def test_a_later_failure_is_raised_by_wait(monkeypatch):
    register, _ = _fake_register([0, 0, 2])
    monkeypatch.setattr(host_memory, "_register", register)
    host = host_memory.HostMemory(pin=True)
    for n in (10, 20, 30):
        host.empty(n, torch.float32)
    with pytest.raises(RuntimeError, match="cudaHostRegister failed"):
        host.wait()
    host.registered.clear()


def test_a_failing_first_registration_falls_back(monkeypatch, caplog):
    register, calls = _fake_register([1])
    monkeypatch.setattr(host_memory, "_register", register)
    monkeypatch.setattr(torch, "empty", _no_pin(torch.empty))
    host = host_memory.HostMemory(pin=True)
    host.empty(10, torch.float32)
    host.empty(20, torch.float32)
    host.wait()
    assert len(calls) == 1 and not host.registered
    assert "cudaHostRegister failed" in caplog.text


def _no_pin(empty):
    def wrapped(*args, pin_memory=False, **kw):
        return empty(*args, **kw)  # no CUDA here: torch's pinned allocator stands in as pageable

    return wrapped
