"""The save pipeline: one request, planned once, driven by one ``run()``."""
