"""Engine: staging buffers, background writers, readers and the commit protocol."""
