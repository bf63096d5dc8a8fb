"""One controller a feature, talking to the window through a small host protocol."""
