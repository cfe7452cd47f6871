"""Tests of ckptio.integrations: one file per stack, each with a bit-exact resume through the real package."""
