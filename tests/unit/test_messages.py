"""The message catalogue: versioned, complete, and dispatched to on_<op> handlers."""

from __future__ import annotations

from psrv.server.controller_machine import ControllerMachine
from psrv.server.node_machine import NodeMachine
from psrv.transport.messages import CATALOGUE, PROTOCOL_VERSION, Message, Op, handler_table


def test_every_op_has_a_schema() -> None:
    assert set(CATALOGUE) == set(Op)
    for schema in CATALOGUE.values():
        assert 0 <= schema.min_buffers <= schema.max_buffers
        assert not {"v", "op", "src"} & set(schema.fields)


def test_header_carries_version_op_and_sender() -> None:
    h = Message(Op.LEAVE, {"reason": "x"}, src=5).header()
    assert h == {"v": PROTOCOL_VERSION, "op": "leave", "src": 5, "reason": "x"}


def test_handler_table_maps_ops_to_on_methods() -> None:
    class Owner:
        def on_leave(self, *a):
            return "left"  # noqa: E704

    table = handler_table(Owner())
    assert set(table) == {Op.LEAVE}
    assert table[Op.LEAVE]() == "left"


def test_roles_handle_what_they_should() -> None:
    controller_ops = set(ControllerMachine.ACCEPTS)
    node_ops = {op for op in Op if hasattr(NodeMachine, f"on_{op.value}")}
    assert controller_ops == {
        Op.JOIN,
        Op.UPDATE,
        Op.UPDATES,
        Op.PARAMS_REQUEST,
        Op.HEARTBEAT,
        Op.LEAVE,
        Op.STATUS_REQUEST,
    }
    assert node_ops == {
        Op.JOIN_REPLY,
        Op.MESH,
        Op.UPDATE,
        Op.UPDATES,
        Op.PARAMS_REPLY,
        Op.HEARTBEAT,
        Op.EVICTED,
        Op.SHUTDOWN,
    }
