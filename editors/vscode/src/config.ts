/**
 * Settings -> server command line, initializationOptions and document selector.
 *
 * Pure functions over a settings reader, with no runtime dependency on `vscode`, so that the mapping the
 * server relies on can be tested in plain Node (see `test/config.test.ts`).
 */

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
  embeddingModel: string;
  scopeDatasources: string[];
  scopeAccessTags: string[];
  hoverMaxChars: number;
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

function num(value: unknown, fallback: number): number {
  return typeof value === "number" && Number.isFinite(value) && value >= 0 ? value : fallback;
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
    diagnosticsDebounceMs: num(get("diagnostics.debounceMs"), 300),
    queryPatterns: strings(get("files.queryPatterns"), DEFAULT_QUERY_PATTERNS),
    memoryPatterns: strings(get("files.memoryPatterns"), DEFAULT_MEMORY_PATTERNS),
    embeddingModel: str(get("embedding.model"), ""),
    scopeDatasources: strings(get("scope.datasources"), []),
    scopeAccessTags: strings(get("scope.accessTags"), []),
    hoverMaxChars: num(get("hover.maxChars"), 2000),
  };
}

/**
 * The server's options, nested exactly as VS Code nests the `slayerLsp` section that
 * `workspace/didChangeConfiguration` later carries, so the server parses one shape for both.
 * Empty strings mean "server default".
 */
export function initializationOptions(s: Settings): Record<string, unknown> {
  return {
    storage: s.storage,
    diagnostics: { enable: s.diagnosticsEnable, debounceMs: s.diagnosticsDebounceMs },
    files: { queryPatterns: s.queryPatterns, memoryPatterns: s.memoryPatterns },
    embedding: { model: s.embeddingModel },
    scope: { datasources: s.scopeDatasources, accessTags: s.scopeAccessTags },
    hover: { maxChars: s.hoverMaxChars },
  };
}

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

/**
 * `slayerLsp.server.command` verbatim when set; otherwise `<python> -m slayer_lsp serve`, where
 * `python` is the Python extension's interpreter command (which may itself be several words, e.g.
 * `conda run -n env python`), else `slayerLsp.interpreter`, else `python3`.
 */
export function serverLaunch(s: Settings, pythonCommand: string[] | undefined): Launch {
  if (s.serverCommand.length > 0) {
    const [command, ...args] = s.serverCommand;
    return { command: command!, args };
  }
  const python = pythonCommand && pythonCommand.length > 0 ? pythonCommand : [s.interpreter || "python3"];
  const [command, ...prefix] = python;
  return { command: command!, args: [...prefix, "-m", "slayer_lsp", "serve"] };
}
