"""Reading a run's TensorBoard logs back (fleetrl/monitor/tbread.py): a folder that is gone is one paragraph."""

from __future__ import annotations

import shutil

import pytest

from fleetrl.errors import FleetError
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
