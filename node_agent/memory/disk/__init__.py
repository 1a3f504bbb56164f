"""The disk tier: KV blocks demoted from the host tier, kept in append-only segment files under one
directory so that they outlive the process. record.py is the on-disk record and what must match for
one to be served; segments.py the files, their index and capacity; tier.py the writer thread the
engine hands blocks to; metrics.py its Prometheus snapshot."""
