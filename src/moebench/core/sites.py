"""Staged site folders: packages installed with `pip install --target DIR` (ci/stage_engine.py), put on
PYTHONPATH. A PYTHONPATH entry, unlike a site-packages folder, does not read the .pth files in it, so the
folders they name are added explicitly (CuTe DSL, which SGLang imports, lives in one).

    python3 -m moebench.core.sites DIR      prints DIR and the folders its .pth files add, joined by ':'
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def site_paths(site: str | Path) -> list[str]:
    """The site folder and the existing folders its .pth files name (`import` lines are not run)."""
    root = Path(site)
    out = [str(root)]
    for pth in sorted(root.glob("*.pth")):
        for line in pth.read_text(errors="replace").splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")) and (root / line).is_dir():
                out.append(str(root / line))
    return out


if __name__ == "__main__":
    print(os.pathsep.join(p for site in sys.argv[1:] for p in site_paths(site)))
