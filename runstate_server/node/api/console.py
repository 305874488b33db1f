"""The web console: GET /console/ and its static files, served by every node.

The files (runstate_server/console/static/, built from console/ and committed) are read once when
the application is built, each bounded in size; they hold no data, so they are public (no key),
and node-local (never forwarded to the leader: they are the same on every node; routing.LOCAL_PATHS
and LOCAL_PREFIXES name them). The console
talks to the node it was loaded from with the published API and a key the user gives it.

These routes are not API: they are outside the OpenAPI document (app.ROUTES), and the auth
middleware finds them in CONSOLE_ROUTES as PUBLIC.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from runstate_server.node.api.routes import PUBLIC, Route, RouteTable

STATIC_DIR = Path(__file__).resolve().parent.parent.parent / "console" / "static"
CONSOLE_PATH = "/console/"
STATIC_PREFIX = "/console/static/"
# The files the build writes (console/build.mjs: fixed names) and their media types.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
CONSOLE_FILE_BYTES_MAX = 4 * 1024 * 1024  # one built file; the bundle is far smaller
# The console loads nothing from elsewhere (no CDN, no inline script or style).
CONTENT_SECURITY_POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    media_type: str
    etag: str


def load_files(folder: Path = STATIC_DIR) -> dict[str, StaticFile]:
    """The built files, read once; a missing one is left out (its route answers 404 NOT_FOUND)."""
    files: dict[str, StaticFile] = {}
    for name, media_type in FILES.items():
        path = folder / name
        try:
            with open(path, "rb") as source:
                body = source.read(CONSOLE_FILE_BYTES_MAX + 1)
        except FileNotFoundError:
            continue
        if len(body) > CONSOLE_FILE_BYTES_MAX:
            raise ValueError(f"{path} is larger than {CONSOLE_FILE_BYTES_MAX} bytes: not a console build")
        files[name] = StaticFile(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return files


CONSOLE_FILES_KEY: web.AppKey[dict[str, StaticFile]] = web.AppKey("console_files", dict)

routes = RouteTable()


def _answer(request: web.Request, name: str) -> web.StreamResponse:
    found = request.app[CONSOLE_FILES_KEY].get(name)
    if found is None:
        raise web.HTTPNotFound()
    headers = {**HEADERS, "ETag": found.etag}
    if found.etag in _etags(request.headers.get("If-None-Match", "")):
        return web.Response(status=304, headers=headers)
    response = web.Response(body=found.body, headers=headers)
    response.headers["Content-Type"] = found.media_type
    return response


def _etags(header: str) -> set[str]:
    return {tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()}


@routes("GET", "/", "Redirects to the console", permission=PUBLIC)
async def root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(CONSOLE_PATH)


@routes("GET", "/console", "Redirects to the console", permission=PUBLIC)
async def console_bare(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(CONSOLE_PATH)


@routes("GET", CONSOLE_PATH, "The console's page", permission=PUBLIC)
async def console_index(request: web.Request) -> web.StreamResponse:
    return _answer(request, "index.html")


@routes("GET", STATIC_PREFIX + "{name}", "The console's script and stylesheet", permission=PUBLIC)
async def console_static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name == "index.html" or name not in FILES:
        raise web.HTTPNotFound()
    return _answer(request, name)


CONSOLE_ROUTES: tuple[Route, ...] = tuple(routes)

