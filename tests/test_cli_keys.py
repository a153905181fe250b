"""`harness tune --keys`: every study key with its type, default and meaning, short enough
for a terminal; nothing run, nothing created."""

from __future__ import annotations

import os

import pytest

from training_harness.cli.main import main
from training_harness.study.keys import study_keys


def test_tune_keys_prints_every_key(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["tune", "--keys"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    flat = " ".join(out.split())
    for key in study_keys():
        assert f"  {key.path}: {key.type} = {key.default}" in lines, key.path
        assert f"{key.default} {key.doc}" in flat, key.path  # the meaning under its key
    assert "[budget]: The time and memory" in out
    assert max(map(len, lines)) <= 80
    assert os.listdir(tmp_path) == []  # no run folder, nothing launched


def test_tune_keys_of_one_section(capsys):
    assert main(["tune", "--keys", "budget"]) == 0
    out = capsys.readouterr().out
    assert "  budget.time: str | float = \"1h\"" in out
    assert "layout." not in out and "  name:" not in out
    assert main(["tune", "--keys", "strategies"]) == 0
    assert "strategies.<name>.always: bool = false" in capsys.readouterr().out


def test_tune_keys_of_an_unknown_section_is_refused(capsys):
    assert main(["tune", "--keys", "budgets"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--keys budgets: no such section" in err and "budget, " in err


def test_tune_help_names_keys(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["tune", "--help"])
    assert stop.value.code == 0
    assert "--keys [SECTION]" in capsys.readouterr().out
