"""KV Lens desktop app (PySide6 + pyqtgraph) on top of kvcore."""
