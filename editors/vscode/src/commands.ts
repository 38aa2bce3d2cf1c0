/**
 * The Search and Show Status commands: thin UIs over the server's `slayer/search`, `slayer/inspect`
 * and `slayer/status` requests. Everything they show comes from the server.
 */
import * as vscode from "vscode";
import type { LanguageClient } from "vscode-languageclient/node";

import { findLocation, inspectRef, type SearchHit, type SearchResponse } from "./wire";

const MAX_RESULTS = 50;

interface HitItem extends vscode.QuickPickItem {
  hit: SearchHit;
}

const KIND_ICONS: Record<string, string> = {
  datasource: "database",
  model: "symbol-class",
  column: "symbol-field",
  measure: "symbol-number",
  aggregation: "symbol-operator",
  memory: "note",
};

function firstLine(text: string | null | undefined, limit = 160): string {
  const line = (text ?? "").trim().split(/\r?\n/, 1)[0] ?? "";
  return line.length > limit ? `${line.slice(0, limit - 1)}…` : line;
}

function toItem(hit: SearchHit): HitItem {
  const icon = KIND_ICONS[hit.kind] ?? "symbol-misc";
  const score = typeof hit.score === "number" ? hit.score.toFixed(3) : "";
  const matched = hit.matched_entities?.length ? ` · ${hit.matched_entities.join(", ")}` : "";
  return {
    label: `$(${icon}) ${hit.id}`,
    description: `${hit.kind} ${score}${matched}`,
    detail: firstLine(hit.description) || firstLine(hit.text) || undefined,
    hit,
  };
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

export async function search(client: LanguageClient): Promise<void> {
  const question = await vscode.window.showInputBox({
    title: "SLayer: Search",
    prompt: "A question or entity names; results cover datasources, models, columns, measures and memories",
    value: initialQuestion(),
    ignoreFocusOut: true,
  });
  if (question === undefined || question.trim() === "") {
    return;
  }
  let response: SearchResponse;
  try {
    response = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Window, title: "SLayer: searching", cancellable: false },
      () => client.sendRequest<SearchResponse>("slayer/search", { question, max_results: MAX_RESULTS }),
    );
  } catch (error) {
    void vscode.window.showErrorMessage(`SLayer: search failed: ${errorText(error)}`);
    return;
  }
  const warnings = response?.warnings ?? [];
  if (warnings.length > 0) {
    void vscode.window.showWarningMessage(`SLayer: ${warnings.join(" · ")}`);
  }
  const hits = (response?.results ?? []).filter((h) => typeof h?.id === "string" && typeof h?.kind === "string");
  if (hits.length === 0) {
    void vscode.window.showInformationMessage(`SLayer: nothing found for "${question}".`);
    return;
  }
  const resolved = response.resolved_input_entities ?? [];
  const picked = await vscode.window.showQuickPick(hits.map(toItem), {
    title: `SLayer: ${hits.length} result${hits.length === 1 ? "" : "s"} for "${question}"`,
    placeHolder: resolved.length > 0 ? `resolved: ${resolved.join(", ")}` : "Pick an entity to open its definition",
    matchOnDescription: true,
    matchOnDetail: true,
  });
  if (picked) {
    await openDefinition(client, picked.hit);
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
