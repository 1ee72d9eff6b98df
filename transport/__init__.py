"""psrv.transport: frames on the wire, ZeroMQ sockets, mesh topology, controller and node roles, membership."""
