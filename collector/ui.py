"""The static single-page UI, served open at ``/`` and ``/index.html``."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint
from flask import send_from_directory

PACKAGE_DIR = Path(__file__).resolve().parent


def ui_dir() -> Path:
    """The page's files: inside the package when installed from a wheel, else the checkout's."""
    packaged = PACKAGE_DIR / "_ui"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent / "ui"


bp = Blueprint("ui", __name__)


@bp.get("/")
@bp.get("/index.html")
def index():
    """The page; it holds no data, so it needs no token."""
    response = send_from_directory(ui_dir(), "index.html", max_age=0)
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response
