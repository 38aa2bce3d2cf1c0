/**
 * The Search and Show Status commands: thin UIs over the server's `slayer/search`, `slayer/inspect`
 * and `slayer/status` requests. Everything they show comes from the server.
 */
import * as vscode from "vscode";
import type { LanguageClient } from "vscode-languageclient/node";

import {
  findLocation,
  hitText,
  inspectRef,
  otherRanking,
  type Ranking,
  type SearchHit,
  type SearchResponse,
  searchParams,
} from "./wire";

const MAX_RESULTS = 50;

interface HitItem extends vscode.QuickPickItem {
  hit: SearchHit;
}

function toItem(hit: SearchHit): HitItem {
  return { ...hitText(hit), hit };
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

async function openDefinition(client: LanguageClient, hit: SearchHit): Promise<void> {
  const ref = inspectRef(hit.kind, hit.id);
  let result: unknown;
  try {
    result = await client.sendRequest("slayer/inspect", { refs: [ref] });
  } catch (error) {
    void vscode.window.showErrorMessage(`SLayer: inspect ${ref} failed: ${errorText(error)}`);
    return;
  }
  const location = findLocation(result, ref);
  if (!location) {
    void vscode.window.showInformationMessage(`SLayer: ${ref} has no source location to open.`);
    return;
  }
  try {
    const uri = client.protocol2CodeConverter.asUri(location.uri);
    const range = client.protocol2CodeConverter.asRange(location.range);
    const document = await vscode.workspace.openTextDocument(uri);
    await vscode.window.showTextDocument(document, { selection: range, preview: true });
  } catch (error) {
    void vscode.window.showErrorMessage(`SLayer: cannot open ${location.uri}: ${errorText(error)}`);
  }
}

/** The word or selection under the cursor, as a starting question. */
function initialQuestion(): string {
  const editor = vscode.window.activeTextEditor;
  if (!editor) {
    return "";
  }
  const { document, selection } = editor;
  if (!selection.isEmpty) {
    return document.getText(selection).trim().slice(0, 200);
  }
  const word = document.getWordRangeAtPosition(selection.active, /[\w.:-]+/);
  return word ? document.getText(word) : "";
}

/** One `slayer/search` request; `undefined` (after telling the user) when it failed. */
async function runSearch(
  client: LanguageClient,
  question: string,
  ranking: Ranking,
  related: number,
): Promise<SearchResponse | undefined> {
  let response: SearchResponse;
  try {
    response = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Window, title: `SLayer: searching (${ranking})`, cancellable: false },
      () => client.sendRequest<SearchResponse>("slayer/search", searchParams(question, MAX_RESULTS, ranking, related)),
    );
  } catch (error) {
    void vscode.window.showErrorMessage(`SLayer: search (${ranking} ranking) failed: ${errorText(error)}`);
    return undefined;
  }
  const warnings = response?.warnings ?? [];
  if (warnings.length > 0) {
    void vscode.window.showWarningMessage(`SLayer: ${warnings.join(" · ")}`);
  }
  return response ?? {};
}

export interface SearchOptions {
  /** The ranking the picker opens with (`slayerLsp.search.ranking`); its title button switches it. */
  ranking: Ranking;
  related: number;
}

/**
 * Asks for a question and lists the hits in a picker whose title button re-runs the same question
 * with the other ranking (for this search only), so the two can be compared side by side.
 */
export async function search(client: LanguageClient, options: SearchOptions): Promise<void> {
  const question = await vscode.window.showInputBox({
    title: "SLayer: Search",
    prompt: "A question or entity names; results cover datasources, models, columns, measures and memories",
    value: initialQuestion(),
    ignoreFocusOut: true,
  });
  if (question === undefined || question.trim() === "") {
    return;
  }
  let ranking = options.ranking;
  const first = await runSearch(client, question, ranking, options.related);
  if (!first) {
    return;
  }
  const pick = vscode.window.createQuickPick<HitItem>();
  pick.matchOnDescription = true;
  pick.matchOnDetail = true;
  pick.ignoreFocusOut = true;
  const render = (response: SearchResponse) => {
    const hits = (response.results ?? []).filter((h) => typeof h?.id === "string" && typeof h?.kind === "string");
    const resolved = response.resolved_input_entities ?? [];
    pick.items = hits.map(toItem);
    pick.title = `SLayer: ${hits.length} result${hits.length === 1 ? "" : "s"} for "${question}" (${ranking} ranking)`;
    pick.placeholder =
      hits.length === 0
        ? `Nothing found; the title button tries the ${otherRanking(ranking)} ranking`
        : resolved.length > 0
          ? `resolved: ${resolved.join(", ")}`
          : "Pick an entity to open its definition";
    pick.buttons = [{ iconPath: new vscode.ThemeIcon("arrow-swap"), tooltip: `Rank with ${otherRanking(ranking)}` }];
  };
  render(first);
  const picked = await new Promise<SearchHit | undefined>((resolve) => {
    pick.onDidTriggerButton(async () => {
      if (pick.busy) {
        return;
      }
      const next = otherRanking(ranking);
      pick.busy = true;
      const response = await runSearch(client, question, next, options.related);
      pick.busy = false;
      if (response) {
        ranking = next;
        render(response);
      }
    });
    pick.onDidAccept(() => {
      resolve(pick.selectedItems[0]?.hit);
      pick.hide();
    });
    pick.onDidHide(() => resolve(undefined));
    pick.show();
  });
  pick.dispose();
  if (picked) {
    await openDefinition(client, picked);
  }
}

/** A one-line summary of the scalar fields of a status object (its shape belongs to the server). */
function summarize(status: unknown): string {
  if (typeof status !== "object" || status === null) {
    return String(status);
  }
  const parts: string[] = [];
  for (const [key, value] of Object.entries(status)) {
    if (["string", "number", "boolean"].includes(typeof value)) {
      parts.push(`${key}: ${String(value)}`);
    } else if (Array.isArray(value)) {
      parts.push(`${key}: ${value.length}`);
    }
  }
  return parts.slice(0, 8).join(" · ");
}

export async function showStatus(client: LanguageClient, launch: string, channel: vscode.OutputChannel): Promise<void> {
  let status: unknown;
  try {
    status = await client.sendRequest("slayer/status", {});
  } catch (error) {
    void vscode.window.showErrorMessage(`SLayer: status failed: ${errorText(error)}`);
    return;
  }
  channel.appendLine(`[${new Date().toISOString()}] server: ${launch}`);
  channel.appendLine(JSON.stringify(status, null, 2));
  const choice = await vscode.window.showInformationMessage(`SLayer: ${summarize(status) || "running"}`, "Show Details");
  if (choice === "Show Details") {
    channel.show(true);
  }
}
