"""``python -m cachemgr`` runs the CLI."""

from cachemgr.cli import main

main()
