"""Shared fixtures. No test touches the network: sockets to anything but loopback are refused."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

_real_connect = socket.socket.connect


def _guarded_connect(self, address):  # pragma: no cover - exercised only by a misbehaving test
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and (host.startswith("127.") or host in {"localhost", "::1"} or "/" in host):
        return _real_connect(self, address)
    raise RuntimeError(f"tests must not touch the network (tried to connect to {address!r})")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Refuse every non-loopback connection for the duration of each test."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The folder of real traces (KVDRO_DATA_DIR, else ../shared/data); skip if neither exists."""
    configured = os.environ.get("KVDRO_DATA_DIR")
    path = Path(configured) if configured else SHARED_DATA
    if not path.is_dir():
        pytest.skip(f"real traces not available: set KVDRO_DATA_DIR (looked in {path})")
    return path


@pytest.fixture
def rng():
    """A seeded generator: every random test is reproducible."""
    import numpy as np

    return np.random.default_rng(20261129)
