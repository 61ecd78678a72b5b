"""Import the preflight module and its module_utils the way Ansible resolves them."""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import ModuleType

import ansible.module_utils
import pytest

ROOT = Path(__file__).resolve().parents[3]

# Ansible finds project module_utils as ansible.module_utils.<name>; so do these tests.
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))


def _load_library(name: str) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "library" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def link_facts() -> ModuleType:
    import ansible.module_utils.sparkring_link_facts as module

    return module


@pytest.fixture(scope="session")
def preflight() -> ModuleType:
    return _load_library("sparkring_preflight")


class _UnixHTTPServer(HTTPServer):
    address_family = socket.AF_UNIX

    def server_bind(self):
        self.socket.bind(self.server_address)

    def get_request(self):
        conn, _ = self.socket.accept()
        return conn, ("local", 0)


# What a stand-in for dockerd answers a GET for a path: (HTTP status, body).
DockerReply = Callable[[str], tuple[int, bytes]]


@pytest.fixture
def docker_api(tmp_path: Path) -> Iterator[Callable[[DockerReply], str]]:
    """dockerd's API as preflight reaches it, over a unix socket: `docker_api(reply)` serves every GET
    with reply(path) and returns the socket's path; the server stops with the test."""
    servers: list[_UnixHTTPServer] = []

    def serve(reply: DockerReply) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                status, body = reply(self.path)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        path = str(tmp_path / f"docker{len(servers)}.sock")
        server = _UnixHTTPServer(path, Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return path

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()
