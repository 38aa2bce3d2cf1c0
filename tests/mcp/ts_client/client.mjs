// An independent MCP client: the TypeScript SDK spawns `python -m slayer_lsp mcp` on stdio, lists
// the tools, calls search (its structured answer is checked by the SDK against the announced output
// schema), calls search with bad arguments, lists and reads resources, and prints what it saw as JSON.
// Usage: node client.mjs PYTHON STORE REPO
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport, getDefaultEnvironment } from "@modelcontextprotocol/sdk/client/stdio.js";

const [python, store, repo] = process.argv.slice(2);
const transport = new StdioClientTransport({
  command: python,
  args: ["-m", "slayer_lsp", "mcp", "--storage", store, "--no-embedding"],
  cwd: repo,
  env: { ...getDefaultEnvironment(), PYTHONPATH: repo },
  stderr: "inherit",
});
const client = new Client({ name: "slayer-ts-test", version: "1.0.0" });
await client.connect(transport);
const out = { server: client.getServerVersion(), capabilities: client.getServerCapabilities() };
const tools = await client.listTools();
out.tools = tools.tools.map((t) => t.name);
out.schemas = Object.fromEntries(tools.tools.map((t) => [t.name, { input: t.inputSchema, output: t.outputSchema }]));
const found = await client.callTool({ name: "search", arguments: { question: "order total including tax", max_results: 5 } });
out.search = { isError: found.isError ?? false, ids: found.structuredContent.results.map((h) => h.id) };
const bad = await client.callTool({ name: "search", arguments: { question: 5 } });
out.bad = { isError: bad.isError ?? false, text: bad.content[0].text };
const listed = await client.listResources();
out.resources = listed.resources.map((r) => r.uri);
const model = await client.readResource({ uri: "slayer://model/jaffle.orders" });
out.model = JSON.parse(model.contents[0].text);
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
