"""The demo's URL shortener: short links, their redirects counted as metrics, a chart each."""
