"""Policies checked before bytes are written: residency (where) and volumes (which disk)."""
