"""Run the peers harness's ``run_peer.py`` with django-leasequeue added as system ``leasequeue``.

Usage: python bench/peer_adapter/run_harness.py HARNESS_DIR leasequeue [run_peer.py options]

The harness folder (``../shared/bench/peers/harness``) is read-only and is not copied: this script
puts it on ``sys.path`` (as ``run_peer.py`` does itself), appends this folder to the harness's
``systems`` package path so ``systems.leasequeue_sys`` resolves to our adapter, then calls
``run_peer.main()`` unchanged. Run it with the project's Python (Django and django-leasequeue's
dependencies), not with the peers' virtualenv.
"""

import os
import sys


def main() -> None:
    harness = os.path.abspath(sys.argv[1])
    sys.argv = [os.path.join(harness, "run_peer.py"), *sys.argv[2:]]
    sys.path.insert(0, harness)
    import systems

    systems.__path__.append(os.path.dirname(os.path.abspath(__file__)))
    import run_peer

    run_peer.main()


if __name__ == "__main__":
    main()
