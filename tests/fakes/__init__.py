"""In-process fakes of external systems that speak the real wire protocols."""
