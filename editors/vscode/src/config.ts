/**
 * Settings -> server command line, server options and document selector.
 *
 * Pure functions over a settings reader, with no runtime dependency on `vscode`, so that the mapping the
 * server relies on can be tested in plain Node (see `test/config.test.ts`).
 */
import { RANKINGS, type Ranking } from "./wire";

/** The configuration section; also the client id, so `slayerLsp.trace.server` drives tracing. */
export const SECTION = "slayerLsp";

/** Store files are laid out by SLayer itself, so these patterns are fixed rather than settings. */
export const STORE_MODEL_PATTERNS = ["**/models/**/*.{yaml,yml}"];
export const STORE_DATASOURCE_PATTERNS = ["**/datasources/*.{yaml,yml}"];

export const DEFAULT_QUERY_PATTERNS = ["**/*.query.{yaml,yml,json}", "**/queries/**/*.{yaml,yml,json}"];
export const DEFAULT_MEMORY_PATTERNS = ["**/memories/*.md"];

/** Settings whose change alters the launched process or the selector: only a restart applies them. */
export const RESTART_SETTINGS = [
  `${SECTION}.server.command`,
  `${SECTION}.interpreter`,
  `${SECTION}.files.queryPatterns`,
  `${SECTION}.files.memoryPatterns`,
];

export interface Settings {
  serverCommand: string[];
  interpreter: string;
  storage: string;
  diagnosticsEnable: boolean;
  diagnosticsDebounceMs: number;
  queryPatterns: string[];
  memoryPatterns: string[];
  embeddingEnable: boolean;
  embeddingModel: string;
  embeddingSwitchModel: boolean;
  scopeDatasources: string[];
  scopeAccessTags: string[];
  scopeUntaggedOnly: boolean;
  hoverMaxChars: number;
  /** Read by the Search command, not sent as a server option. */
  searchRanking: Ranking;
  searchRelated: number;
}

/** Reads one key below `slayerLsp` (e.g. `diagnostics.enable`); `undefined` when unset. */
export type SettingReader = (key: string) => unknown;

/** Plain-data twin of `vscode.DocumentFilter`, so this module needs no `vscode` at runtime. */
export interface FileFilter {
  scheme: "file";
  language: string;
  pattern: string;
}

export interface Launch {
  command: string;
  args: string[];
}

function str(value: unknown, fallback: string): string {
  return typeof value === "string" ? value.trim() : fallback;
}

function bool(value: unknown, fallback: boolean): boolean {
  return typeof value === "boolean" ? value : fallback;
}

/**
 * Any integer passes, even out of range: the server owns the ranges and reports a value it refuses
 * (with the value it keeps instead), which tells the user more than a silent default here.
 */
function int(value: unknown, fallback: number): number {
  return typeof value === "number" && Number.isInteger(value) ? value : fallback;
}

function oneOf<T extends string>(value: unknown, choices: readonly T[], fallback: T): T {
  return choices.find((c) => c === value) ?? fallback;
}

/** A string list with blanks and non-strings dropped (settings.json is hand-edited). */
function strings(value: unknown, fallback: string[]): string[] {
  if (!Array.isArray(value)) {
    return fallback;
  }
  return value.filter((item): item is string => typeof item === "string" && item.trim() !== "").map((s) => s.trim());
}

/** Settings with wrong types replaced by the defaults declared in package.json. */
export function readSettings(get: SettingReader): Settings {
  return {
    serverCommand: strings(get("server.command"), []),
    interpreter: str(get("interpreter"), ""),
    storage: str(get("storage"), ""),
    diagnosticsEnable: bool(get("diagnostics.enable"), true),
    diagnosticsDebounceMs: int(get("diagnostics.debounceMs"), 300),
    queryPatterns: strings(get("files.queryPatterns"), DEFAULT_QUERY_PATTERNS),
    memoryPatterns: strings(get("files.memoryPatterns"), DEFAULT_MEMORY_PATTERNS),
    embeddingEnable: bool(get("embedding.enable"), true),
    embeddingModel: str(get("embedding.model"), ""),
    embeddingSwitchModel: bool(get("embedding.switchModel"), false),
    scopeDatasources: strings(get("scope.datasources"), []),
    scopeAccessTags: strings(get("scope.accessTags"), []),
    scopeUntaggedOnly: bool(get("scope.untaggedOnly"), false),
    hoverMaxChars: int(get("hover.maxChars"), 4000),
    searchRanking: oneOf(get("search.ranking"), RANKINGS, "hybrid"),
    searchRelated: Math.max(0, int(get("search.related"), 0)),
  };
}

/**
 * The server's options (`slayer_lsp/lsp/options.py`, camelCase as `Options.to_dict()` gives them):
 * the one mapping behind `initializationOptions`, the pushed `workspace/didChangeConfiguration` and
 * the answer to a `workspace/configuration` pull, so the server parses one shape everywhere and never
 * sees the settings only this extension reads. Empty strings mean "server default".
 */
export function serverOptions(s: Settings): Record<string, unknown> {
  return {
    storage: s.storage,
    diagnostics: { enable: s.diagnosticsEnable, debounceMs: s.diagnosticsDebounceMs },
    files: { queryPatterns: s.queryPatterns, memoryPatterns: s.memoryPatterns },
    embedding: { enable: s.embeddingEnable, model: s.embeddingModel, switchModel: s.embeddingSwitchModel },
    scope: { datasources: s.scopeDatasources, accessTags: s.scopeAccessTags, untaggedOnly: s.scopeUntaggedOnly },
    hover: { maxChars: s.hoverMaxChars },
  };
}

/** Nested object -> dotted keys, the way VS Code flattens a configuration section. */
export function flatten(value: Record<string, unknown>, prefix = ""): Record<string, unknown> {
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

/** The settings `serverOptions` carries (full ids): a change to one of them is pushed to the server. */
export const SERVER_SETTINGS = Object.keys(flatten(serverOptions(readSettings(() => undefined)))).map(
  (key) => `${SECTION}.${key}`,
);

/**
 * Built-in language ids narrowed by patterns: the files stay YAML/JSON/Markdown for every other
 * extension, and this server only sees the ones that are SLayer documents.
 */
export function documentSelector(s: Settings): FileFilter[] {
  const filters: FileFilter[] = [];
  const add = (languages: string[], patterns: string[]) => {
    for (const pattern of patterns) {
      for (const language of languages) {
        filters.push({ scheme: "file", language, pattern });
      }
    }
  };
  add(["yaml", "json"], s.queryPatterns);
  add(["markdown"], s.memoryPatterns);
  add(["yaml"], [...STORE_MODEL_PATTERNS, ...STORE_DATASOURCE_PATTERNS]);
  return filters;
}

/** Whether the launch depends on the Python extension's interpreter (so it is asked for, and watched). */
export function usesPythonExtension(s: Settings): boolean {
  return s.serverCommand.length === 0 && s.interpreter === "";
}

/**
 * The first that is set: `slayerLsp.server.command` verbatim; `<slayerLsp.interpreter> -m slayer_lsp
 * serve`; the same with the Python extension's interpreter command (which may be several words, e.g.
 * `conda run -n env python`); `python3 -m slayer_lsp serve`. A setting the user wrote for this
 * extension wins over the interpreter selected for the workspace in general.
 */
export function serverLaunch(s: Settings, pythonCommand: string[] | undefined): Launch {
  if (s.serverCommand.length > 0) {
    const [command, ...args] = s.serverCommand;
    return { command: command!, args };
  }
  let python = ["python3"];
  if (s.interpreter !== "") {
    python = [s.interpreter];
  } else if (pythonCommand && pythonCommand.length > 0) {
    python = pythonCommand;
  }
  const [command, ...prefix] = python;
  return { command: command!, args: [...prefix, "-m", "slayer_lsp", "serve"] };
}
