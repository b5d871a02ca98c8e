"""Engine, model loading, run loop, results and logging."""
