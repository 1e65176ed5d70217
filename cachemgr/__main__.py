"""``python -m cachemgr`` runs the CLI (through its start-up fast path, :mod:`cachemgr.main`)."""

from cachemgr.main import main

main()
