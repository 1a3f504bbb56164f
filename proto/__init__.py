"""The contract layer: every type that crosses a process boundary, and the wire schema."""
