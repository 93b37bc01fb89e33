"""Reports: the verdict as a self-contained HTML page with server-rendered SVG charts."""
