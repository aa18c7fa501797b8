"""verification package."""
