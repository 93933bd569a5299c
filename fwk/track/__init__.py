"""Run ids, run dirs and their files."""
