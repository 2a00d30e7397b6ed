"""The one place that makes the DRA plugin's gRPC servers: the device plugin's unix-socket server (socket
mode 0600 before anyone connects, every connection dropped on close).

    server = GrpcServer(handlers)
    identity = await server.serve(path)
    await server.shut()
"""

from __future__ import annotations

from ascend_agent.deviceplugin.lifecycle import _Server as GrpcServer

__all__ = ["GrpcServer"]
