"""The static single-page UI: the page and its scripts and styles, served open (they hold no data)."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint
from flask import Response
from flask import request
from flask import send_from_directory

from collector.openapi import PAGE
from collector.openapi import operation

PACKAGE_DIR = Path(__file__).resolve().parent
# Every file of the page, by URL path, with its type: declared, not guessed from the
# platform's mimetypes table (which maps .js differently across systems); Flask adds
# "; charset=utf-8". guard.py lists the same paths as open.
HTML = "text/html"
SCRIPT = "text/javascript"
STYLE = "text/css"
FILES = {
    "/": ("index.html", HTML),
    "/index.html": ("index.html", HTML),
    "/app.css": ("app.css", STYLE),
    "/util.js": ("util.js", SCRIPT),
    "/client.js": ("client.js", SCRIPT),
    "/live.js": ("live.js", SCRIPT),
    "/blobs.js": ("blobs.js", SCRIPT),
    "/state.js": ("state.js", SCRIPT),
    "/table.js": ("table.js", SCRIPT),
    "/clusters.js": ("clusters.js", SCRIPT),
    "/detail.js": ("detail.js", SCRIPT),
    "/feed.js": ("feed.js", SCRIPT),
    "/app.js": ("app.js", SCRIPT),
}
# The page may call any collector (#api=), but loads nothing from anywhere else and runs
# no inline code, so even a rendering bug cannot run a job's text as script.
# connect-src stays open because the API origin is the viewer's to choose. That is safe for
# the tokens: client.js keeps each token under the origin it was entered for and sends it
# only in requests to that origin (checked on each request's URL), and a link naming
# another origin switches only after the viewer says so on the page.
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src *; "
          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def ui_dir() -> Path:
    """The page's files: inside the package when installed from a wheel, else the checkout's."""
    packaged = PACKAGE_DIR / "_ui"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent / "ui"


bp = Blueprint("ui", __name__)


@bp.get("/")
@bp.get("/index.html")
@operation(responses={200: {"text/html": PAGE}})
def index() -> Response:
    """The page; it holds no data, so it needs no token."""
    return _send(request.path)


@bp.get("/app.css")
@operation(responses={200: {"text/css": PAGE}})
def style() -> Response:
    """The page's style sheet; open like the page."""
    return _send(request.path)


@bp.get("/util.js")
@bp.get("/client.js")
@bp.get("/live.js")
@bp.get("/blobs.js")
@bp.get("/state.js")
@bp.get("/table.js")
@bp.get("/clusters.js")
@bp.get("/detail.js")
@bp.get("/feed.js")
@bp.get("/app.js")
@operation(responses={200: {"text/javascript": PAGE}})
def script() -> Response:
    """One of the page's scripts; open like the page."""
    return _send(request.path)


def _send(path: str) -> Response:
    name, mimetype = FILES[path]
    # max_age=0: a browser revalidates (ETag) on every load, so a new release shows at once.
    response = send_from_directory(ui_dir(), name, mimetype=mimetype, max_age=0)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Content-Security-Policy"] = POLICY
    return response
