"""Reading a run's TensorBoard logs back (fleetrl/monitor/tbread.py): a folder that is gone is one paragraph, and a resumed
run's event file is read after the interrupted run's, whenever it began."""

from __future__ import annotations

import shutil

import pytest

from fleetrl.errors import FleetError
from fleetrl.monitor.logger import Logger
from fleetrl.monitor.tbread import read_scalars, read_text, scalar_tags


@pytest.mark.parametrize("read", [lambda d: read_scalars(d, "charts/episodic_return"), scalar_tags, read_text],
                         ids=["read_scalars", "scalar_tags", "read_text"])
def test_a_run_folder_deleted_before_it_is_read_is_named_in_one_paragraph(tmp_path, read):
    run_dir = tmp_path / "runs" / "gone"
    run_dir.mkdir(parents=True)
    shutil.rmtree(run_dir)  # as `rm -rf` of a run while `fleetrl plot` reads the runs folder
    with pytest.raises(FleetError, match="is gone: it was deleted or moved") as error:
        read(run_dir)
    assert str(run_dir) in str(error.value)


def test_a_run_resumed_within_the_second_its_interrupted_run_began_keeps_every_step(tmp_path):
    # TensorBoard reads event files in name order: the second each was opened in, then host and pid. The interrupted
    # run's file is given a pid that sorts after any other, as a resumed run's lower pid would in the same second
    run_dir = tmp_path / "run"
    interrupted = Logger(str(run_dir))
    for step in range(1, 6):
        interrupted.scalar("charts/x", float(step), step)
    interrupted.close()
    (old,) = run_dir.glob("events.out.tfevents.*")
    second, host = old.name.split(".")[3:5]
    old.rename(run_dir / f"events.out.tfevents.{second}.{host}.99999999.0")

    resumed = Logger(str(run_dir), purge_step=4)  # its checkpoint was at step 3: 4 and 5 are written again
    for step in range(4, 8):
        resumed.scalar("charts/x", float(step), step)
    resumed.close()
    assert [p.step for p in read_scalars(run_dir, "charts/x")] == [1, 2, 3, 4, 5, 6, 7]
