"""Interactive views (ipywidgets), one module per lesson topic."""
