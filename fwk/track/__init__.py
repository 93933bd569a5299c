"""Runs on disk: content-addressed run ids, run dirs and their files, the SQLite index of
runs and their lineage, sweeps, replays and plots."""
