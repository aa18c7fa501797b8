"""A request the DHT process cannot unpickle (its caller exited just after sending it) is dropped,
and the DHT goes on answering: hivemind's request loop let EOFError kill the DHT process, after
which a new averager waited for its first DHT answer forever (a CI hang)."""

from __future__ import annotations

import pickle

import pytest

from node.dht_node import start_loopback_dht


def _caller_gone() -> None:
    # what unpickling a request does when its caller's process exited while the DHT fetched the
    # caller's pipe: the caller's resource sharer closed the connection mid-handshake
    raise EOFError


def _unreadable() -> None:
    raise pickle.UnpicklingError("truncated")


class _Request:
    def __init__(self, rebuild: object) -> None:
        self.rebuild = rebuild

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return self.rebuild, ()


@pytest.mark.parametrize("rebuild", [_caller_gone, _unreadable], ids=["caller_gone", "unreadable"])
def test_the_dht_answers_after_a_request_it_cannot_read(rebuild: object) -> None:
    dht = start_loopback_dht()
    try:
        dht._outer_pipe.send(("get", [_Request(rebuild)], {}))
        # the next call is answered (nothing is stored under the key); a dead DHT answers nothing
        assert dht.get("hivenet-test-key", return_future=True).result(timeout=60) is None
        assert dht.is_alive()
    finally:
        dht.shutdown()
