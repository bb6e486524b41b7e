"""``dslc lsp`` as an editor meets it: one server process (``python -m dslc lsp``) driven
through JSON-RPC over its stdin and stdout, as VS Code or Neovim drive it. Expected
diagnostics and estimates come from the command line (``dslc lint --format json``,
``dslc explain --json``), never from the server's own functions."""

from __future__ import annotations

import json
import os
import queue
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEBOUNCE = 0.3  # dslc.lsp.server.DEBOUNCE


class Client:
    """The client's end of the protocol: Content-Length framed JSON-RPC on the server's
    stdio, read by a thread; messages not yet asked for wait in ``inbox``."""

    def __init__(self, cwd: Path):
        # a 4 GiB address space, as conftest's run_script.dslc: a regression that reads
        # without bound fails with MemoryError, it does not take the machine
        self.proc = subprocess.Popen([sys.executable, "-m", "dslc", "lsp"], cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)))
        self.messages: queue.Queue = queue.Queue()
        self.inbox: list[dict] = []
        self.ids = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            headers = {}
            while (line := out.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("ascii").partition(":")
                headers[name.strip().lower()] = value.strip()
            if not line:
                return
            self.messages.put(json.loads(out.read(int(headers["content-length"]))))

    def send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        self.proc.stdin.flush()

    def notify(self, method: str, params: dict) -> None:
        self.send({"method": method, "params": params})

    def request(self, method: str, params: dict | None) -> dict:
        """The response's whole message (``result`` or ``error``)."""
        self.ids += 1
        self.send({"id": self.ids, "method": method, "params": params})
        return self.wait(lambda m: m.get("id") == self.ids and "method" not in m)

    def wait(self, match, timeout: float = 10.0) -> dict:
        for i, m in enumerate(self.inbox):
            if match(m):
                return self.inbox.pop(i)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                m = self.messages.get(timeout=left)
            except queue.Empty:
                break
            if "method" in m and "id" in m:  # a request of the server's: answered, as a client does
                self.send({"id": m["id"], "result": None})
            elif match(m):
                return m
            else:
                self.inbox.append(m)
        raise TimeoutError("no such message")

    def diagnostics(self, uri: str, timeout: float = 10.0) -> dict:
        return self.wait(lambda m: m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri, timeout)["params"]

    def drain(self, seconds: float) -> list[dict]:
        """Every message that comes within ``seconds``."""
        time.sleep(seconds)
        while not self.messages.empty():
            self.inbox.append(self.messages.get())
        out, self.inbox = self.inbox, []
        return out


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The repository's llama3_70b plan and the clusters it imports, in a folder of their own."""
    root = tmp_path_factory.mktemp("lsp")
    (root / "plans").mkdir()
    shutil.copytree(ROOT / "clusters", root / "clusters")
    shutil.copy(ROOT / "plans" / "llama3_70b.plan", root / "plans")
    return root


def started(work: Path) -> tuple[Client, dict]:
    """A server in ``work``, initialised (as VS Code does), and its capabilities."""
    c = Client(work)
    init = c.request("initialize", {"processId": None, "rootUri": work.as_uri(), "capabilities": {
        "textDocument": {"completion": {"completionItem": {"snippetSupport": True}}}}})
    c.notify("initialized", {})
    return c, init["result"]["capabilities"]


@pytest.fixture(scope="module")
def client(work):
    c, caps = started(work)
    assert caps["textDocumentSync"] in (1, {"openClose": True, "change": 1, "save": True} | caps["textDocumentSync"])
    assert caps["hoverProvider"] and caps["definitionProvider"] and caps["documentFormattingProvider"]
    assert "completionProvider" in caps and caps.get("positionEncoding", "utf-16") == "utf-16"
    yield c
    assert c.request("shutdown", None).get("error") is None
    c.notify("exit", None)
    assert c.proc.wait(10) == 0
    stderr = c.proc.stderr.read().decode()
    assert "Traceback" not in stderr, stderr


def open_doc(client: Client, path: Path, text: str | None = None) -> str:
    uri = path.as_uri()
    text = path.read_text() if text is None else text
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "dslc-plan", "version": 1, "text": text}})
    return uri


def change(client: Client, uri: str, version: int, text: str) -> None:
    client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]})


def at(text: str, needle: str, into: int = 0, after: str = "") -> dict:
    """The protocol position (UTF-16) of ``into`` characters into the first ``needle``
    (the first after ``after``)."""
    i = text.index(needle, text.index(after)) + into
    line = text.count("\n", 0, i)
    col = i - (text.rfind("\n", 0, i) + 1)
    return {"line": line, "character": len(text.split("\n")[line][:col].encode("utf-16-le")) // 2}


def ask(client: Client, method: str, uri: str, position: dict):
    r = client.request(method, {"textDocument": {"uri": uri}, "position": position})
    assert "error" not in r, r
    return r["result"]


def cli(*args: str, cwd: Path) -> str:
    return subprocess.run([sys.executable, "-m", "dslc", *args], cwd=cwd, capture_output=True, text=True, timeout=120).stdout


def protocol_position(text: str, line: int, col: int) -> dict:
    """dslc's 1-based line (counted at \\n) and column (in characters) as the protocol's
    position: lines end at \\n, \\r\\n or \\r, columns count UTF-16 units."""
    i = sum(len(s) + 1 for s in text.split("\n")[: line - 1]) + col - 1
    before = re.split(r"\r\n|\r|\n", text[:i])
    return {"line": len(before) - 1, "character": len(before[-1].encode("utf-16-le")) // 2}


def lint_ranges(path: Path, cwd: Path) -> list[tuple]:
    """``dslc lint --format json``'s diagnostics of the file as (code, severity, range),
    the range in the protocol's terms."""
    text = path.read_bytes().decode()
    out = []
    for d in json.loads(cli("lint", "--format", "json", str(path), cwd=cwd)):
        rng = {"start": protocol_position(text, d["line"], d["col"]), "end": protocol_position(text, d["end_line"], d["end_col"])}
        out.append((d["code"], d["severity"], rng))
    return sorted(out, key=str)


SEVERITY = {1: "error", 2: "warning", 3: "note"}


def as_lint(diags: list[dict]) -> list[tuple]:
    return sorted(((d["code"], SEVERITY[d["severity"]], d["range"]) for d in diags), key=str)


# -- diagnostics --------------------------------------------------------------------------


def test_a_clean_plan_has_no_diagnostics(client, work):
    uri = open_doc(client, work / "plans" / "llama3_70b.plan")
    got = client.diagnostics(uri)
    assert got["diagnostics"] == [] and got["version"] == 1


def test_a_plan_with_errors_has_lints_codes_and_ranges(client, work):
    """Two errors, one on a line whose emoji before it is two UTF-16 units: the codes,
    severities and ranges of `dslc lint --format json` for the same file."""
    text = (work / "plans" / "llama3_70b.plan").read_text()
    text = text.replace("tp = 8 on nvlink", "tp = 8 on nvlnk").replace(
        'checkpoint { every = 250; dir = "checkpoints/llama3_70b" }', 'checkpoint { dir = "ckpt/😀"; every = 0 }')
    bad = work / "plans" / "bad.plan"
    bad.write_text(text)
    uri = open_doc(client, bad)
    got = client.diagnostics(uri)["diagnostics"]
    want = lint_ranges(bad, work)
    assert {code for code, _, _ in want} >= {"E031", "E015"}
    assert as_lint(got) == want
    e015 = next(d for d in got if d["code"] == "E015")
    assert e015["source"] == "dslc" and e015["range"]["start"] == at(text, "every = 0", len("every = "))
    assert "did you mean 'nvlink'?" in next(d for d in got if d["code"] == "E031")["message"]


def test_ranges_count_lines_as_the_protocol_does(client, work):
    """CRLF line ends, and a lone CR in a comment (a line break to the protocol, not to
    dslc's parser): the diagnostics still cover the same text as lint's."""
    text = (work / "plans" / "llama3_70b.plan").read_text().replace("\n", "\r\n")
    text = text.replace("// Llama-3 70B", "// Llama-3\r70B").replace("pp = 4 on ib", "pp = 4 on infiniband")
    bad = work / "plans" / "crlf.plan"
    bad.write_bytes(text.encode())
    uri = open_doc(client, bad, text)
    got = client.diagnostics(uri)["diagnostics"]
    assert as_lint(got) == lint_ranges(bad, work) and [d["code"] for d in got] == ["E031"]
    assert got[0]["range"]["start"] == {"line": text[: text.index("infiniband")].count("\n") + 1, "character": 18}


def test_typing_is_linted_once_it_pauses_and_the_fix_clears(client, work):
    path = work / "plans" / "llama3_70b.plan"
    text = path.read_text()
    uri = path.as_uri()
    client.drain(DEBOUNCE * 2)
    # five keystrokes in quick succession, the last one leaves `micro_batch = 0`
    for v, typed in enumerate(["micro_batch = 1", "micro_batch = ", "micro_batch = 0", "micro_batch = 00", "micro_batch = 0"], start=2):
        change(client, uri, v, text.replace("micro_batch = 1", typed))
    got = client.diagnostics(uri)
    assert got["version"] == 6 and [d["code"] for d in got["diagnostics"]] == ["E015"]
    assert not [m for m in client.drain(DEBOUNCE * 3) if m.get("params", {}).get("uri") == uri]  # once
    change(client, uri, 7, text)
    fixed = client.diagnostics(uri)
    assert fixed == {"uri": uri, "version": 7, "diagnostics": []}


def test_an_error_in_an_imported_cluster_is_shown_at_the_import(client, work):
    (work / "clusters" / "broken.plan").write_text(
        "cluster tiny {\n    nodes = 1; gpus_per_node = 2; device = h100_sxm\n"
        "    link nvlink { scope = node; bandwidth = 450 GB }\n}\n")
    text = (work / "plans" / "llama3_70b.plan").read_text().replace('"../clusters/h100.plan"', '"../clusters/broken.plan"')
    text = text.replace("cluster = h100_8x8", "cluster = tiny")
    uri = open_doc(client, work / "plans" / "uses_broken.plan", text)
    (d,) = [d for d in client.diagnostics(uri)["diagnostics"] if d["code"] == "E014"]
    assert d["range"]["start"]["line"] == at(text, "import")["line"] and d["message"].startswith("../clusters/broken.plan:3:")
    (rel,) = d["relatedInformation"]
    assert rel["location"]["uri"] == (work / "clusters" / "broken.plan").as_uri() and rel["location"]["range"]["start"]["line"] == 2


# -- hover --------------------------------------------------------------------------------


def test_hover_on_a_key_shows_its_type_default_and_meaning(client, work):
    path = work / "plans" / "llama3_70b.plan"
    text, uri = path.read_text(), path.as_uri()
    change(client, uri, 20, text)
    md = ask(client, "textDocument/hover", uri, at(text, "recompute = selective", 2))["contents"]["value"]
    assert "train.recompute" in md and "`selective`" in md and "default: `none`" in md and "activation recomputation" in md
    cluster = (work / "clusters" / "h100.plan")
    ctext = cluster.read_text()
    curi = open_doc(client, cluster)
    md = ask(client, "textDocument/hover", curi, at(ctext, "bandwidth"))["contents"]["value"]
    assert "link.bandwidth" in md and "`Gb/s`" in md and "range: 1 MB/s to 1000 TB/s" in md and "per direction, per GPU" in md


def test_hover_on_a_plan_name_shows_its_explain_summary(client, work):
    path = work / "plans" / "llama3_70b.plan"
    text, uri = path.read_text(), path.as_uri()
    change(client, uri, 21, text)
    md = ask(client, "textDocument/hover", uri, at(text, "plan llama3_70b", 7))["contents"]["value"]
    ex = json.loads(cli("explain", "--json", "plans/llama3_70b.plan", cwd=work))
    gib = [f"{m['total'] / 2**30:.2f} GiB" for m in ex["memory"]]
    assert "memory" in md and ", ".join(gib) in md and "fits" in md
    assert f"step {ex['step_time_s']:.2f} s" in md and f"MFU {ex['mfu']:.1%}" in md and "tokens/s" in md


def test_hover_on_a_cluster_name_shows_its_definition(client, work):
    path = work / "plans" / "llama3_70b.plan"
    text, uri = path.read_text(), path.as_uri()
    md = ask(client, "textDocument/hover", uri, at(text, "h100_8x8"))["contents"]["value"]
    assert "cluster h100_8x8" in md and "64 GPUs" in md and "link ib" in md


# -- completion ---------------------------------------------------------------------------


def labels(result) -> set[str]:
    return {i["label"] for i in (result["items"] if isinstance(result, dict) else result)}


def test_completion_offers_the_keys_of_the_enclosing_block(client, work):
    path = work / "plans" / "llama3_70b.plan"
    text = path.read_text().replace("        data = synthetic\n", "        data = synthetic\n        re\n")
    uri = path.as_uri()
    change(client, uri, 30, text)
    got = ask(client, "textDocument/completion", uri, at(text, "        re\n", 10))
    assert {"loss_scale", "timeout", "init", "compile", "optimizer", "checkpoint", "eval"} <= labels(got)
    # the keys the block sets already (before and after the line typed), and not the nested blocks' keys
    assert not {"recompute", "steps", "micro_batch", "precision", "seed"} & labels(got)
    assert "sequence_parallel" not in labels(got)  # tensor_parallel's
    item = next(i for i in got["items"] if i["label"] == "timeout")
    assert item["textEdit"]["range"]["start"] == at(text, "        re\n", 8)  # replaces what was typed
    mesh = path.read_text().replace("        pp = 4 on ib\n", "        \n")
    change(client, uri, 31, mesh)
    axes = labels(ask(client, "textDocument/completion", uri, at(mesh, "        \n", 8)))
    assert "pp" in axes and not {"dp", "tp"} & axes  # the axes the mesh does not place yet


def test_completion_of_values_links_and_clusters(client, work):
    path = work / "plans" / "llama3_70b.plan"
    base = path.read_text()
    uri = path.as_uri()
    text = base.replace("schedule = interleaved_1f1b", "schedule = ")
    change(client, uri, 31, text)
    assert labels(ask(client, "textDocument/completion", uri, at(text, "schedule = ", 11))) == {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe_v"}
    text = base.replace("pp = 4 on ib", "pp = 4 on ")
    change(client, uri, 32, text)
    assert labels(ask(client, "textDocument/completion", uri, at(text, "pp = 4 on ", 10))) == {"nvlink", "ib", "pcie"}  # the cluster's links
    text = base.replace("cluster = h100_8x8", "cluster = h1")
    change(client, uri, 33, text)
    assert labels(ask(client, "textDocument/completion", uri, at(text, "cluster = h1", 12))) == {"h100_1x8", "h100_2x8", "h100_4x8", "h100_8x8"}
    assert labels(ask(client, "textDocument/completion", uri, at(text, "// Llama-3", 5))) == set()  # in a comment



def test_completion_in_a_document_opened_before_it_ever_parsed(client, work):
    """A document opened already holding the statement being typed (``pp = 4 on  }``) has
    never parsed: completion still offers the cluster's links, the plan's names and the
    imported clusters, read from the rest of the text."""
    base = (work / "plans" / "llama3_70b.plan").read_text()
    text = base.replace("dp = 2 on ib\n        pp = 4 on ib\n        tp = 8 on nvlink\n    }", "dp = 2 on ib; tp = 8 on nvlink; pp = 4 on  }")
    uri = open_doc(client, work / "plans" / "typed.plan", text)
    assert labels(ask(client, "textDocument/completion", uri, at(text, "pp = 4 on  }", 10))) == {"nvlink", "ib", "pcie"}
    text = base.replace("cluster = h100_8x8", "cluster = h1")
    uri = open_doc(client, work / "plans" / "typed_cluster.plan", text)
    assert labels(ask(client, "textDocument/completion", uri, at(text, "cluster = h1", 12))) == {"h100_1x8", "h100_2x8", "h100_4x8", "h100_8x8"}
# -- definition ---------------------------------------------------------------------------


def test_definition_of_an_import_a_cluster_and_a_link(client, work):
    path = work / "plans" / "llama3_70b.plan"
    text, uri = path.read_text(), path.as_uri()
    change(client, uri, 40, text)
    clusters = work / "clusters" / "h100.plan"
    ctext = clusters.read_text()
    got = ask(client, "textDocument/definition", uri, at(text, "h100.plan"))
    assert got["uri"] == clusters.as_uri() and got["range"]["start"] == {"line": 0, "character": 0}
    got = ask(client, "textDocument/definition", uri, at(text, "h100_8x8", 3))
    assert got["uri"] == clusters.as_uri() and got["range"]["start"] == at(ctext, "h100_8x8")
    got = ask(client, "textDocument/definition", uri, at(text, "tp = 8 on nvlink", len("tp = 8 on ")))
    assert got["uri"] == clusters.as_uri() and got["range"]["start"] == at(ctext, "nvlink {", after="cluster h100_8x8")


# -- formatting ---------------------------------------------------------------------------

def test_formatting_replaces_the_text_with_dslc_fmts(client, work):
    """One edit of the whole text to what `dslc fmt -` prints; none for a formatted text;
    none, and a message saying why, for one that does not parse."""
    path = work / "plans" / "messy.plan"
    messy = (work / "plans" / "llama3_70b.plan").read_text().replace("    data_parallel   { zero = 1 }", "  data_parallel{zero=1}")
    path.write_text(messy)
    uri = open_doc(client, path)
    r = client.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 4, "insertSpaces": True}})
    (edit,) = r["result"]
    fmt = subprocess.run([sys.executable, "-m", "dslc", "fmt", "-"], input=messy, cwd=work, capture_output=True, text=True)
    assert edit["range"]["start"] == {"line": 0, "character": 0} and edit["newText"] == fmt.stdout != messy
    change(client, uri, 51, edit["newText"])
    again = client.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 4, "insertSpaces": True}})
    assert again["result"] == []  # already formatted
    change(client, uri, 52, messy.replace("plan llama3_70b {", "plan llama3_70b {{"))
    broken = client.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 4, "insertSpaces": True}})
    assert broken["result"] == [] and client.wait(lambda m: m.get("method") == "window/showMessage")


def test_formatting_a_text_over_4_mib_says_e008_as_lint_does(client, work):
    """dslc fmt's bound in the editor: a text longer than a plan may be is not formatted
    (it was, whole, and alignment could make it many times longer), and says why."""
    uri = open_doc(client, work / "plans" / "huge.plan", "// x\n" * (1 << 20))
    assert [d["code"] for d in client.diagnostics(uri)["diagnostics"]] == ["E008"]
    client.drain(0)
    r = client.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 4, "insertSpaces": True}})
    assert r["result"] == []
    said = client.wait(lambda m: m.get("method") == "window/showMessage")["params"]["message"]
    assert "not formatted" in said and "file is 5.0 MiB; a plan file may be at most 4 MiB" in said
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert client.diagnostics(uri)["diagnostics"] == []


# -- bad input ----------------------------------------------------------------------------


def test_a_document_whose_uri_is_percent_encoded_is_linted(client, work):
    """An editor writes a space in a file's name as %20; pygls keeps documents by the
    decoded URI, and the server found none to lint."""
    text = (work / "plans" / "llama3_70b.plan").read_text().replace("micro_batch = 1", "micro_batch = 0")
    uri = (work / "plans" / "with space.plan").as_uri()
    assert "%20" in uri
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "dslc-plan", "version": 1, "text": text}})
    assert [d["code"] for d in client.diagnostics(uri)["diagnostics"]] == ["E015"]


@pytest.mark.parametrize("junk", [
    "\x00\x01\x02binary\xff",
    "plan x { train { " * 2000,
    "x" * 200_000 + " = 1",
    "plan p {\n model llama { layers = \ud800 }\n mesh { tp = 2 on }\n}}}\n",
    "import \"../../../../../../../../dev/zero\"\nimport \"/\"\n",
], ids=["binary", "deep", "huge line", "surrogate", "odd imports"])
def test_no_input_gets_a_traceback(client, work, junk):
    path = work / "plans" / "junk.plan"
    uri = open_doc(client, path, junk)
    assert client.diagnostics(uri)["diagnostics"]  # a syntax or reading error, reported
    lines = junk.split("\n")
    for line in (0, len(lines) - 1, len(lines) + 5):
        for character in (0, 3, 10**6):
            pos = {"line": line, "character": character}
            for method in ("textDocument/hover", "textDocument/completion", "textDocument/definition"):
                r = client.request(method, {"textDocument": {"uri": uri}, "position": pos})
                assert "error" not in r, (method, pos, r)
    assert not [m for m in client.drain(0) if m.get("method") == "window/logMessage"]  # no internal error
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert client.diagnostics(uri)["diagnostics"] == []


def test_bad_messages_are_answered_and_the_server_goes_on(client, work):
    """Not JSON, parameters of the wrong shape, an unknown method, a document never opened:
    errors or nothing in the protocol, one line each on stderr (the fixture checks that no
    traceback reached it), and the next request is answered."""
    body = b"{not json"
    client.proc.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    client.send({"id": 999, "method": "textDocument/hover", "params": {"textDocument": {"uri": 5}}})
    assert client.request("dslc/unknown", {})["error"]["code"] == -32601
    nowhere = (work / "plans" / "never_opened.plan").as_uri()
    assert ask(client, "textDocument/hover", nowhere, {"line": 0, "character": 0}) is None
    assert ask(client, "textDocument/definition", "untitled:Untitled-1", {"line": 0, "character": 0}) is None
    path = work / "plans" / "llama3_70b.plan"
    assert ask(client, "textDocument/hover", path.as_uri(), at(path.read_text(), "recompute", 1))
    assert not [m for m in client.drain(0) if m.get("method") == "window/logMessage"]  # no internal error


# -- what the server reads, and that it answers (issue 50) -------------------------------


@pytest.fixture
def lone(work):
    """A server of its own, for input that may stop one (the module's goes on meanwhile):
    it must still answer at the end, and its standard error hold no traceback."""
    c, _ = started(work)
    yield c
    try:
        assert c.request("shutdown", None).get("error") is None
        c.notify("exit", None)
        assert c.proc.wait(10) == 0
    finally:
        c.proc.kill()
        c.proc.wait()
    stderr = c.proc.stderr.read().decode()
    assert "Traceback" not in stderr, stderr


def logged(client: Client, seconds: float = 0.5) -> list[str]:
    return [m["params"]["message"] for m in client.drain(seconds) if m.get("method") == "window/logMessage"]


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "300 MB", "binary"])
def test_a_document_not_opened_is_read_as_lint_reads_a_plan(lone, work, tmp_path, kind):
    """A request about a file the editor has not opened reads it through dslc's bounded
    reader, not pygls's (which reads any path whole): a FIFO is not opened (it blocked the
    server for good), /dev/zero is not read (it read until MemoryError), a 300 MB file is
    E008, unread; each is answered with nothing and one line saying why."""
    path = tmp_path / "x.plan"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "300 MB":
        with open(path, "wb") as f:
            f.truncate(300 << 20)  # sparse
    elif kind == "binary":
        path.write_bytes(b"plan p { \0 }")
    uri = "file:///dev/zero" if kind == "/dev/zero" else path.as_uri()
    for method in ("textDocument/hover", "textDocument/definition", "textDocument/completion"):
        assert ask(lone, method, uri, {"line": 0, "character": 0}) in (None, [], {"isIncomplete": False, "items": []})
    r = lone.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 4, "insertSpaces": True}})
    assert r.get("result") is None and "error" not in r, r
    said = logged(lone)
    why = {"fifo": "it is a FIFO, not a regular file", "/dev/zero": "it is a character device, not a regular file",
           "300 MB": "E008: file is 300.0 MiB; a plan file may be at most 4 MiB", "binary": "E004"}[kind]
    assert len(said) == 4 and all(why in m and "is not read" in m for m in said), said


def test_a_file_not_opened_is_still_answered_from_disk(lone, work):
    path = work / "plans" / "llama3_70b.plan"
    where = at(path.read_text(), "recompute = selective", 2)
    md = ask(lone, "textDocument/hover", path.as_uri(), where)["contents"]["value"]
    assert "train.recompute" in md and not logged(lone, 0)
    # only a file: URI names a file (pygls read the path of any scheme's)
    assert ask(lone, "textDocument/hover", f"untitled:{path}", where) is None and not logged(lone, 0)


@pytest.mark.parametrize("params", [
    None,
    5,
    {"textDocument": {"uri": "file:///x.plan"}},
    {"textDocument": {"uri": "file:///x.plan"}, "position": {"line": -1, "character": 0}},
    {"textDocument": {"uri": "file:///x.plan"}, "position": {"line": 0, "character": -3}},
    {"textDocument": {"uri": "file:///x.plan"}, "position": {"line": 2**31, "character": 0}},
], ids=["null", "a number", "no position", "line -1", "character -3", "line 2^31"])
def test_a_request_whose_parameters_cannot_be_read_is_answered(lone, params):
    """Not silence: InvalidParams (-32602), naming the method, for every request kind."""
    for method in ("textDocument/hover", "textDocument/definition", "textDocument/completion", "textDocument/formatting"):
        lone.ids += 1
        lone.send({"id": lone.ids, "method": method, "params": params})
        r = lone.wait(lambda m, i=lone.ids: m.get("id") == i)
        assert r["error"]["code"] == -32602 and method in r["error"]["message"], r
    assert lone.request("textDocument/hover", {"textDocument": {"uri": "file:///x.plan"}, "position": {"line": 0, "character": 0}})["result"] is None


@pytest.mark.parametrize("length", [b"1000000000000", b"9" * 2000, b"%d" % (64 << 20)])
def test_a_message_longer_than_the_bound_is_dropped_and_the_server_goes_on(lone, work, length):
    """``Content-Length: 1000000000000`` ended the server (MemoryError, exit 3): now the
    message is dropped unread, one line says so, and the next message is answered."""
    lone.proc.stdin.write(b"Content-Length: " + length + b"\r\n\r\n{}")
    lone.proc.stdin.flush()
    path = work / "plans" / "llama3_70b.plan"
    assert ask(lone, "textDocument/hover", path.as_uri(), at(path.read_text(), "recompute", 1))
    assert lone.proc.poll() is None
