"""Running the app: the exposure rules (loopback by default, a token anywhere else), uvicorn, and a SIGTERM
that drains (stop accepting, finish every accepted request, exit 0)."""
from __future__ import annotations

import ipaddress
import logging
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError
from .app import build_app, load_model
from .options import ServeOptions
from .service import Service

log = logging.getLogger("vitkit.serve")
TOKEN_ENV = "VITKIT_SERVE_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` exposes the server to this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def read_token(token_file: Optional[str] = None) -> Optional[str]:
    """The token from ``token_file`` (its first line), else from $VITKIT_SERVE_TOKEN, else None."""
    if token_file:
        path = Path(token_file)
        text = path.read_text(encoding="utf-8").strip()
        if not text:
            raise ConfigError("the token file is empty: put the token in it", path=path)
        if os.name == "posix" and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("--token-file %s can be read by other users (chmod 600 %s)", path, path)
        return text.splitlines()[0].strip()
    env = os.environ.get(TOKEN_ENV)
    if env is not None:
        if not env.strip():
            raise ConfigError("is set but empty", key=f"${TOKEN_ENV}")
        return env.strip()
    return None


def check_exposure(host: str, token: Optional[str], insecure: bool = False) -> None:
    """Refuse to bind a non-loopback address without a token, unless ``insecure`` is explicit."""
    if is_loopback(host) or token or insecure:
        if not is_loopback(host) and not token:
            log.warning("serving on %s without a token (--insecure): anyone who can reach it can use it", host)
        return
    raise ConfigError(f"--host {host} exposes the server beyond this machine, and no token is set: give "
                     f"--token-file PATH or ${TOKEN_ENV} (clients send 'Authorization: Bearer TOKEN'), or pass "
                     f"--insecure to serve without one")


def setup_logging(level: str = "info") -> None:
    logger = logging.getLogger("vitkit.serve")
    if not any(getattr(h, "_vitkit", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s vitkit serve %(levelname)s: %(message)s"))
        handler._vitkit = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level.upper())


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that a SIGTERM ends in exit code 0 once the drain is done (uvicorn
        re-raises the signal after its graceful shutdown, which would kill the process with it)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                log.info("SIGTERM: no new connections; finishing the requests already accepted")
                while signal.SIGTERM in self._captured_signals:
                    self._captured_signals.remove(signal.SIGTERM)

    return Server


def run(weights, *, host: str = "127.0.0.1", port: int = 8000, options: Optional[ServeOptions] = None,
        token_file: Optional[str] = None, insecure: bool = False, img_size: Optional[int] = None,
        offline: Optional[bool] = None, log_level: str = "info", access_log: bool = False,
        drain_timeout_s: float = 30.0) -> int:
    """Serve ``weights`` until SIGTERM / Ctrl+C; returns 0 after a clean drain, 1 if the model could not be
    made ready."""
    import uvicorn

    setup_logging(log_level)
    options = options or ServeOptions()
    token = options.token or read_token(token_file)
    check_exposure(host, token, insecure)
    options.token = token
    options.check()
    model = load_model(weights, img_size=img_size, offline=offline, device=options.device)
    service = Service(model, options)
    failure = {}
    server_box = {}

    def on_failure(message: str) -> None:
        failure["error"] = message
        if "server" in server_box:
            server_box["server"].should_exit = True

    app = build_app(service, on_failure=on_failure)
    config = uvicorn.Config(app, host=host.strip("[]"), port=port, access_log=access_log, log_level=log_level,
                            timeout_graceful_shutdown=drain_timeout_s, lifespan="on", server_header=False,
                            timeout_keep_alive=5)
    server = _server_class()(config)
    server_box["server"] = server
    log.info("serving %s on http://%s:%d (engine %s, %s; token %s)", service.model_id,
             f"[{host}]" if ":" in host else host, port, options.engine, options.dtype,
             "required" if token else "not required")
    server.run()
    if failure:
        raise ConfigError(f"the model could not be made ready: {failure['error']}")
    return 0
