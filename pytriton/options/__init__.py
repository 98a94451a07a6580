"""Server options as plain data: the layer below the runtime and the transports, which both read it."""
