"""Measurements of this host and of a store: the probe and its profile, the writers' per-byte costs, the disk, the
training step's own figures. They produce the cost models' inputs and never decide anything."""
