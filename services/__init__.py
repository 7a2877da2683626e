"""fifolane's runtime services (the FIFO-group worker)."""
