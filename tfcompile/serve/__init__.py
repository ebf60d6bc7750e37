"""``tfcompile serve``: bundles over HTTP (FastAPI + uvicorn, the optional ``serve`` extra).

``load_models`` checks each bundle as the runtime does (every check of bundle format 2);
``create_app`` (app.py) builds the ASGI application; ``serve`` runs it under uvicorn and drains on
SIGTERM: readiness turns false and new requests get 503 at once, the requests in flight finish,
then the process exits 0.
"""

from __future__ import annotations

import errno
import re
import signal
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from tfcompile.errors import UserError
from tfcompile.runtime import SessionOptions, load
from tfcompile.runtime.session import Bundle

try:
    import uvicorn

    from tfcompile.serve.app import Served, Settings, create_app
    from tfcompile.serve.protocol import BoundedHttpToolsProtocol
except ImportError as error:  # pragma: no cover - depends on the install
    raise UserError(
        f"tfcompile serve needs the serve extra ({error.name} is missing): pip install 'tfcompile[serve]'"
    ) from error

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

__all__ = ["Served", "Settings", "create_app", "listen", "load_models", "serve", "server_config"]


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound (not yet listening) before any bundle is loaded: a port in use
    is one line naming it (uvicorn logged it among its own lines and exited 3), not minutes into
    loading; uvicorn listens once the models are loaded, so that until then a connection is
    refused rather than left waiting."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = {
            errno.EADDRINUSE: "another server there? choose another --port",
            errno.EACCES: "ports below 1024 need privileges: choose another --port",
            errno.EADDRNOTAVAIL: "--host is not an address of this machine",
        }.get(
            e.errno or 0,
            "--host is not a name or address this machine resolves" if isinstance(e, socket.gaierror) else "",
        )
        raise UserError(
            f"cannot listen on {host}:{port}: {e.strerror or e}" + (f" ({why})" if why else "")
        ) from None
    return sock


def load_models(
    bundles: Sequence[str], providers: Sequence[str] | None = None, threads: int | None = None
) -> dict[str, Bundle]:
    """``PATH`` or ``NAME=PATH`` -> the loaded bundles by name (a path's name is its folder's).
    onnxruntime's threads do not spin between runs: the event loop needs the cores then."""
    models: dict[str, Bundle] = {}
    for given in bundles:
        name, _, path = given.partition("=") if "=" in given else ("", "", given)
        name = name or Path(path).resolve().name
        if not MODEL_NAME.fullmatch(name):
            raise UserError(
                f"{given}: {name!r} cannot name a model (ASCII letters, digits, '.', '_' and '-', at "
                f"most 64): give one as NAME=PATH"
            )
        if name in models:
            raise UserError(f"two bundles are named {name!r}: give one another name as NAME=PATH")
        models[name] = load(path, providers, SessionOptions(threads, spin=False))
    if not models:
        raise UserError("give at least one bundle to serve")
    return models


def server_config(served: Served, host: str, port: int, log_level: str) -> uvicorn.Config:
    """uvicorn's settings: its C event loop (uvloop) and HTTP parser (httptools) from the serve
    extra, where uvicorn's pure-Python ones would spend more of the cores on every request; the
    parser's protocol bounds each request's head in size and time (protocol.py)."""
    s = served.settings
    return uvicorn.Config(
        create_app(served),
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        loop="auto",
        http=BoundedHttpToolsProtocol.bounded(s.max_head_bytes, s.head_timeout_s),
        timeout_keep_alive=s.keep_alive_s,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining on the first SIGTERM: for ``drain_s`` seconds readiness is false
    and new work is refused (a load balancer takes the replica out), then uvicorn's own graceful
    shutdown finishes the requests in flight. A second signal, or Ctrl-C, stops at once."""

    def __init__(self, config: uvicorn.Config, served: Served, drain_s: float) -> None:
        super().__init__(config)
        self.served, self.drain_s = served, drain_s

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets and self.started:  # uvicorn says where it listens only on sockets it bound itself
            self._log_started_message(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.served.draining or sig == signal.SIGINT:
            return super().handle_exit(sig, frame)
        self.served.draining = True
        threading.Timer(self.drain_s, super().handle_exit, args=(sig, frame)).start()


def serve(
    models: dict[str, Bundle],
    settings: Settings,
    sock: socket.socket,
    drain_s: float = 1.0,
    log_level: str = "info",
) -> None:
    """Serve ``models`` on ``sock`` (``listen``) until SIGTERM or Ctrl-C; returns after a graceful
    shutdown."""
    served = Served(models, settings)
    host, port = sock.getsockname()[:2]
    server = DrainingServer(server_config(served, host, port, log_level), served, drain_s)
    # uvicorn re-raises the signal it stopped on once it is done; an empty handler lets it return.
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets=[sock])
