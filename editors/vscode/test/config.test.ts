/**
 * The settings -> server mapping, run in plain Node: no VS Code host can run on CI (Node 20), and
 * this is the part of the extension the server depends on.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import {
  documentSelector,
  initializationOptions,
  readSettings,
  RESTART_SETTINGS,
  SECTION,
  serverLaunch,
  type SettingReader,
} from "../src/config";

interface ConfigProperty {
  type: string;
  default: unknown;
}

const manifest = JSON.parse(readFileSync(join(__dirname, "..", "..", "package.json"), "utf8")) as {
  contributes: { configuration: { properties: Record<string, ConfigProperty> }; commands: { command: string }[] };
  activationEvents: string[];
};
const properties = manifest.contributes.configuration.properties;

/** What `vscode.workspace.getConfiguration("slayerLsp").get(key)` returns: the user's value, else the manifest default. */
function reader(overrides: Record<string, unknown> = {}): SettingReader {
  return (key) => (key in overrides ? overrides[key] : properties[`${SECTION}.${key}`]?.default);
}

/** Nested object -> dotted keys, the way VS Code flattens a configuration section. */
function flatten(value: Record<string, unknown>, prefix = ""): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(value)) {
    if (typeof v === "object" && v !== null && !Array.isArray(v)) {
      Object.assign(out, flatten(v as Record<string, unknown>, `${prefix}${key}.`));
    } else {
      out[`${prefix}${key}`] = v;
    }
  }
  return out;
}

describe("readSettings", () => {
  it("agrees with every default declared in package.json", () => {
    const s = readSettings(reader());
    const options = flatten(initializationOptions(s));
    for (const [key, value] of Object.entries(options)) {
      assert.deepEqual(value, properties[`${SECTION}.${key}`]?.default, key);
    }
  });

  it("replaces values of the wrong type by defaults and drops blank list items", () => {
    const s = readSettings(
      reader({
        "diagnostics.enable": "yes",
        "diagnostics.debounceMs": -5,
        "hover.maxChars": Number.NaN,
        "files.queryPatterns": "q/*.yaml",
        "scope.datasources": ["jaffle", "", 3, "  supplies "],
        storage: 42,
      }),
    );
    const fallback = (key: string) => properties[`${SECTION}.${key}`]?.default;
    assert.equal(s.diagnosticsEnable, fallback("diagnostics.enable"));
    assert.equal(s.diagnosticsDebounceMs, fallback("diagnostics.debounceMs"));
    assert.equal(s.hoverMaxChars, fallback("hover.maxChars"));
    assert.deepEqual(s.queryPatterns, fallback("files.queryPatterns"));
    assert.deepEqual(s.scopeDatasources, ["jaffle", "supplies"]);
    assert.equal(s.storage, fallback("storage"));
  });
});

describe("initializationOptions", () => {
  it("carries exactly the server settings of package.json, nested like the configuration section", () => {
    const launcherOnly = new Set(["server.command", "interpreter", "trace.server"]);
    const serverKeys = Object.keys(properties)
      .map((k) => k.slice(SECTION.length + 1))
      .filter((k) => !launcherOnly.has(k))
      .sort();
    const options = initializationOptions(readSettings(reader()));
    assert.deepEqual(Object.keys(flatten(options)).sort(), serverKeys);
  });

  it("passes user values through", () => {
    const options = initializationOptions(
      readSettings(
        reader({
          storage: "${HOME}/store.db",
          "diagnostics.enable": false,
          "diagnostics.debounceMs": 50,
          "embedding.model": "bge-small",
          "scope.accessTags": ["pii"],
          "hover.maxChars": 800,
        }),
      ),
    );
    assert.deepEqual(options, {
      storage: "${HOME}/store.db",
      diagnostics: { enable: false, debounceMs: 50 },
      files: { queryPatterns: ["**/*.query.{yaml,yml,json}", "**/queries/**/*.{yaml,yml,json}"], memoryPatterns: ["**/memories/*.md"] },
      embedding: { model: "bge-small" },
      scope: { datasources: [], accessTags: ["pii"] },
      hover: { maxChars: 800 },
    });
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
  const cases: { name: string; settings: Record<string, unknown>; python?: string[]; expected: string[] }[] = [
    { name: "explicit command wins", settings: { "server.command": ["slayer-lsp", "serve"], interpreter: "/x/python" }, python: ["/venv/bin/python"], expected: ["slayer-lsp", "serve"] },
    { name: "Python extension interpreter", settings: { interpreter: "/x/python" }, python: ["/venv/bin/python"], expected: ["/venv/bin/python", "-m", "slayer_lsp", "serve"] },
    { name: "multi-word interpreter command", settings: {}, python: ["conda", "run", "-n", "env", "python"], expected: ["conda", "run", "-n", "env", "python", "-m", "slayer_lsp", "serve"] },
    { name: "interpreter setting", settings: { interpreter: " /x/python " }, expected: ["/x/python", "-m", "slayer_lsp", "serve"] },
    { name: "python3 fallback", settings: { "server.command": ["", " "] }, python: [], expected: ["python3", "-m", "slayer_lsp", "serve"] },
  ];
  for (const c of cases) {
    it(c.name, () => {
      const launch = serverLaunch(readSettings(reader(c.settings)), c.python);
      assert.deepEqual([launch.command, ...launch.args], c.expected);
    });
  }
});

describe("manifest", () => {
  it("declares the commands and the settings the code reads", () => {
    assert.deepEqual(
      manifest.contributes.commands.map((c) => c.command).sort(),
      [`${SECTION}.restartServer`, `${SECTION}.search`, `${SECTION}.showStatus`],
    );
    for (const key of [...RESTART_SETTINGS, `${SECTION}.trace.server`]) {
      assert.ok(key in properties, key);
    }
  });
});
