-- An independent client for the end-to-end test: headless Neovim (0.7+, its built-in vim.lsp) opens
-- a query file, starts the server, and writes what it got (diagnostics, completion, hover,
-- slayer/search with the params in $LSP_SEARCH, a bad request) to $LSP_OUT as one JSON object.
-- Run: LSP_CMD='python -m slayer_lsp.lsp --storage S' LSP_FILE=q.query.yaml LSP_OUT=out.json LSP_SEARCH='{}' \
--      nvim --headless -u NONE -i NONE -n -c 'luafile neovim_client.lua'
local out = { errors = {} }

local function finish()
  local fh = assert(io.open(os.getenv("LSP_OUT"), "w"))
  fh:write(vim.fn.json_encode(out))
  fh:close()
  vim.cmd("qa!")
end

local function main()
  local file = os.getenv("LSP_FILE")
  vim.cmd("edit " .. vim.fn.fnameescape(file))
  local buf = vim.api.nvim_get_current_buf()
  local id = vim.lsp.start_client({
    name = "slayer",
    cmd = vim.split(os.getenv("LSP_CMD"), " ", { trimempty = true }),
    root_dir = vim.fn.fnamemodify(file, ":h"),
    init_options = { embedding = { enable = false }, diagnostics = { debounceMs = 20 } },
    handlers = {
      ["textDocument/publishDiagnostics"] = function(_, result)
        if result and result.uri == vim.uri_from_bufnr(buf) then
          out.diagnostics = result.diagnostics
        end
      end,
      ["window/showMessage"] = function(_, result)
        table.insert(out.errors, result.message)
      end,
    },
  })
  if not id then
    table.insert(out.errors, "start_client failed")
    return
  end
  vim.lsp.buf_attach_client(buf, id)
  if not vim.wait(30000, function()
    local c = vim.lsp.get_client_by_id(id)
    return c ~= nil and c.initialized
  end, 20) then
    table.insert(out.errors, "not initialized")
    return
  end
  local client = vim.lsp.get_client_by_id(id)
  local caps = client.server_capabilities or {}
  out.triggers = caps.completionProvider and caps.completionProvider.triggerCharacters
  vim.wait(30000, function() return out.diagnostics ~= nil end, 20)

  local td = { uri = vim.uri_from_bufnr(buf) }
  local function request(method, params)
    local answers, err = vim.lsp.buf_request_sync(buf, method, params, 30000)
    if not answers then
      table.insert(out.errors, method .. ": " .. tostring(err))
      return nil
    end
    local answer = answers[id] or {}
    if answer.error or answer.err then -- 0.7 names it "error"
      return { error = answer.error or answer.err }
    end
    return answer.result
  end

  out.completion = request("textDocument/completion", { textDocument = td, position = { line = 1, character = 20 } })
  out.hover = request("textDocument/hover", { textDocument = td, position = { line = 0, character = 16 } })
  out.column_hover = request("textDocument/hover", { textDocument = td, position = { line = 2, character = 16 } })
  out.search = request("slayer/search", vim.fn.json_decode(os.getenv("LSP_SEARCH")))
  out.bad = request("slayer/search", { max_results = "ten" })
  -- editor depth: rename, signature help, inlay hints, impact
  local on_subtotal = { textDocument = td, position = { line = 2, character = 17 } }
  out.prepare_rename = request("textDocument/prepareRename", on_subtotal)
  out.rename = request("textDocument/rename", vim.tbl_extend("force", on_subtotal, { newName = "net_subtotal" }))
  out.rename_refused = request("textDocument/rename", vim.tbl_extend("force", on_subtotal, { newName = "tax_paid" }))
  out.signature = request("textDocument/signatureHelp", { textDocument = td, position = { line = 2, character = 15 } })
  out.inlay = request("textDocument/inlayHint", { textDocument = td,
    range = { start = { line = 0, character = 0 }, ["end"] = { line = 3, character = 0 } } })
  out.impact = request("slayer/impact", { entity = "jaffle.orders.subtotal" })

  client.stop()
  vim.wait(5000, function() return client.is_stopped() end, 20)
  out.stopped = client.is_stopped()
end

local ok, err = pcall(main)
if not ok then
  table.insert(out.errors, tostring(err))
end
finish()
