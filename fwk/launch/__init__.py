"""Launching workers: in-process for one, torchrun for many."""
