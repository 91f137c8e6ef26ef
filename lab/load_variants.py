"""Which of specli's differences from a plain `llama_cpp.Llama` load crashes a llama.cpp build: one
load per process, each switching one difference on (or all of them), then `specli run` itself.

    LLAMA_CPP_LIB_PATH=<dir of libllama.so> python lab/load_variants.py MODEL [--gpu-layers N]

Made for the load crash of a CUDA build on a lent H200 (every `specli run` segfaulted in
llama_model_load_from_file -> llama_model::print_info -> std::ostream insertion, while llama_cpp.Llama
loaded; a CUDA build without a GPU does not crash: lab/history.md). Each line: the exit status (-11 is
SIGSEGV), seconds, the variant, and for a failure the last lines of its stderr (faulthandler's Python
stack included). The first variant that crashes says where the cause lives:
  imports first       libllama loaded after numpy/rich/typer (specli's order) picks up another C++ runtime
  log quiet / NULL    specli's C log callback (Py_IsInitialized as a no-op), or llama.cpp's own
  specli params       use_extra_bufts off (specli's default), load_mtp
  spinner             rich's refresh thread running during the load
  signals             specli's SIGINT/SIGTERM handlers
  tiled env           GGML_CPU_TILED_MM=0 (batch-invariant arithmetic)
  specli Model        something in specli.llama.Model.__init__ before the load
  specli run          the command line (typer, click, rich) around it
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import os
import subprocess
import sys
import time


def one_load(a: argparse.Namespace) -> None:
    """A child process: one load with the differences a.* asks for."""
    faulthandler.enable()
    if a.signals:
        from specli import signals

        signals.install()
    if a.imports_first:
        import click  # noqa: F401
        import numpy  # noqa: F401
        import rich.console  # noqa: F401
        import typer  # noqa: F401
    import llama_cpp as llc  # LLAMA_CPP_LIB_PATH's libllama

    if a.tiled_env:
        os.environ["GGML_CPU_TILED_MM"] = "0"
    spinner = contextlib.nullcontext()
    if a.spinner:
        from rich.console import Console

        spinner = Console(stderr=True).status("loading")
    with spinner:
        if a.via == "llama":
            llc.Llama(a.model, n_gpu_layers=a.gpu_layers, verbose=a.log != "quiet")
        elif a.via == "model":
            from specli import llama, llama_log

            llama_log.set_verbose(a.log == "null")
            llama.Model(a.model, llama.ModelOptions(n_gpu_layers=a.gpu_layers, n_ctx=256))
        else:
            if a.log == "quiet":
                llc.llama_log_set(ctypes.cast(ctypes.pythonapi.Py_IsInitialized, llc.llama_log_callback),
                                  ctypes.c_void_p(0))
            elif a.log == "null":
                llc.llama_log_set(llc.llama_log_callback(), ctypes.c_void_p(0))
            llc.llama_backend_init()
            params = llc.llama_model_default_params()
            params.n_gpu_layers = a.gpu_layers
            if a.specli_params:
                params.load_mtp = False
                params.use_extra_bufts = False
            if not llc.llama_model_load_from_file(a.model.encode(), params):
                sys.exit("the load returned NULL")
    print("loaded", flush=True)


def variants(model: str, gpu_layers: int) -> list[tuple[str, list[str]]]:
    base = [sys.executable, __file__, model, "--gpu-layers", str(gpu_layers), "--child"]
    run = ("import sys; from specli.launcher import main; sys.argv = ['specli', 'run', '--target', "
           f"{model!r}, '--no-draft', '-n', '8', '-ngl', '{gpu_layers}', 'Once upon a time']; main()")
    return [
        ("llama_cpp.Llama", [*base, "--via", "llama"]),
        ("raw load", base),
        ("imports first", [*base, "--imports-first"]),
        ("log quiet", [*base, "--log", "quiet"]),
        ("log NULL", [*base, "--log", "null"]),
        ("specli params", [*base, "--specli-params"]),
        ("spinner", [*base, "--spinner"]),
        ("signals", [*base, "--signals"]),
        ("tiled env", [*base, "--tiled-env"]),
        ("all of them", [*base, "--imports-first", "--log", "quiet", "--specli-params", "--spinner",
                         "--signals", "--tiled-env"]),
        ("specli Model", [*base, "--via", "model", "--log", "quiet"]),
        ("specli Model, spinner", [*base, "--via", "model", "--log", "quiet", "--spinner"]),
        ("specli run", [sys.executable, "-X", "faulthandler", "-c", run]),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--via", choices=["raw", "model", "llama"], default="raw", help=argparse.SUPPRESS)
    ap.add_argument("--log", choices=["python", "quiet", "null"], default="python", help=argparse.SUPPRESS)
    for flag in ("--imports-first", "--specli-params", "--spinner", "--signals", "--tiled-env"):
        ap.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        one_load(a)
        return
    for name, command in variants(a.model, a.gpu_layers):
        started = time.perf_counter()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=180)
            code, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            code, err = "timeout", ""
        print(f"{code!s:>7}  {time.perf_counter() - started:5.1f}s  {name}", flush=True)
        if code != 0:
            tail = [line for line in err.splitlines() if line.strip()][-12:]
            print("         " + "\n         ".join(tail), flush=True)


if __name__ == "__main__":
    main()
