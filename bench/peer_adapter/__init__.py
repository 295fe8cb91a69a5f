"""django-leasequeue as one more system of the peers harness in ``../shared/bench/peers``."""
