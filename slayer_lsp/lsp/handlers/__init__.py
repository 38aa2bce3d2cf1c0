"""One short handler per method: each takes the server and the method's params, converts positions
in (``lsp.convert``), runs the plain-data analysis on a worker thread and converts the answer out.
``lsp.server`` registers them."""
