// An independent client for the end-to-end test: Node's vscode-jsonrpc (the JSON-RPC stack VS Code's
// language client is built on) talks to the server over stdio and prints what it got as one JSON line.
// Usage: node node_client.cjs <store> <python> ; vscode-jsonrpc is found through NODE_PATH.
"use strict";
const { spawn } = require("node:child_process");
const rpc = require("vscode-jsonrpc/node");

async function main() {
  const [store, python] = process.argv.slice(2);
  const child = spawn(python, ["-m", "slayer_lsp.lsp", "--storage", store, "--log-level", "WARNING"],
                      { stdio: ["pipe", "pipe", "inherit"] });
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  const conn = rpc.createMessageConnection(new rpc.StreamMessageReader(child.stdout),
                                           new rpc.StreamMessageWriter(child.stdin));
  const uri = "file:///ws/probe.query.yaml";
  const diagnostics = new Promise((resolve) => conn.onNotification("textDocument/publishDiagnostics", (p) => {
    if (p.uri === uri) resolve(p.diagnostics);
  }));
  conn.onRequest("window/workDoneProgress/create", () => null);
  conn.onNotification("$/progress", () => {});
  conn.onNotification("window/showMessage", () => {});
  conn.listen();
  const out = {};
  const init = await conn.sendRequest("initialize", { processId: process.pid, rootUri: null, capabilities: {},
                                                     initializationOptions: { embedding: { enable: false } } });
  out.serverInfo = init.serverInfo;
  out.triggers = init.capabilities.completionProvider.triggerCharacters;
  conn.sendNotification("initialized", {});
  const text = "source_model: orders\ndimensions: [stores., stauts]\n";
  conn.sendNotification("textDocument/didOpen", { textDocument: { uri, languageId: "yaml", version: 1, text } });
  out.diagnostics = (await diagnostics).map((d) => [d.code, d.range.start.line, d.range.start.character]);
  const completion = await conn.sendRequest("textDocument/completion",
    { textDocument: { uri }, position: { line: 1, character: 20 } });
  out.completion = completion.items.map((i) => i.label);
  out.textEdit = completion.items[0].textEdit;
  const hover = await conn.sendRequest("textDocument/hover", { textDocument: { uri }, position: { line: 0, character: 16 } });
  out.hover = hover.contents.value.split("\n")[0];
  const search = await conn.sendRequest("slayer/search", { question: "net sales", max_results: 2 });
  out.search = search.results.map((h) => [h.kind, h.id]);
  for (const [name, call] of [["invalid", () => conn.sendRequest("slayer/search", { max_results: "x" })],
                              ["unknown", () => conn.sendRequest("slayer/nosuch", {})]]) {
    try { await call(); out[name] = null; } catch (e) { out[name] = [e.code, e.message]; }
  }
  await conn.sendRequest("shutdown");
  conn.sendNotification("exit");
  out.exitCode = await exited;
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((e) => { process.stderr.write(String(e && e.stack || e) + "\n"); process.exit(1); });
