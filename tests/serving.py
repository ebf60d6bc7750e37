"""A tfcompile server on a free loopback port, in a thread of the test process, configured as
``tfcompile serve`` configures uvicorn."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import uvicorn

from tfcompile.serve import Served, Settings, load_models, server_config


class BackgroundServer:
    """``with BackgroundServer(bundles, settings) as server:`` serves until the block ends, then
    shuts down as on SIGTERM (in-flight requests finish)."""

    def __init__(self, bundles: dict[str, Path], settings: Settings | None = None) -> None:
        models = load_models([f"{name}={path}" for name, path in bundles.items()])
        self.served = Served(models, settings or Settings())
        self.server = uvicorn.Server(server_config(self.served, "127.0.0.1", 0, "warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not (self.server.started and self.served.ready):
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
