"""Know before you train: model of one checkpoint, burst budget, probe, admission, simulation."""
