"""The environment record every result carries: versions, variables, no secrets."""

from __future__ import annotations

import json

import torch

from training_harness.measure.env import capture_env

CPU = torch.device("cpu")


# --- environment -----------------------------------------------------------------------


def test_capture_env_is_json_and_has_versions(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("TORCH_HUB_TOKEN", "do-not-record")
    env = capture_env(CPU)
    text = json.dumps(env)
    assert env["torch"] == torch.__version__
    assert env["python"].count(".") == 2
    assert env["cpu_count"] and env["torch_threads"] >= 1
    assert env["env"]["OMP_NUM_THREADS"] == "2"
    assert "TORCH_HUB_TOKEN" not in env["env"] and "do-not-record" not in text
    assert "harness" in env and "git" in env and "driver" in env
    # the instruction set, which decides (say) whether bf16 on a CPU is fast at all
    assert env["cpu_capability"] == str(torch.backends.cpu.get_cpu_capability())
    assert isinstance(env["cpu_flags"], list)


def test_cpu_flags_come_from_cpuinfo(monkeypatch, tmp_path) -> None:
    import builtins

    from training_harness.core import device

    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: X\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n")
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: real_open(
        info if path == "/proc/cpuinfo" else path, *a, **k))
    assert device.cpu_flags() == ["avx2", "avx512f", "avx512_bf16", "amx_tile"]


def test_capture_env_keeps_storage_passwords_out(monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_STORAGE", "postgresql://tuner:pw-in-env@db/h")
    monkeypatch.setenv("HARNESS_OTHER", "redis://u:pw-in-value@cache:6379/0")
    text = json.dumps(capture_env(CPU))
    assert "pw-in-env" not in text and "HARNESS_STORAGE" not in text
    assert "pw-in-value" not in text and "redis://u:***@cache" in text


def test_capture_env_never_raises(monkeypatch) -> None:
    import training_harness.measure.env as env_mod

    def boom(*a, **k):
        raise RuntimeError("broken")

    monkeypatch.setattr(env_mod, "_capture", boom)
    env = capture_env(CPU)
    assert "broken" in env["error"]
    json.dumps(env)
    monkeypatch.undo()
    monkeypatch.setattr(env_mod, "git_commit", boom)
    monkeypatch.setattr(env_mod, "_env_vars", boom)
    env = capture_env(CPU)
    assert env["git"] is None and env["env"] == {} and env["torch"] == torch.__version__
