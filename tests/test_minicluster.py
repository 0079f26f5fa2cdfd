"""`fleetrl minicluster` is safe to run as root on a machine other users share: its files live in a folder only root can
write; a folder, record or link another user made is refused and never acted on; `down` removes only what the cluster
made; a failed or killed `up` ends with one paragraph and leaves nothing running. Each test runs the real daemons as
root, against folders that the user `nobody` really owns."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from fleetrl.processes import pid_alive
from fleetrl.tools import minicluster, minicluster_host

from conftest import fleetrl_env, require_slurm, run_fleetrl_in_process

pytestmark = pytest.mark.slurm
TMP = Path(tempfile.gettempdir())  # /tmp: anyone can make a folder here first; munged wants its folders searchable by all


def cli(*args: str, cwd: str | Path | None = None, timeout: float = 120, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "fleetrl", "minicluster", *args], capture_output=True, text=True,
                          timeout=timeout, env=fleetrl_env(), cwd=cwd)


def in_process(*args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``fleetrl minicluster ARGS`` in this process (no process start): for refusals, `status` and `down`, whose code is
    the same wherever it runs. A successful `up` stays a process of its own, as its daemons outlive it."""
    return run_fleetrl_in_process("minicluster", *args, cwd=cwd)


def refused(proc: subprocess.CompletedProcess, *said: str) -> None:
    """The command failed with one paragraph saying each of ``said``, and no traceback."""
    assert proc.returncode == 2 and proc.stderr.startswith("fleetrl: error:"), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    text = " ".join(proc.stderr.split())
    for words in said:
        assert words in text, f"{words!r} not in: {text}"


def nobody() -> pwd.struct_passwd:
    return pwd.getpwnam("nobody")


def give_to_nobody(*paths: Path) -> None:
    for path in paths:
        os.lchown(path, nobody().pw_uid, nobody().pw_gid)


def daemons_naming(folder: Path) -> list[psutil.Process]:
    """munged, slurmctld or slurmd processes whose command line names ``folder``."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] in minicluster.DAEMONS and any(f"{folder}/" in a for a in proc.info["cmdline"] or ()):
            found.append(proc)
    return found


@contextlib.contextmanager
def cluster_cleanup(folder: Path, remove: bool = True):
    """However the test ends, nothing of a cluster in ``folder`` stays: `down`, then any daemon left killed and (with
    ``remove``) the folder removed, where the code under test failed to."""
    try:
        yield
    finally:
        in_process("down", "--dir", str(folder))
        for proc in daemons_naming(folder):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        minicluster.reap_abandoned()
        if remove:
            shutil.rmtree(folder, ignore_errors=True)


def new_folder_in_tmp(name: str) -> Path:
    """A path in /tmp that does not exist yet (the cluster makes it)."""
    path = TMP / f"fmc-test-{os.getpid()}-{name}"
    assert not os.path.lexists(path)
    return path


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


# ---- the folder -------------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_up_by_default_keeps_its_munge_key_in_a_root_only_folder_not_in_the_tmp_folder_another_user_made_first():
    require_slurm()
    old_default = TMP / "fleetrl-minicluster"  # fleetrl's old default: any user can make it before root's first `up`
    default = minicluster.DEFAULT_DIR
    assert not os.path.lexists(old_default), f"{old_default} exists already: remove it to run this test"
    assert not os.path.lexists(default), f"a cluster runs in {default}: stop it (sudo fleetrl minicluster down) to run this test"
    old_default.mkdir()
    (old_default / "planted").write_text("the attacker's\n")
    give_to_nobody(old_default, old_default / "planted")
    old_default.chmod(0o777)
    try:
        with cluster_cleanup(default):
            up = cli("up", "--nodes", "1")
            assert up.returncode == 0, up.stderr
            assert f"export SLURM_CONF={default}/etc/slurm.conf" in up.stdout and "down --dir" not in up.stdout, up.stdout
            for path, mode in ((default.parent, 0o755), (default, 0o755), (default / "munge-key", 0o700), (default / "munge-key" / "munge.key", 0o400)):
                st = os.lstat(path)
                assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == mode, (path, st)
            assert sorted(os.listdir(old_default)) == ["planted"], "nothing of the cluster in the folder another user made"
            down = cli("down")
            assert down.returncode == 0, down.stderr
        assert not os.path.lexists(default), "down removed the folder it made"
        assert sorted(os.listdir(old_default)) == ["planted"], "down left the other user's folder alone"
    finally:
        shutil.rmtree(old_default, ignore_errors=True)


def _owned_by_nobody(tmp: Path) -> tuple[Path, Path]:
    folder = tmp / "nobodys"
    folder.mkdir()
    give_to_nobody(folder)
    return folder, folder


def _inside_nobodys_folder(tmp: Path) -> tuple[Path, Path]:
    folder = tmp / "nobodys"
    folder.mkdir(mode=0o755)
    give_to_nobody(folder)
    return folder / "cluster", folder  # nobody could swap what is inside once root has checked it


def _nobodys_link_to_roots_empty_folder(tmp: Path) -> tuple[Path, Path]:
    target = tmp / "roots"
    target.mkdir(mode=0o755)
    link = tmp / "link"
    link.symlink_to(target)
    give_to_nobody(link)  # another user's link: pointed elsewhere between `up` and `down`
    return link, target


def _writable_by_all(tmp: Path) -> tuple[Path, Path]:
    folder = tmp / "open"
    folder.mkdir()
    folder.chmod(0o777)
    return folder, folder


def _with_files_in_it(tmp: Path) -> tuple[Path, Path]:
    folder = tmp / "full"
    folder.mkdir(mode=0o755)
    (folder / "thesis.tex").write_text("years of work\n")
    return folder, folder


def _a_path_slurm_conf_cannot_carry(tmp: Path) -> tuple[Path, Path]:
    return tmp / "with space", tmp


@pytest.mark.timeout(180)
@pytest.mark.parametrize("make, said", [
    (_owned_by_nobody, "belongs to nobody (uid"),
    (_inside_nobodys_folder, "belongs to nobody (uid"),
    (_nobodys_link_to_roots_empty_folder, "is a symbolic link of nobody (uid"),
    (_writable_by_all, "can be written by everyone (mode 777)"),
    (_with_files_in_it, "has files in it already"),
    (_a_path_slurm_conf_cannot_carry, "which slurm.conf cannot carry in a path"),
], ids=["owned-by-nobody", "inside-nobodys-folder", "nobodys-link", "writable-by-all", "with-files", "space-in-path"])
def test_up_refuses_a_dir_another_user_owns_or_could_swap_or_that_has_files_and_writes_nothing_there(make, said):
    require_slurm()
    tmp = Path(tempfile.mkdtemp(prefix="fmc-test-"))  # root's, in /tmp, as an attacker's folder beside it would be
    try:
        folder, watched = make(tmp)
        before = sorted(os.listdir(watched))
        with cluster_cleanup(folder):
            up = in_process("up", "--nodes", "1", "--dir", str(folder))
            refused(up, said)
            assert sorted(os.listdir(watched)) == before, "nothing written into the folder"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.timeout(180)
def test_down_removes_only_what_the_cluster_made_in_the_empty_dir_it_was_given_and_the_dir_it_made():
    require_slurm()
    given = Path(tempfile.mkdtemp(prefix="fmc-test-given-"))  # the user's own empty folder
    given.chmod(0o755)
    made = new_folder_in_tmp("made")
    try:
        for folder in (given, made):
            with cluster_cleanup(folder, remove=folder == made):
                up = cli("up", "--nodes", "1", "--dir", str(folder))
                assert up.returncode == 0, up.stderr
                assert f"down --dir {folder}" in up.stdout
                if folder == given:
                    (given / "notes.txt").write_text("the user's, put here while the cluster ran\n")
                down = in_process("down", "--dir", str(folder))
                assert down.returncode == 0, down.stderr
        assert sorted(os.listdir(given)) == ["notes.txt"], "the given folder keeps what the cluster did not make"
        assert not os.path.lexists(made), "the folder the cluster made is gone"
    finally:
        shutil.rmtree(given, ignore_errors=True)


@pytest.mark.timeout(180)
def test_a_cluster_folder_named_with_shell_characters_starts_and_runs_nothing_of_its_name(tmp_path):
    require_slurm()
    folder = new_folder_in_tmp("$(touch${IFS}injected);x&y")  # slurm.conf carries it; a shell string must quote it
    with cluster_cleanup(folder):
        up = cli("up", "--nodes", "1", "--dir", str(folder), cwd=tmp_path)
        assert up.returncode == 0, up.stderr
        assert not (tmp_path / "injected").exists(), "the folder's name ran as a command"
        hostname = subprocess.run(["srun", "--nodes=1", "hostname"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                                  env={**os.environ, "SLURM_CONF": str(folder / "etc" / "slurm.conf")})
        assert hostname.returncode == 0 and hostname.stdout.strip() == "node1", hostname
    assert not os.path.lexists(folder)


# ---- what a record names ------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_down_acts_on_nothing_that_a_record_another_user_wrote_names(tmp_path):
    require_slurm()
    victim = tmp_path / "victim"  # what a forged cluster.json points `down` at: a folder, a link, a process of root's
    victim.mkdir()
    (victim / "data").write_text("precious\n")
    process = subprocess.Popen(["bash", "-c", f'exec -a "munged {victim}/" sleep 600'], start_new_session=True)
    try:
        subprocess.run(["ip", "link", "add", "fmcvictim0", "type", "bridge"], check=True, capture_output=True)
        forged = tmp_path / "forged"
        forged.mkdir()
        node = {"name": "node1", "address": "10.77.200.11", "netns": "fleetrl-mc200-node1", "veth": "fmcvictim0", "cpus": "0", "pid": process.pid}
        (forged / "cluster.json").write_text(json.dumps({
            "root": str(victim), "tag": 200, "bridge": "fmcvictim0", "controller": "x", "controller_address": "10.77.200.1", "ctld_port": 1,
            "nodes": [node], "pids": {"munged": process.pid}}))
        give_to_nobody(forged, forged / "cluster.json")
        down = in_process("down", "--dir", str(forged))
        refused(down, "belongs to nobody (uid", "is not root's alone")
        assert process.poll() is None, "the process it names was not signalled"
        assert (victim / "data").read_text() == "precious\n", "the folder it names was not removed"
        assert link_exists("fmcvictim0"), "the link it names was not deleted"
    finally:
        process.kill()
        subprocess.run(["ip", "link", "delete", "fmcvictim0"], capture_output=True)


@pytest.mark.timeout(180)
def test_an_old_or_edited_cluster_record_is_one_paragraph_and_down_still_stops_the_cluster_by_its_tag():
    require_slurm()
    folder = new_folder_in_tmp("edited")
    subprocess.run(["ip", "link", "add", "fmcdecoy0", "type", "bridge"], check=True, capture_output=True)
    try:
        with cluster_cleanup(folder):
            up = cli("up", "--nodes", "1", "--dir", str(folder))
            assert up.returncode == 0, up.stderr
            record = json.loads((folder / "cluster.json").read_text())
            daemons = daemons_naming(folder)
            assert len(daemons) == 3, daemons  # munged, slurmctld, one slurmd
            edits = [({k: v for k, v in record.items() if k != "nodes"}, "KeyError: 'nodes'"),
                     ({**record, "nodes": [{"name": 1}]}, "TypeError"),
                     ({**record, "nodes": [[1, 2]]}, "TypeError"),
                     ({**record, "bridge": "fmcdecoy0"}, "the bridge is 'fmcdecoy0', not 'fmc")]
            for edited, said in edits:
                (folder / "cluster.json").write_text(json.dumps(edited))
                refused(in_process("status", "--dir", str(folder)), said, "is not a record of a cluster this fleetrl started",
                        f"sudo fleetrl minicluster down --dir {folder}")
            # the last edit stays: down stops the cluster that the registry holds for the folder, by its tag's names
            down = in_process("down", "--dir", str(folder))
            assert down.returncode == 0, down.stderr
            assert link_exists("fmcdecoy0"), "the link the edited record names is not deleted"
            assert not link_exists(minicluster_host.bridge_name(record["tag"])), "the cluster's own bridge is"
            assert not [p for p in daemons if pid_alive(p.pid, p.create_time())], "every daemon stopped"
            assert not os.path.lexists(folder)
    finally:
        subprocess.run(["ip", "link", "delete", "fmcdecoy0"], capture_output=True)


# ---- a failed or killed up --------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_up_without_cap_net_admin_ends_with_one_paragraph_not_a_hang_and_leaves_nothing():
    require_slurm()
    folder = new_folder_in_tmp("no-net-admin")
    # as in a container without CAP_NET_ADMIN: root, but `ip link add` is refused
    no_net_admin = ("setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin")
    with cluster_cleanup(folder):
        up = cli("up", "--nodes", "1", "--dir", str(folder), prefix=no_net_admin, timeout=60)
        refused(up, "`ip link add fmc", "Operation not permitted", "CAP_NET_ADMIN")
        assert not os.path.lexists(folder), "the folder it made is removed"
        assert all(info["root"] != str(folder) for info in minicluster_host.registered().values()), "its tag is free again"
        assert not daemons_naming(folder)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("running", ["munged", "slurmctld"])
def test_an_up_killed_outright_while_starting_its_daemons_leaves_nothing_running_after_the_next_start(running):
    require_slurm()
    folder = new_folder_in_tmp(f"killed-{running}")
    with cluster_cleanup(folder):
        # a test run killed outright (SIGKILL) while its cluster starts: the next start removes what it left
        up = subprocess.Popen([sys.executable, "-c", "import os, sys, time\nfrom fleetrl.tools import minicluster\n"
                               "minicluster.start(sys.argv[1], nodes=1, owner_pid=os.getpid())\ntime.sleep(600)", str(folder)],
                              env=fleetrl_env(), start_new_session=True)
        deadline = time.monotonic() + 60
        while not any(p.info["name"] == running for p in daemons_naming(folder)):
            assert up.poll() is None and time.monotonic() < deadline, f"{running} did not start"
            time.sleep(0.002)
        up.send_signal(signal.SIGKILL)
        up.wait()
        assert daemons_naming(folder), "the killed start left daemons running"
        minicluster.reap_abandoned()  # what the next `up` does first
        assert not daemons_naming(folder), "the next start stopped every daemon the killed one started"
        assert not os.path.lexists(folder)


@pytest.mark.timeout(120)
def test_a_controller_that_never_answers_ends_the_start_in_one_paragraph_on_time_and_leaves_nothing(tmp_path, monkeypatch):
    require_slurm()
    folder = new_folder_in_tmp("hung-scontrol")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexec sleep 600\n")  # the start's `scontrol ping` never answers
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setattr(minicluster, "START_TIMEOUT_S", 3.0)
    with cluster_cleanup(folder):
        with monkeypatch.context() as hung:
            hung.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
            began = time.monotonic()
            with pytest.raises(minicluster.MiniClusterError) as failed:
                minicluster.start(folder, nodes=1)
            took = time.monotonic() - began
        # each probe gets the time left, not Slurm's own 30 s: the wait ends at its 3 s (a generous guard for the setup)
        assert took < 25, f"the start took {took:.1f} s with 3 s to wait for slurmctld"
        said = " ".join(str(failed.value).split())
        assert "The mini Slurm cluster did not start: waiting for slurmctld to answer, not within 3 s" in said, said
        assert "slurmctld" in said.split("The ends of the daemons' logs")[1], "the paragraph brings the daemons' logs"
        assert not daemons_naming(folder), "a failed start stops what it started"
        assert not os.path.lexists(folder)


def test_an_ip_or_slurmd_that_hangs_is_one_clear_error_not_a_traceback(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ip", "slurmd"):  # a network stack or a Slurm install that hangs instead of answering
        (bin_dir / tool).write_text("#!/bin/sh\nexec sleep 600\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(minicluster_host, "COMMAND_TIMEOUT_S", 0.3)  # the fakes never answer: any limit is reached
    with pytest.raises(minicluster.MiniClusterError, match=r"`ip link show` did not finish within 0\.3 s\. .*CAP_NET_ADMIN"):
        minicluster_host.ip("link", "show")
    with pytest.raises(minicluster.MiniClusterError, match=r"`slurmd -C`, which describes .* did not finish within 0\.3 s\. .*slurmd -C"):
        minicluster._hardware()


def test_the_nodes_get_cores_of_the_allocation_never_a_cpu_outside_it():
    """In a cpuset without CPU 0 (docker --cpuset-cpus=1, a Slurm step) a node given CPU 0 binds no task: every job on
    it failed with `task_g_set_affinity: Invalid argument`. Each node's CPUs come from the allowed ones; the rest are
    its CpuSpecList."""
    two_cpus = {"CPUs": 2, "ThreadsPerCore": 1}
    assert minicluster.split_cpus(two_cpus, 2, {0, 1}) == [("0", "1"), ("1", "0")]  # a core each
    assert minicluster.split_cpus(two_cpus, 2, {1}) == [("1", "0"), ("1", "0")]  # one allowed core: shared, CPU 0 held back
    eight_threads = {"CPUs": 8, "ThreadsPerCore": 2}  # 4 cores of 2 threads, Slurm numbering a core's threads together
    assert minicluster.split_cpus(eight_threads, 2, set(range(2, 8))) == [("2-3", "0-1,4-7"), ("4-5", "0-3,6-7")]
    for nodes in (1, 2, 3):
        for cpus, _ in minicluster.split_cpus(eight_threads, nodes, {5, 6}):
            assert set(slurm_cpu_ids(cpus)) <= {5, 6}, cpus


def slurm_cpu_ids(text: str) -> list[int]:
    ids = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ids += range(int(low), int(high or low) + 1)
    return ids
