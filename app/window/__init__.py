"""The main window, its menus, shortcuts and status bar."""
