"""Where the stand-alone benchmarks (``history_bench.py``, ``history_volume.py``,
``prune_bench.py``) leave their figures: the table printed and written to
``build/bench/<name>.md``, the raw figures to ``build/bench/<name>.json``."""

from __future__ import annotations

import json
import os

BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "bench")


def save(name: str, text: str, figures: dict) -> str:
    """Print ``text`` (the table), write it to ``BUILD/<name>.md`` and ``figures`` (JSON; values it
    cannot encode as their ``str()``) to ``BUILD/<name>.json``.

    Returns:
        The table file's path.
    """
    os.makedirs(BUILD, exist_ok=True)
    print(text, flush=True)
    path = os.path.join(BUILD, f"{name}.md")
    with open(path, "w") as f:
        f.write(text + "\n")
    with open(os.path.join(BUILD, f"{name}.json"), "w") as f:
        json.dump(figures, f, indent=1, default=str)
    return path
