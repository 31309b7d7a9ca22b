"""A plain, non-editable install carries its migrations and page and works outside the checkout."""

from __future__ import annotations

import json
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import requests

from tests.processes import ROOT
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import run


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    result = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                 child_env(), timeout=300)
    assert result.returncode == 0, result.stderr
    (path,) = out.glob("collector-*.whl")
    return path


def test_wheel_contains_migrations_and_ui(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "collector/_alembic/env.py" in names
    assert "collector/_alembic/script.py.mako" in names
    assert any(n.startswith("collector/_alembic/versions/") and n.endswith(".py") for n in names)
    page = {f"collector/_ui/{path.name}" for path in (ROOT / "ui").iterdir() if path.is_file()}
    assert page and page <= names  # every file of the page, not only index.html
    assert not any(n.startswith("tests/") for n in names)


def test_installed_wheel_migrates_and_serves_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # Borrow this interpreter's dependencies without its .pth files, so the checkout's
    # editable install stays invisible and only the wheel provides `collector`.
    venv_site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], child_env())
    (Path(venv_site.stdout.strip()) / "_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    installed = run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], child_env(), timeout=300)
    assert installed.returncode == 0, installed.stderr
    where = run([python, "-c", "import collector; print(collector.__file__)"], child_env(), cwd=tmp_path)
    assert where.stdout.strip().startswith(str(venv)), where.stdout

    db = tmp_path / "state.db"
    upgraded = run([str(venv / "bin" / "collector"), "db", "upgrade", "--db", str(db)], child_env(), cwd=tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    server = ServerProcess([str(venv / "bin" / "collector"), "serve", "--port", "0", "--db", str(db)],
                           child_env(), cwd=tmp_path)
    try:
        page = requests.get(server.url + "/", timeout=5)
        assert page.status_code == 200 and "<html" in page.text
        assert requests.get(server.url + "/api/ready", timeout=5).json()["status"] == "ok"
    finally:
        server.stop()


def test_the_client_side_installs_alone_and_reads_from_a_collector(wheel, tmp_path, serve):
    # A login node: the wheel without the server's packages, with click (the readers' one dependency).
    import click

    api = serve(write_token="w-client", read_token="r-client")
    assert api.post("/api/jobs", json={"job_id": "7", "job_name": "n-7", "submitted_at": "2026-12-03T08:00:00Z",
                                       "cluster": "b200"}).status_code == 201
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    deps = tmp_path / "deps"
    deps.mkdir()
    (deps / "click").symlink_to(Path(click.__file__).parent)
    venv_site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], child_env())
    (Path(venv_site.stdout.strip()) / "_deps.pth").write_text(f"{deps}\n")
    installed = run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], child_env(), timeout=300)
    assert installed.returncode == 0, installed.stderr
    collector = str(venv / "bin" / "collector")
    env = child_env(COLLECTOR_ENDPOINT=api.url, SRTCTL_STATUS_READ_TOKEN="r-client")
    listed = run([collector, "jobs", "--json"], env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [job["job_id"] for job in json.loads(listed.stdout)["jobs"]] == ["7"]
    served = run([collector, "serve", "--port", "0"], env, cwd=tmp_path)
    assert served.returncode == 1
    assert served.stderr.startswith("Error: this command needs the collector's server packages (")
    assert served.stderr.rstrip().endswith("pip install 'collector[server]'")
