"""Bringing a deployment up and down: launcher, config, loopback Ray, the metadata and router actors."""
