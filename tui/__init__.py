"""The trainwarden terminal UI: a Textual client of the daemon's control socket."""
