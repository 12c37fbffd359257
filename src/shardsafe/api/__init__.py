"""Public entry points: save, load, async_save."""
