"""``dslc lsp``: the language server of plan files, over stdio (pygls).

It runs the stages ``dslc lint`` runs on the text being edited and answers the editor's
questions from what they found:

- :mod:`.server` wires the protocol: documents opened, changed (linted once the typing
  pauses), saved and closed; hover, completion, go to definition and formatting;
- :mod:`.wire` bounds what arrives before pygls reads it, and answers a request it cannot read;
- :mod:`.analysis` lints a document's text as ``dslc lint`` lints its file and turns the
  diagnostics into the protocol's, and indexes the definitions of the file and its imports;
- :mod:`.positions` converts between dslc's spans and the protocol's positions;
- :mod:`.cursor` reads what surrounds the cursor from the text, even text that does not parse;
- :mod:`.keydocs` reads the tables of docs/language.md, the one description of every key;
- :mod:`.hover` and :mod:`.complete` answer from those.
"""
