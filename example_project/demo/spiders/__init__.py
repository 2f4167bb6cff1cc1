"""The demo's spiders."""
