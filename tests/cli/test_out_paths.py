"""Where ``--out`` and its work folder are checked before a run: an ``--out`` published
file by file inside it (a mount point, a parent this process cannot write) passes the
up-front check, and the work folder the path rules see is the one the run uses, long names
included."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from mechlingo.cli import paths
from mechlingo.cli.validate import check_out
from mechlingo.cli.work import work_folder
from mechlingo.core.errors import OutputError


def _parent_read_only(monkeypatch, parent: Path) -> None:
    """``parent`` unwritable for this process, as for a user without rights there (the
    tests run as root, for whom ``os.access`` says yes to every folder)."""
    real = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path).absolute() == parent.absolute() and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def test_an_existing_out_under_a_read_only_parent_passes(tmp_path, monkeypatch):
    """A container volume at ``/data`` (``/`` read-only): the outputs are published inside
    ``--out``, so only ``--out`` itself needs to be writable."""
    out = tmp_path / "volume"
    out.mkdir()
    _parent_read_only(monkeypatch, tmp_path)
    check_out(str(out))
    with pytest.raises(OutputError, match="is not writable"):
        check_out(str(tmp_path / "new"))  # a new folder cannot be made there


def test_the_path_rules_see_the_work_folder_the_run_uses(tmp_path):
    """A legal name near the 255-byte limit: the work folder's name is shortened the same
    way by the run and by the check that no command writes over what it reads."""
    for name in ("out", "é" * 125):
        args = argparse.Namespace(out=str(tmp_path / name), work=None)
        written = [p for flag, p in paths._writes(args) if flag == "--out"]
        assert work_folder(args) in written
        assert all(len(os.fsencode(p.name)) <= 255 for p in written)
