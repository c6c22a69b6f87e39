"""The main screen's panels, each small and named for what it shows."""
