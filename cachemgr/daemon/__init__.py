"""The cachemgr daemon (layer 8): HTTP API, service, governance, systemd integration."""
