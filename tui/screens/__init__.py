"""The main screen and the screens and modals opened from it."""
