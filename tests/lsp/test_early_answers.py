"""Answers written by the worker thread (``SlayerProtocol.write_early``): whatever the order in which
the worker and the event loop (a cancel, a failure) get there, a request is answered exactly once."""

from __future__ import annotations

import json

import msgspec
import pytest
from lsprotocol import types as t

from slayer_lsp.lsp.protocol import WRITTEN_EARLY
from slayer_lsp.lsp.server import server
from slayer_lsp.lsp.transport import FrameParser

CANCELLED = t.ResponseError(code=t.LSPErrorCodes.RequestCancelled.value, message="cancelled")
FAILED = t.ResponseError(code=t.ErrorCodes.InternalError.value, message="failed")


class Wire:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        pass

    def messages(self) -> list[dict]:
        return [json.loads(f.body or b"null") for f in FrameParser().feed(self.data)]


# each step: "worker" (writes its answer), "worker-fails" (writes nothing), or what the loop sends
# ("loop-result": the handler's return value, "loop-cancel", "loop-error"); then the one answer
SCENARIOS = [
    ("answered by the worker", ["worker", "loop-result"], "result"),
    ("cancelled after the worker wrote", ["worker", "loop-cancel"], "result"),
    ("cancelled before the worker wrote", ["loop-cancel", "worker"], "cancelled"),
    ("the worker failed", ["worker-fails", "loop-error"], "failed"),
]


@pytest.fixture
def wire():
    """The shared server's protocol, writing to a buffer for the test and given back after it."""
    protocol = server.protocol
    before = protocol.writer
    buffer = Wire()
    protocol.set_writer(buffer)
    yield buffer
    protocol.writer = before


@pytest.mark.parametrize(("name", "steps", "answer"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_a_request_is_answered_once(wire, name, steps, answer):
    protocol = server.protocol
    token = protocol._ctx_msg_id.set(7)  # as pygls sets it around a request's handler
    try:
        msg_id = protocol.early_answer()
    finally:
        protocol._ctx_msg_id.reset(token)
    assert msg_id == 7
    result = msgspec.Raw(b'{"hits":[]}')
    returned = None
    for step in steps:
        if step == "worker":
            returned = WRITTEN_EARLY if protocol.write_early(msg_id, result) else result
        elif step == "worker-fails":
            protocol.end_early(msg_id)
        elif step == "loop-result":
            protocol._send_response(msg_id, returned)
        elif step == "loop-cancel":
            protocol._send_response(msg_id, error=CANCELLED)
        else:
            protocol._send_response(msg_id, error=FAILED)
    if "worker" in steps and steps[0] != "worker":
        protocol.end_early(msg_id)  # the worker's ``finally`` when it wrote nothing
    answers = [m for m in wire.messages() if m.get("id") == 7]
    assert len(answers) == 1, (name, answers)
    got = answers[0]
    if answer == "result":
        assert got["result"] == {"hits": []}
    else:
        assert got["error"]["message"] == answer, got
    assert not protocol._early, "a request's state outlived it"


def test_outside_a_request_nothing_is_registered():
    assert server.protocol.early_answer() is None
    assert not server.protocol._early
