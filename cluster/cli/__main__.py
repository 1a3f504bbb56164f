"""`python -m radixmesh.cluster.cli ...` is the `radixmesh` console script."""

from radixmesh.cluster.cli.main import main

main()
