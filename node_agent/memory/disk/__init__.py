"""The disk tier: KV blocks demoted from the host tier, kept in append-only segment files under one
directory so that they outlive the process. record.py is the on-disk record and what must match for
one to be served; directory.py the directory's trust (owner, mode, one agent's lock, nothing followed);
segments.py the files, their index and capacity; tier.py the writer thread the engine hands blocks
to and the index events it publishes; metrics.py its Prometheus snapshot."""
