/**
 * Entry point: launches the slayer-lsp daemon over stdio and registers the three commands.
 *
 * All language features live in the server; this file only turns settings into a process and a
 * `LanguageClient`, and rebuilds both when a setting that shapes them changes.
 */
import * as vscode from "vscode";
import { LanguageClient, type LanguageClientOptions, type ServerOptions } from "vscode-languageclient/node";

import { search, showStatus } from "./commands";
import {
  documentSelector,
  initializationOptions,
  type Launch,
  readSettings,
  RESTART_SETTINGS,
  SECTION,
  serverLaunch,
} from "./config";
import { onInterpreterChange, selectedInterpreter } from "./python";

const NAME = "SLayer LSP";

let client: LanguageClient | undefined;
/** Clients that are being replaced; marked synchronously, before the asynchronous stop runs. */
const retired = new WeakSet<LanguageClient>();
let launch: Launch | undefined;
/** Starts, stops and restarts run one at a time, in order. */
let queue: Promise<void> = Promise.resolve();
/** Settles with whether the current client's start succeeded. */
let starting: Promise<boolean> | undefined;
let log: vscode.LogOutputChannel;
let statusChannel: vscode.OutputChannel;

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
  const python = s.serverCommand.length > 0 ? undefined : await selectedInterpreter(root, log);
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
    initializationOptions: () => initializationOptions(settings()),
    synchronize: { configurationSection: SECTION },
    outputChannel: log,
    middleware: {
      workspace: {
        // A client being replaced would fail to deliver the change it is being replaced for.
        didChangeConfiguration: (sections, next) => (retired.has(created) ? Promise.resolve() : next(sections)),
      },
    },
  };
  const created = new LanguageClient(SECTION, NAME, serverOptions, clientOptions);
  return created;
}

async function stopClient(): Promise<void> {
  const old = client;
  client = undefined;
  starting = undefined;
  if (old) {
    retired.add(old);
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
      "Install slayer-lsp into that Python environment, or set `slayerLsp.server.command`.",
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
  log = vscode.window.createOutputChannel(NAME, { log: true });
  statusChannel = vscode.window.createOutputChannel(`${NAME} Status`);
  context.subscriptions.push(log, statusChannel);

  context.subscriptions.push(
    vscode.commands.registerCommand(`${SECTION}.restartServer`, () => enqueue(startClient)),
    vscode.commands.registerCommand(`${SECTION}.search`, async () => {
      const c = await runningClient();
      if (c) {
        await search(c);
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
        if (client) {
          retired.add(client);
        }
        void enqueue(startClient);
      }
    }),
  );

  // Not awaited: activation returns at once while the Python extension and the server start.
  void enqueue(startClient).then(() => {
    // Subscribed after the first start, which activated the Python extension if it is installed.
    context.subscriptions.push(
      onInterpreterChange(() => {
        if (settings().serverCommand.length === 0) {
          log.info("selected Python interpreter changed; restarting");
          void enqueue(startClient);
        }
      }),
    );
  });
}

export function deactivate(): Promise<void> {
  return enqueue(stopClient);
}
