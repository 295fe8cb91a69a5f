"""What the chart counters cost the drain: the same 2 x 4 drain with the counting trigger
(``leasequeue_job_stat_count``, migration 0015) enabled and disabled, alternated within one run.

Usage (from the repository root)::

    python bench/stats_bench.py                # 20,000 no-op jobs, 3 pairs
    python bench/stats_bench.py --jobs 5000 --reps 1

Each repetition runs the two variants back to back on fresh databases copied from one migrated
template (``bench/run.py``'s machinery: the workers start against a paused queue, jobs/s is read
from the database as ``count / (max(finished_at) - min(attempted_at))``). With the trigger on, it
also checks the ledger: the counters hold exactly ``--jobs`` claims and ``--jobs`` completions.
Nothing is asserted about speed; the medians and their ratio are printed.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402  (bench/run.py: configuration, databases, workers)


class _Variant(run.Databases):
    """The benchmark databases, with the counting trigger switched off when ``counting`` is False."""

    counting = True

    def fresh(self) -> str:
        name = super().fresh()
        if not self.counting:
            with run.connect(name) as c:
                c.execute("ALTER TABLE leasequeue_job DISABLE TRIGGER leasequeue_job_stat_count")
        return name


def main(argv: list[str] | None = None) -> int:
    cfg = run.parse_args(["--skip-peers", *(argv or sys.argv[1:])])
    reps, cfg.reps = cfg.reps, 1
    dbs = _Variant(cfg)
    dbs.prepare()
    rates: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as workdir:
        for rep in range(reps):
            for counting in (True, False) if rep % 2 == 0 else (False, True):
                dbs.counting = counting
                [res] = run.bench_drain(cfg, dbs, 2, 4, False, workdir)
                if counting:
                    with run.connect(cfg.db) as c:
                        started, done = c.execute(
                            "SELECT coalesce(sum(started), 0), coalesce(sum(done), 0) FROM leasequeue_job_stat"
                        ).fetchone()
                    if (started, done) != (cfg.jobs, cfg.jobs):
                        raise RuntimeError(f"counters hold {started} claims and {done} completions, "
                                           f"expected {cfg.jobs} of each")
                rates[counting].append(res["jobs_per_s"])
                run.log(f"rep {rep + 1}/{reps} counting={'on' if counting else 'off'}: {res['jobs_per_s']:,.0f} jobs/s")
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"drain 2x4, {cfg.jobs:,} no-op jobs, median of {reps} (load {run.load_average()}):")
    print(f"  counters off (before): {off:,.0f} jobs/s   runs {[round(r) for r in rates[False]]}")
    print(f"  counters on (after):   {on:,.0f} jobs/s   runs {[round(r) for r in rates[True]]}")
    print(f"  on/off: {on / off:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
