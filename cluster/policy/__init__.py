"""Routing policies: the interface and registry (base), the cost model, the policies themselves.

Importing the package registers the built-in policies: each policy module registers itself with
`base.register`, and this module imports them before anyone can reach `base.make_policy`.
"""

from radixmesh.cluster.policy import baseline, cost  # noqa: F401  (registration on import)
