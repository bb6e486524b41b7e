// The dslc plans extension: VS Code's end of `dslc lsp`. It starts the language server
// over stdio for .plan files; diagnostics, hover, completion, go to definition and
// formatting all come from dslc itself (dslc/lsp/ in the dslc repository).
const path = require("path");
const vscode = require("vscode");
const { LanguageClient, TransportKind } = require("vscode-languageclient/node");

let client;

// dslc.path: a name on PATH, an absolute path, or one relative to the workspace folder
function command() {
  const configured = vscode.workspace.getConfiguration("dslc").get("path") || "dslc";
  const folder = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
  const relative = !path.isAbsolute(configured) && /[\\/]/.test(configured);
  return { command: folder && relative ? path.join(folder, configured) : configured, cwd: folder };
}

async function start() {
  const { command: cmd, cwd } = command();
  const server = { command: cmd, args: ["lsp"], transport: TransportKind.stdio, options: { cwd } };
  client = new LanguageClient("dslc", "dslc", server, {
    documentSelector: [{ scheme: "file", language: "dslc-plan" }, { scheme: "untitled", language: "dslc-plan" }],
  });
  try {
    await client.start();
  } catch (err) {
    vscode.window.showErrorMessage(`dslc: cannot start "${cmd} lsp" (${err.message}); set dslc.path to the dslc command`);
  }
}

async function restart() {
  if (client) await client.stop().catch(() => undefined);
  await start();
}

async function activate(context) {
  context.subscriptions.push(
    vscode.commands.registerCommand("dslc.restartServer", restart),
    vscode.workspace.onDidChangeConfiguration((e) => e.affectsConfiguration("dslc.path") && restart()),
  );
  await start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
