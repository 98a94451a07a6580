"""Running the engine: the background event loop, server options and the transports' lifecycle."""
