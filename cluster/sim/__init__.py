"""radixmesh.cluster.sim.simulator"""
