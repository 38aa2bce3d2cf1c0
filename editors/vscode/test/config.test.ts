/**
 * The settings -> server mapping, run in plain Node: no VS Code host can run on CI (Node 20), and
 * this is the part of the extension the server depends on. When the repository's `slayer_lsp` is
 * importable, the mapping is also checked against the server's own `parse_options`.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import {
  documentSelector,
  flatten,
  readSettings,
  RESTART_SETTINGS,
  SECTION,
  SERVER_SETTINGS,
  serverLaunch,
  serverOptions,
  type SettingReader,
  usesPythonExtension,
} from "../src/config";
import { searchParams } from "../src/wire";

interface ConfigProperty {
  type: string;
  default: unknown;
  enum?: string[];
  minimum?: number;
  maximum?: number;
}

// Bundled to out/test/: the extension folder is two levels up, the repository four.
const EXTENSION_DIR = join(__dirname, "..", "..");
const REPO_ROOT = join(EXTENSION_DIR, "..", "..");

const manifest = JSON.parse(readFileSync(join(EXTENSION_DIR, "package.json"), "utf8")) as {
  contributes: { configuration: { properties: Record<string, ConfigProperty> }; commands: { command: string }[] };
  activationEvents: string[];
};
const properties = manifest.contributes.configuration.properties;
const key = (full: string) => full.slice(SECTION.length + 1);
const fallback = (k: string) => properties[`${SECTION}.${k}`]?.default;

/** Settings this extension reads itself; everything else in package.json is a server option. */
const CLIENT_SIDE = new Set(["server.command", "interpreter", "trace.server", "search.ranking", "search.related"]);

/** What `vscode.workspace.getConfiguration("slayerLsp").get(key)` returns: the user's value, else the manifest default. */
function reader(overrides: Record<string, unknown> = {}): SettingReader {
  return (k) => (k in overrides ? overrides[k] : fallback(k));
}

/** A value of every server option other than its default, each within the server's ranges. */
const USER_VALUES: Record<string, unknown> = {
  storage: "${HOME}/store.db",
  "diagnostics.enable": false,
  "diagnostics.debounceMs": 50,
  "files.queryPatterns": ["sql/*.q.yaml"],
  "files.memoryPatterns": ["notes/*.md", "kb/**/*.md"],
  "embedding.enable": false,
  "embedding.model": "openai/text-embedding-3-small",
  "embedding.switchModel": true,
  "scope.datasources": ["jaffle"],
  "scope.accessTags": ["pii", "finance"],
  "scope.untaggedOnly": true,
  "hover.maxChars": 800,
};

describe("readSettings", () => {
  it("agrees with every default declared in package.json", () => {
    const s = readSettings(reader());
    const options = flatten(serverOptions(s));
    for (const [k, value] of Object.entries(options)) {
      assert.deepEqual(value, fallback(k), k);
    }
    assert.deepEqual(s.serverCommand, fallback("server.command"));
    assert.equal(s.interpreter, fallback("interpreter"));
    assert.equal(s.searchRanking, fallback("search.ranking"));
    assert.equal(s.searchRelated, fallback("search.related"));
    // The code's own defaults (settings missing altogether) are package.json's.
    assert.deepEqual(readSettings(() => undefined), s);
  });

  it("replaces values of the wrong type by defaults and drops blank list items", () => {
    const s = readSettings(
      reader({
        "diagnostics.enable": "yes",
        "diagnostics.debounceMs": 12.5,
        "hover.maxChars": Number.NaN,
        "files.queryPatterns": "q/*.yaml",
        "scope.datasources": ["jaffle", "", 3, "  supplies "],
        "scope.untaggedOnly": "true",
        "embedding.enable": 1,
        "embedding.switchModel": null,
        "search.ranking": "fast",
        "search.related": -2,
        storage: 42,
      }),
    );
    assert.equal(s.diagnosticsEnable, fallback("diagnostics.enable"));
    assert.equal(s.diagnosticsDebounceMs, fallback("diagnostics.debounceMs"));
    assert.equal(s.hoverMaxChars, fallback("hover.maxChars"));
    assert.deepEqual(s.queryPatterns, fallback("files.queryPatterns"));
    assert.deepEqual(s.scopeDatasources, ["jaffle", "supplies"]);
    assert.equal(s.scopeUntaggedOnly, fallback("scope.untaggedOnly"));
    assert.equal(s.embeddingEnable, fallback("embedding.enable"));
    assert.equal(s.embeddingSwitchModel, fallback("embedding.switchModel"));
    assert.equal(s.searchRanking, "hybrid");
    assert.equal(s.searchRelated, 0);
    assert.equal(s.storage, fallback("storage"));
  });

  it("leaves integer ranges to the server, which reports what it refuses", () => {
    const s = readSettings(reader({ "hover.maxChars": 100, "diagnostics.debounceMs": -5 }));
    assert.equal(s.hoverMaxChars, 100);
    assert.equal(s.diagnosticsDebounceMs, -5);
  });

  it("reads the Search settings", () => {
    const s = readSettings(reader({ "search.ranking": "slayer", "search.related": 2 }));
    assert.equal(s.searchRanking, "slayer");
    assert.equal(s.searchRelated, 2);
  });
});

describe("serverOptions", () => {
  const serverKeys = Object.keys(properties)
    .map(key)
    .filter((k) => !CLIENT_SIDE.has(k))
    .sort();

  it("carries exactly the server settings of package.json, nested like the configuration section", () => {
    const options = serverOptions(readSettings(reader()));
    assert.deepEqual(Object.keys(flatten(options)).sort(), serverKeys);
    assert.deepEqual([...SERVER_SETTINGS].map(key).sort(), serverKeys);
  });

  it("passes user values through", () => {
    const options = serverOptions(readSettings(reader({ ...USER_VALUES, "search.ranking": "slayer", interpreter: "/x/python" })));
    assert.deepEqual(options, {
      storage: "${HOME}/store.db",
      diagnostics: { enable: false, debounceMs: 50 },
      files: { queryPatterns: ["sql/*.q.yaml"], memoryPatterns: ["notes/*.md", "kb/**/*.md"] },
      embedding: { enable: false, model: "openai/text-embedding-3-small", switchModel: true },
      scope: { datasources: ["jaffle"], accessTags: ["pii", "finance"], untaggedOnly: true },
      hover: { maxChars: 800 },
    });
  });

  it("every client-side setting is declared, and none is a server option", () => {
    for (const k of CLIENT_SIDE) {
      assert.ok(`${SECTION}.${k}` in properties, k);
      assert.ok(!SERVER_SETTINGS.includes(`${SECTION}.${k}`), k);
    }
  });
});

describe("documentSelector", () => {
  it("narrows yaml, json and markdown by the configured patterns", () => {
    const selector = documentSelector(readSettings(reader({ "files.queryPatterns": ["sql/*.q.yaml"], "files.memoryPatterns": ["notes/*.md"] })));
    assert.deepEqual(selector, [
      { scheme: "file", language: "yaml", pattern: "sql/*.q.yaml" },
      { scheme: "file", language: "json", pattern: "sql/*.q.yaml" },
      { scheme: "file", language: "markdown", pattern: "notes/*.md" },
      { scheme: "file", language: "yaml", pattern: "**/models/**/*.{yaml,yml}" },
      { scheme: "file", language: "yaml", pattern: "**/datasources/*.{yaml,yml}" },
    ]);
  });
});

describe("serverLaunch", () => {
  const serve = ["-m", "slayer_lsp", "serve"];
  const cases: { name: string; settings: Record<string, unknown>; python?: string[]; expected: string[]; asksPython: boolean }[] = [
    { name: "explicit command wins over everything", settings: { "server.command": ["slayer-lsp", "serve"], interpreter: "/x/python" }, python: ["/venv/bin/python"], expected: ["slayer-lsp", "serve"], asksPython: false },
    { name: "interpreter setting wins over the Python extension", settings: { interpreter: "/x/python" }, python: ["/venv/bin/python"], expected: ["/x/python", ...serve], asksPython: false },
    { name: "interpreter setting alone, trimmed", settings: { interpreter: " /x/python " }, expected: ["/x/python", ...serve], asksPython: false },
    { name: "interpreter path with spaces stays one word", settings: { interpreter: "C:\\Program Files\\Python311\\python.exe" }, expected: ["C:\\Program Files\\Python311\\python.exe", ...serve], asksPython: false },
    { name: "Python extension interpreter", settings: {}, python: ["/venv/bin/python"], expected: ["/venv/bin/python", ...serve], asksPython: true },
    { name: "multi-word interpreter command", settings: { interpreter: "  " }, python: ["conda", "run", "-n", "env", "python"], expected: ["conda", "run", "-n", "env", "python", ...serve], asksPython: true },
    { name: "python3 fallback", settings: { "server.command": ["", " "] }, python: [], expected: ["python3", ...serve], asksPython: true },
    { name: "python3 without the Python extension", settings: {}, expected: ["python3", ...serve], asksPython: true },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const s = readSettings(reader(c.settings));
      const launch = serverLaunch(s, c.python);
      assert.deepEqual([launch.command, ...launch.args], c.expected);
      assert.equal(usesPythonExtension(s), c.asksPython);
    });
  }
});

describe("manifest", () => {
  it("declares the commands and the settings the code reads", () => {
    assert.deepEqual(
      manifest.contributes.commands.map((c) => c.command).sort(),
      [`${SECTION}.restartServer`, `${SECTION}.search`, `${SECTION}.showStatus`],
    );
    for (const k of [...RESTART_SETTINGS, `${SECTION}.trace.server`]) {
      assert.ok(k in properties, k);
    }
    assert.deepEqual(properties[`${SECTION}.search.ranking`]?.enum, ["hybrid", "slayer"]);
  });
});

// ------------------------------------------------------------------ against the server's parser

interface Parsed {
  options: Record<string, unknown>;
  problems: string[];
}

const PYTHON = process.env.SLAYER_LSP_PYTHON || "python3";
const PYTHON_ENV = { ...process.env, PYTHONPATH: [REPO_ROOT, process.env.PYTHONPATH].filter(Boolean).join(":") };
const MODULES = "slayer_lsp.lsp.options, slayer_lsp.search.types";
const PARSE = `
import json, sys
import msgspec
from slayer_lsp.lsp.options import Options, parse_options
from slayer_lsp.search.types import parse_params
given = json.load(sys.stdin)
out = {"defaults": Options().to_dict(), "parsed": [], "search": []}
for raw in given["options"]:
    opts, problems = parse_options(raw)
    out["parsed"].append({"options": opts.to_dict(), "problems": problems})
for raw in given["search"]:
    out["search"].append(msgspec.to_builtins(parse_params(raw)))
print(json.dumps(out))
`;

interface ServerAnswer {
  defaults: Record<string, unknown>;
  parsed: Parsed[];
  search: Record<string, unknown>[];
}

function serverAvailable(): string | false {
  const probe = spawnSync(PYTHON, ["-c", `import ${MODULES}`], { cwd: REPO_ROOT, env: PYTHON_ENV, encoding: "utf8" });
  return probe.status === 0 ? false : `${MODULES} not importable with ${PYTHON} (set SLAYER_LSP_PYTHON)`;
}

/** `parse_options` of each options input, `parse_params` of each search request, and `Options().to_dict()`. */
function askServer(options: unknown[], search: unknown[]): ServerAnswer {
  const run = spawnSync(PYTHON, ["-c", PARSE], { cwd: REPO_ROOT, env: PYTHON_ENV, input: JSON.stringify({ options, search }), encoding: "utf8" });
  assert.equal(run.status, 0, run.stderr);
  return JSON.parse(run.stdout) as ServerAnswer;
}

/** `a/{b,c}/d` -> `a/b/d`, `a/c/d` (one level of braces, as the settings use them). */
function expandBraces(pattern: string): string[] {
  const m = /\{([^{}]*)\}/.exec(pattern);
  if (!m) {
    return [pattern];
  }
  return m[1]!.split(",").flatMap((alt) => expandBraces(pattern.slice(0, m.index) + alt + pattern.slice(m.index + m[0].length)));
}

/** What the server makes of a string it was sent: an empty one means its default (None). */
function asServerSees(options: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(flatten(options)).map(([k, v]) => [k, v === "" ? null : v]));
}

describe("the server's parse_options", { skip: serverAvailable() }, () => {
  const defaults = serverOptions(readSettings(reader()));
  const user = serverOptions(readSettings(reader(USER_VALUES)));
  const outOfRange = serverOptions(readSettings(reader({ "hover.maxChars": 100 })));
  const requests = [searchParams("net sales", 50, "hybrid", 2), searchParams("net sales", 50, "slayer", 2)];
  const answer = askServer([defaults, user, { [SECTION]: user }, outOfRange], requests);
  const { defaults: serverDefaults, parsed } = answer;
  const [fromDefaults, fromUser, fromPushed, fromOutOfRange] = parsed as [Parsed, Parsed, Parsed, Parsed];

  it("knows exactly the options the extension sends", () => {
    assert.deepEqual(Object.keys(flatten(serverDefaults)).sort(), Object.keys(flatten(defaults)).sort());
  });

  it("takes package.json's defaults without a problem, as its own defaults", () => {
    assert.deepEqual(fromDefaults.problems, []);
    const expected = flatten(serverDefaults);
    const got = flatten(fromDefaults.options);
    const patterns = (v: unknown) => (v as string[]).flatMap(expandBraces).sort();
    for (const k of ["files.queryPatterns", "files.memoryPatterns"]) {
      assert.deepEqual(patterns(got[k]), patterns(expected[k]), k);
      delete got[k];
      delete expected[k];
    }
    assert.deepEqual(got, expected);
  });

  it("takes every user value as sent, at the top level and pushed under the section", () => {
    assert.deepEqual(fromUser.problems, []);
    assert.deepEqual(flatten(fromUser.options), asServerSees(user));
    assert.deepEqual(fromPushed, fromUser);
  });

  it("reports an out-of-range value and keeps its default", () => {
    assert.equal(fromOutOfRange.problems.length, 1);
    assert.match(fromOutOfRange.problems[0]!, /hover\.maxChars/);
    assert.equal(flatten(fromOutOfRange.options)["hover.maxChars"], flatten(serverDefaults)["hover.maxChars"]);
  });

  it("accepts the Search command's params with either ranking", () => {
    assert.deepEqual(
      answer.search.map((p) => [p.ranking, p.related, p.max_results]),
      [["hybrid", 2, 50], ["slayer", 0, 50]],
    );
  });
});
