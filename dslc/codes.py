"""The catalogue of diagnostic codes: one line each, used by the SARIF rules
and by docs/language.md. E = error, W = warning, N = note."""

CODES: dict[str, str] = {
    # -- reading and syntax -------------------------------------------------
    "E001": "syntax error",
    "E002": "unexpected character",
    "E003": "unexpected end of file",
    "E004": "not a UTF-8 text file",
    "E005": "import not found",
    "E006": "import cycle",
    "E007": "imported file is not a plan file",
    "E008": "file too large",
    "E009": "imports nested too deep",
    # -- keys, types, units -------------------------------------------------
    "E010": "unknown key",
    "E011": "duplicate key",
    "E012": "missing required key",
    "E013": "wrong type",
    "E014": "wrong or unknown unit",
    "E015": "value out of range",
    "E016": "unknown block",
    "E017": "duplicate definition",
    "E018": "unknown name",
    "E019": "invalid choice",
    "E020": "invalid identifier",
    "N021": "value taken from the catalog",
    "W022": "unused definition",
    "W023": "empty file",
    # -- mesh and placement -------------------------------------------------
    "E030": "mesh size does not match the cluster",
    "E031": "axis placed on an unknown link",
    "E032": "duplicate mesh axis",
    "E033": "unknown mesh axis",
    "E034": "axis groups cross nodes on a node-scope link",
    "W035": "tensor parallel over a cluster-scope link",
    "E036": "mesh axis without a link",
    "E037": "more ranks than dslc plans for",
    # -- model shapes -------------------------------------------------------
    "E040": "hidden not divisible by heads",
    "E041": "heads not divisible by tp",
    "E042": "kv_heads incompatible with heads or tp",
    "E043": "ffn not divisible by tp",
    "W044": "vocab padded to a multiple of tp",
    "E045": "heads not divisible by cp (Ulysses)",
    # -- pipeline -----------------------------------------------------------
    "E050": "layers do not split over the pipeline",
    "E051": "per-stage layers do not sum to the model's layers",
    "E052": "empty pipeline stage",
    "E053": "too few micro-batches for 1F1B",
    "E054": "micro-batches not a multiple of pp for interleaved 1F1B",
    "W055": "large pipeline bubble",
    "E056": "virtual stages need the interleaved schedule",
    "W057": "pipeline options without a pp axis",
    "E058": "pipeline schedule longer than dslc plans for",
    # -- sequence / context parallel -----------------------------------------
    "E060": "sequence parallel without tensor parallel",
    "E061": "seq_len not divisible by tp under sequence parallel",
    "E062": "seq_len not divisible by the context-parallel chunks",
    "W063": "context_parallel options without a cp axis",
    # -- experts ------------------------------------------------------------
    "E070": "experts not divisible by ep",
    "E071": "top_k larger than the number of experts",
    "E072": "expert options on a dense model",
    "E073": "ep axis on a dense model",
    # -- training -----------------------------------------------------------
    "E080": "global batch does not match micro-batches × data-parallel ranks",
    "E081": "zero stage outside 0–3",
    "W082": "fp16 without loss scaling",
    "W083": "data file not found",
    "E084": "token ids that the vocab does not hold",
    "E085": "data file the script cannot read",
    "N086": "data file too large to check at lint time",
    # -- estimates ----------------------------------------------------------
    "E090": "does not fit in device memory",
    # -- code generation ----------------------------------------------------
    "E100": "not supported by code generation",
}
