/**
 * Entry point: launches the slayer-lsp daemon over stdio and registers the three commands.
 *
 * All language features live in the server; this file only turns settings into a process and a
 * `LanguageClient`, and rebuilds both when a setting that shapes them changes.
 */
import * as vscode from "vscode";
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  type LanguageClientOptions,
  type ServerOptions,
} from "vscode-languageclient/node";

import { search, showStatus } from "./commands";
import {
  documentSelector,
  type Launch,
  readSettings,
  RESTART_SETTINGS,
  SECTION,
  SERVER_SETTINGS,
  serverLaunch,
  serverOptions as optionsFor,
  usesPythonExtension,
} from "./config";
import { onInterpreterChange, selectedInterpreter } from "./python";

const NAME = "SLayer LSP";

let client: LanguageClient | undefined;
let launch: Launch | undefined;
/** Starts, stops and restarts run one at a time, in order. */
let queue: Promise<void> = Promise.resolve();
/** Settles with whether the current client's start succeeded. */
let starting: Promise<boolean> | undefined;
let log: vscode.LogOutputChannel;
let statusChannel: vscode.OutputChannel;
let extensionContext: vscode.ExtensionContext;
/** Set once the Python extension is active and watched (it may activate only at a later start). */
let watchingInterpreter = false;

function settings() {
  const config = vscode.workspace.getConfiguration(SECTION);
  return readSettings((key) => config.get(key));
}

function workspaceRoot(): vscode.Uri | undefined {
  return vscode.workspace.workspaceFolders?.[0]?.uri;
}

function describe(l: Launch): string {
  return [l.command, ...l.args].map((w) => (/\s/.test(w) ? JSON.stringify(w) : w)).join(" ");
}

async function createClient(): Promise<LanguageClient> {
  const s = settings();
  const root = workspaceRoot();
  // Not asked (nor activated) when a setting of this extension already decides the command line.
  const python = usesPythonExtension(s) ? await selectedInterpreter(root, log) : undefined;
  launch = serverLaunch(s, python);
  log.info(`starting: ${describe(launch)}`);

  const cwd = root?.scheme === "file" ? root.fsPath : undefined;
  const serverOptions: ServerOptions = {
    command: launch.command,
    args: launch.args,
    // No `transport`: with TransportKind.stdio the client would append `--stdio` to a command line
    // the user wrote; left unset it still speaks over the process's stdin/stdout.
    options: cwd ? { cwd } : {},
  };
  const clientOptions: LanguageClientOptions = {
    documentSelector: documentSelector(s),
    // A function, so that a restart by the client itself (after a crash) sends current settings.
    initializationOptions: () => optionsFor(settings()),
    // No `synchronize.configurationSection`: it would push the raw section (launcher and Search
    // settings included) after every start; `pushSettings` sends the mapped options instead.
    outputChannel: log,
    middleware: {
      workspace: {
        // A server that pulls `slayerLsp` gets the same mapped options as it is pushed.
        configuration: async (params, token, next) => {
          const answer = await next(params, token);
          if (!Array.isArray(answer)) {
            return answer;
          }
          return params.items.map((item, i) => (item.section === SECTION ? optionsFor(settings()) : answer[i]));
        },
      },
    },
  };
  return new LanguageClient(SECTION, NAME, serverOptions, clientOptions);
}

/** Sends the current options to the running server, once its start has settled. */
async function pushSettings(): Promise<void> {
  const current = client;
  if (!current || !starting || !(await starting) || current !== client || !current.isRunning()) {
    return; // no server, or a start still to come, which sends the current options with initialize
  }
  try {
    await current.sendNotification(DidChangeConfigurationNotification.type, {
      settings: { [SECTION]: optionsFor(settings()) },
    });
  } catch (error) {
    log.warn(`sending the changed settings: ${String(error)}`);
  }
}

/** Restarts the server when the Python extension's selection changes and the launch depends on it. */
function watchInterpreter(): void {
  if (watchingInterpreter) {
    return;
  }
  const watch = onInterpreterChange(() => {
    if (usesPythonExtension(settings())) {
      log.info("selected Python interpreter changed; restarting");
      void enqueue(startClient);
    }
  });
  if (watch) {
    watchingInterpreter = true;
    extensionContext.subscriptions.push(watch);
  }
}

async function stopClient(): Promise<void> {
  const old = client;
  client = undefined;
  starting = undefined;
  if (old) {
    // Taken first: the client forgets its process while it stops.
    const serverProcess = old.serverProcess;
    try {
      await old.dispose(5_000);
    } catch (error) {
      // A client still initializing refuses to stop; its process is ended here, so that Restart
      // always gets rid of a hung server.
      log.warn(`stopping the server: ${String(error)}`);
      serverProcess?.kill();
    }
  }
}

async function reportStartFailure(error: unknown): Promise<void> {
  const choice = await vscode.window.showErrorMessage(
    `${NAME}: could not start \`${launch ? describe(launch) : "the server"}\` ` +
      `(${error instanceof Error ? error.message : String(error)}). ` +
      "Install slayer-lsp into that Python environment, or set `slayerLsp.interpreter` or `slayerLsp.server.command`.",
    "Open Settings",
    "Show Output",
  );
  if (choice === "Open Settings") {
    void vscode.commands.executeCommand("workbench.action.openSettings", SECTION);
  } else if (choice === "Show Output") {
    log.show(true);
  }
}

/** Replaces the client. Does not wait for the server's initialize, so a hung server never blocks the queue. */
async function startClient(): Promise<void> {
  await stopClient();
  const next = await createClient();
  watchInterpreter(); // after createClient, which activated the Python extension when it was asked
  client = next;
  starting = next.start().then(
    () => true,
    (error: unknown) => {
      if (client === next) {
        void reportStartFailure(error);
      }
      return false;
    },
  );
}

function enqueue(step: () => Promise<void>): Promise<void> {
  queue = queue.then(step).catch((error: unknown) => log.error(`${NAME}: ${String(error)}`));
  return queue;
}

/** The running client; (re)started first when it never started, failed to, or has stopped. */
async function runningClient(): Promise<LanguageClient | undefined> {
  await queue;
  const started = starting ? await starting : false;
  if (!started || !client?.isRunning()) {
    await enqueue(startClient);
    await starting;
  }
  return client?.isRunning() ? client : undefined;
}

export function activate(context: vscode.ExtensionContext): void {
  extensionContext = context;
  log = vscode.window.createOutputChannel(NAME, { log: true });
  statusChannel = vscode.window.createOutputChannel(`${NAME} Status`);
  context.subscriptions.push(log, statusChannel);

  context.subscriptions.push(
    vscode.commands.registerCommand(`${SECTION}.restartServer`, () => enqueue(startClient)),
    vscode.commands.registerCommand(`${SECTION}.search`, async () => {
      const c = await runningClient();
      if (c) {
        const s = settings();
        await search(c, { ranking: s.searchRanking, related: s.searchRelated });
      }
    }),
    vscode.commands.registerCommand(`${SECTION}.showStatus`, async () => {
      const c = await runningClient();
      if (c) {
        await showStatus(c, launch ? describe(launch) : "", statusChannel);
      }
    }),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (RESTART_SETTINGS.some((key) => event.affectsConfiguration(key))) {
        log.info("launch or file-pattern settings changed; restarting");
        void enqueue(startClient);
      } else if (SERVER_SETTINGS.some((key) => event.affectsConfiguration(key))) {
        void pushSettings();
      }
    }),
  );

  // Not awaited: activation returns at once while the Python extension and the server start.
  void enqueue(startClient);
}

export function deactivate(): Promise<void> {
  return enqueue(stopClient);
}
