"""Launchers start and stop engine instances behind one interface (``base.Launcher``)."""
