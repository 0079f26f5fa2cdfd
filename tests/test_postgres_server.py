"""The tests' throwaway PostgreSQL server (conftest.postgres_server) lets no one in without its password: trusting
loopback or the Slurm nodes' subnet would let any local user run commands as the server's OS user."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import PG_PREFIX, postgres_server, require_module


def test_the_throwaway_postgresql_server_refuses_every_connection_without_its_random_password(postgres_url):
    psycopg = require_module("psycopg", "tune")
    # the session's server (conftest.postgres_url) runs already, its passfile named: a second server beside it
    sessions = os.environ["PGPASSFILE"]
    with postgres_server(clients="10.99.0.0/24") as url:
        # without the password (no passfile, or a wrong password): refused
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(url, connect_timeout=30, passfile=os.devnull)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(url, connect_timeout=30, password="postgres", passfile=os.devnull)
        # with it, from the passfile PGPASSFILE names (never in the URL): in
        passfile = os.environ["PGPASSFILE"]
        assert passfile != sessions and stat.S_IMODE(os.stat(passfile).st_mode) == 0o600
        assert ":" not in url.removeprefix("postgresql://").split("@")[0]
        with psycopg.connect(url, connect_timeout=30) as conn:
            rules = conn.execute("SELECT type, address, auth_method FROM pg_hba_file_rules").fetchall()
        assert ("host", "10.99.0.0", "scram-sha-256") in rules, rules  # the nodes' subnet, as the Slurm test asks for it
        assert {method for *_, method in rules} == {"scram-sha-256"}, f"a route in without the password: {rules}"
        password = Path(passfile).read_text().strip().rsplit(":", 1)[1]
        assert Path(sessions).read_text().strip().rsplit(":", 1)[1] != password, "each server has its own"
    assert not os.path.exists(passfile), "the passfile goes with its server"
    assert os.environ["PGPASSFILE"] == sessions, "the passfile named before is named again"
    psycopg.connect(postgres_url, connect_timeout=30).close()  # and lets this process into the session's server


def test_a_server_whose_test_session_was_killed_is_stopped_and_removed_by_the_next_start(postgres_url):
    import psutil

    # a process that starts a server and is SIGKILLed inside the block, as a test session a timeout kills: its `finally`
    # never runs, and the server outlives it
    tests = Path(__file__).parent
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nsys.path.insert(0, sys.argv[1])\nfrom conftest import postgres_server\n"
                              "with postgres_server():\n    print('up', flush=True)\n    time.sleep(300)", str(tests)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        (root,) = [d for d in Path(tempfile.gettempdir()).glob(PG_PREFIX + "*") if (d / "owner").read_text() == str(child.pid)]
        postmaster = psutil.Process(int((root / "data" / "postmaster.pid").read_text().split()[0]))
    finally:
        child.kill()
        child.wait()
    assert postmaster.is_running()
    with postgres_server():  # the next start stops the orphan and removes its folder; its own server is left alone
        _, left = psutil.wait_procs([postmaster], timeout=30)
        assert not left and not root.exists()
    psycopg = require_module("psycopg", "tune")
    psycopg.connect(postgres_url, connect_timeout=30).close()  # the session's server, whose owner lives, runs on
