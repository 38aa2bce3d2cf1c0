/**
 * The interpreter selected in the Python extension (`ms-python.python`), read through its public API
 * when that extension is installed. It is optional: no import, no `extensionDependencies`; the shapes
 * below are the few members used, checked at runtime because the API has changed over the years.
 */
import * as vscode from "vscode";

const PYTHON_EXTENSION_ID = "ms-python.python";
const ACTIVATION_TIMEOUT_MS = 15_000;

interface EnvironmentPath {
  id: string;
  path: string;
}

interface PythonApi {
  ready?: Thenable<void>;
  environments?: {
    getActiveEnvironmentPath(resource?: vscode.Uri): EnvironmentPath;
    resolveEnvironment(env: EnvironmentPath | string): Thenable<{ executable?: { uri?: vscode.Uri } } | undefined>;
    onDidChangeActiveEnvironmentPath?: vscode.Event<unknown>;
  };
  /** The older API, kept by the extension for compatibility. */
  settings?: {
    getExecutionDetails?(resource?: vscode.Uri): { execCommand?: string[] };
    onDidChangeExecutionDetails?: vscode.Event<unknown>;
  };
}

function withTimeout<T>(promise: Thenable<T>, ms: number): Promise<T | undefined> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve(undefined), ms);
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

async function pythonApi(log: vscode.LogOutputChannel): Promise<PythonApi | undefined> {
  const extension = vscode.extensions.getExtension<PythonApi>(PYTHON_EXTENSION_ID);
  if (!extension) {
    return undefined;
  }
  try {
    const api = extension.isActive ? extension.exports : await withTimeout(extension.activate(), ACTIVATION_TIMEOUT_MS);
    if (!api) {
      log.warn(`${PYTHON_EXTENSION_ID} did not activate within ${ACTIVATION_TIMEOUT_MS} ms; not using its interpreter`);
      return undefined;
    }
    if (api.ready) {
      await withTimeout(api.ready, ACTIVATION_TIMEOUT_MS);
    }
    return api;
  } catch (error) {
    log.warn(`${PYTHON_EXTENSION_ID} API unavailable: ${String(error)}`);
    return undefined;
  }
}

/**
 * The command that runs the selected interpreter (one or more words), or `undefined` when the Python
 * extension is missing, has no interpreter selected, or fails.
 */
export async function selectedInterpreter(
  resource: vscode.Uri | undefined,
  log: vscode.LogOutputChannel,
): Promise<string[] | undefined> {
  const api = await pythonApi(log);
  if (!api) {
    return undefined;
  }
  try {
    const environments = api.environments;
    if (environments && typeof environments.getActiveEnvironmentPath === "function") {
      const active = environments.getActiveEnvironmentPath(resource);
      const resolved = await environments.resolveEnvironment(active);
      const executable = resolved?.executable?.uri?.fsPath;
      if (executable) {
        return [executable];
      }
    }
    const execCommand = api.settings?.getExecutionDetails?.(resource)?.execCommand;
    if (Array.isArray(execCommand) && execCommand.length > 0 && execCommand.every((w) => typeof w === "string")) {
      return execCommand;
    }
  } catch (error) {
    log.warn(`could not read the interpreter selected in ${PYTHON_EXTENSION_ID}: ${String(error)}`);
  }
  return undefined;
}

/**
 * Calls `listener` when the selected interpreter changes. Subscribes only if the Python extension is
 * already active, so that merely installing it never forces its activation; `undefined` when it did
 * not subscribe (the caller tries again after a later start).
 */
export function onInterpreterChange(listener: () => void): vscode.Disposable | undefined {
  const extension = vscode.extensions.getExtension<PythonApi>(PYTHON_EXTENSION_ID);
  const api = extension?.isActive ? extension.exports : undefined;
  const event = api?.environments?.onDidChangeActiveEnvironmentPath ?? api?.settings?.onDidChangeExecutionDetails;
  return typeof event === "function" ? event(() => listener()) : undefined;
}
