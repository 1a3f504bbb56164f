"""The `radixmesh` command line: `main` is the click group, one module per command family."""
