"""cachemgr's benchmarks: ``scripts/bench`` runs every ``bench/cases_*.py`` module."""
