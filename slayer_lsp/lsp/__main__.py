import sys

from slayer_lsp.lsp import serve

raise SystemExit(serve(sys.argv[1:]))
