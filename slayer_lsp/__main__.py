from slayer_lsp.cli.main import main

raise SystemExit(main())
