"""The one place that makes the DRA plugin's gRPC servers: the transport's unix-socket server (socket mode
0600 before anyone connects, every connection dropped on close, and the limits of every served socket).

    server = GrpcServer(handlers)
    identity = await server.serve(path)
    await server.shut()
"""

from __future__ import annotations

from ascend_agent.deviceplugin.transport import BoundedServer as GrpcServer

__all__ = ["GrpcServer"]
