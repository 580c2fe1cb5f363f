"""ci/planted's sitecustomize: with MOEBENCH_PLANT_NARROW_LOADS set (any non-empty value but "0"), every Python
process started with ci/planted on PYTHONPATH plants moebench_planted_narrow (two 32-bit weight loads in the
int4 Triton MoE kernel) into moebench.gemm.triton_moe.w4_mma_kernel. Python imports sitecustomize at startup
in every process, so the plant reaches the ncu child (`python -m moebench.gemm.counter_child`), which a pytest
plugin (-p) would not.

Lazily: nothing is imported here but moebench_planted's finder (the standard library's import machinery). The
finder on sys.meta_path waits for the kernel module's import, lets the other finders load it, and right after
the module's own code (before any kernel can have compiled) replaces its `_load_ws`. Unset (or "0"), this file adds no finder and plants
nothing.

Planted, moebench_planted_narrow.plant prints one line on stderr (`moebench planted regression: ...`); stdout
stays the program's (the ncu child's is where ncu writes its table).

Python imports only the first `sitecustomize` on sys.path, and PYTHONPATH comes before site-packages and the
standard library, so this one shadows any the image has (Debian's and Ubuntu's python3 ship one in
/usr/lib/python3.X; a venv's site-packages may hold another). On the CPU development image `import
sitecustomize` finds none; the H200 image's python3 (/opt/torch/.venv, Python 3.12) was not checked. So that
putting ci/planted on PYTHONPATH changes nothing else (the decode plants put it there too), the next
`sitecustomize` on sys.path after this folder, if there is one, is run as well, as Python would have run it
(an error in it is printed, not raised, as site.py does). `usercustomize` is not affected.
"""

import os
import sys

MODULE = "moebench.gemm.triton_moe.w4_mma_kernel"
ENV = "MOEBENCH_PLANT_NARROW_LOADS"


def _wanted() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _plant(module) -> None:
    import moebench_planted_narrow

    moebench_planted_narrow.plant(module)


def _install() -> None:
    # moebench_planted (beside this file) holds the finder the decode plants use; it imports only the
    # standard library's import machinery at module level
    from moebench_planted import plant_when_imported

    plant_when_imported(MODULE, _plant)


def _after(here: str) -> list:
    """sys.path's entries after the last one that is this file's folder."""
    paths = [os.path.realpath(p or os.curdir) for p in sys.path]
    last = max((i for i, p in enumerate(paths) if p == here), default=-1)
    return sys.path[last + 1:]


def _chain() -> None:
    """Run the sitecustomize this one shadows: the first on sys.path after this file's folder."""
    spec = None
    try:
        import importlib.machinery

        here = os.path.dirname(os.path.realpath(__file__))
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _after(here))
        if spec is None or spec.loader is None:
            return
        import importlib.util

        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:  # site.py's own way with a failing sitecustomize: print, go on
        print(f"Error in sitecustomize {getattr(spec, 'origin', '')} (run by {__file__}): {type(e).__name__}: {e}",
              file=sys.stderr)


if _wanted():
    _install()
_chain()
