"""``dslc diff --git REV``: the plan files a change touches since a revision, and their
files as of that revision.

git runs with an argument list, never a shell, and REV is first resolved to a commit
(``rev-parse --verify --end-of-options``; a REV that begins with ``-`` is refused), so
neither REV nor a path can become an option of git. A commit's files are read as the
working tree's are (:class:`dslc.front.load.Files`): at most ``MAX_BYTES`` each, only
blobs (a folder or a submodule is not a file), an import outside the repository from
this machine, as the working tree's plans read it; a symbolic link of the commit is
followed only inside the repository (one out of it is an error, its target never read).

A plan file is touched when it, or any file it imports at any depth, changed between
REV and the working tree (a change to ``clusters/h100.plan`` touches every plan that
imports it). Untracked files that git does not ignore count as added.
"""

from __future__ import annotations

import errno
import os
import subprocess
from dataclasses import dataclass

from ..diagnostics import printable
from ..front import ast
from ..front.load import Files, Loader, Read
from ..front.parse import MAX_BYTES
from ..reading import NotAFile, inside, within
from ..source import Sources
from .inputs import UsageError

TIMEOUT = 120  # seconds any one git command may take
LINKS = 8  # symbolic links followed in a row inside a commit


def git(top: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``git -C top ARGS`` (pathspecs literal), its output as bytes; a failure is a one-line
    usage error unless ``check`` is false."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
    try:
        done = subprocess.run(["git", "-C", top, "--literal-pathspecs", "--no-pager", *args], stdin=subprocess.DEVNULL,
                              capture_output=True, env=env, timeout=TIMEOUT, check=False)
    except FileNotFoundError:
        raise UsageError("--git needs git, and there is no git on this machine's PATH") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"git {args[0]} took longer than {TIMEOUT} s") from None
    if check and done.returncode:
        raise UsageError(f"git {args[0]} failed: {_first_line(done.stderr)}")
    return done


def _first_line(err: bytes) -> str:
    lines = [x for x in os.fsdecode(err).splitlines() if x.strip()]
    return printable(lines[0].removeprefix("fatal: ").strip()[:200]) if lines else "no message"


def toplevel(cwd: str) -> str:
    """The root of the working tree around ``cwd``; a usage error outside one."""
    done = git(cwd, "rev-parse", "--show-toplevel", check=False)
    if done.returncode:
        raise UsageError(f"--git: {printable(cwd)} is not in a git working tree ({_first_line(done.stderr)})")
    return os.fsdecode(done.stdout).rstrip("\n")


def commit(top: str, rev: str) -> str:
    """The commit REV names, by its full id."""
    if not rev or rev.startswith("-") or any(c in rev for c in "\0\n\r"):
        raise UsageError(f"--git {printable(rev)!r}: not a revision")
    done = git(top, "rev-parse", "--verify", "--quiet", "--end-of-options", rev + "^{commit}", check=False)
    if done.returncode:
        shallow = git(top, "rev-parse", "--is-shallow-repository", check=False).stdout.strip() == b"true"
        hint = "; this clone is shallow: fetch its history (actions/checkout: fetch-depth: 0)" if shallow else ""
        raise UsageError(f"--git {printable(rev)}: no such commit in this repository{hint}")
    return os.fsdecode(done.stdout).strip()


def _names(out: bytes) -> list[str]:
    return [os.fsdecode(x) for x in out.split(b"\0") if x]


def changes(top: str, sha: str) -> list[tuple[str | None, str | None]]:
    """(path at the commit, path now) of each file that changed, repository-relative; None
    on the side where it is not (added, deleted). A rename pairs its two paths."""
    fields = _names(git(top, "diff", "--name-status", "-z", "-M", "--no-ext-diff", "--no-textconv", sha, "--").stdout)
    out: list[tuple[str | None, str | None]] = []
    i = 0
    while i < len(fields):
        status = fields[i][:1]
        if status in "RC":
            old, new = fields[i + 1], fields[i + 2]
            out.append((old if status == "R" else None, new))
            i += 3
            continue
        path = fields[i + 1]
        out.append((None if status == "A" else path, None if status == "D" else path))
        i += 2
    out += [(None, p) for p in untracked(top)]
    return out


def untracked(top: str) -> list[str]:
    return _names(git(top, "ls-files", "-z", "--others", "--exclude-standard", "--full-name").stdout)


@dataclass(frozen=True)
class Touched:
    base: str | None  # the file as of the commit (a path as the working tree names it), None: added
    new: str | None  # the file now, None: deleted


class Repo:
    """A working tree, seen from ``cwd``: paths are named relative to ``cwd``, as the
    working tree's plans are."""

    def __init__(self, cwd: str | None = None):
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.top = toplevel(self.cwd)

    def rel(self, path: str) -> str | None:
        """``path`` relative to the repository's root, or None when it is outside it."""
        full = os.path.normpath(os.path.join(self.cwd, path))
        return os.path.relpath(full, self.top) if within(full, self.top) else None

    def shown(self, rel: str) -> str:
        return os.path.relpath(os.path.join(self.top, rel), self.cwd)

    def touched(self, sha: str, under: list[str]) -> list[Touched]:
        """The plan files under the paths ``under`` (the whole repository when empty) that a
        change since ``sha`` touches, the working tree's order."""
        scope = [self.rel(p) for p in under] or ["."]
        if None in scope:
            raise UsageError(f"--git: {printable(under[scope.index(None)])} is outside the repository {printable(self.top)}")
        changed = changes(self.top, sha)
        paths = {p for pair in changed for p in pair if p}
        added = {new for old, new in changed if old is None}
        was = {new: old for old, new in changed if old and new}

        def in_scope(rel: str) -> bool:
            return rel.endswith(".plan") and any(within(rel, s) for s in scope)

        tracked = _names(git(self.top, "ls-files", "-z", "--full-name").stdout) + untracked(self.top)
        loader = Loader(Sources(), [])
        out = []
        for rel in dict.fromkeys(tracked):
            if not in_scope(rel) or not os.path.isfile(os.path.join(self.top, rel)):
                continue
            if not inside(os.path.join(self.top, rel), self.top):  # as the commit's side: a pull request's link
                raise UsageError(f"cannot read {printable(self.shown(rel))}: a symbolic link out of the repository, not followed")
            if self._closure(loader, self.shown(rel)) & paths:
                base = None if rel in added else self.shown(was.get(rel, rel))
                out.append(Touched(base, self.shown(rel)))
        out += [Touched(self.shown(old), None) for old, new in changed if new is None and old and in_scope(old)]
        return out

    def _closure(self, loader: Loader, path: str) -> set[str]:
        """The repository-relative paths of ``path`` and of every file it imports, at any
        depth (those it imports but that are not there too)."""
        try:
            loader.read(path)
        except OSError:
            return {self.rel(path)}
        out = set()
        for f in loader.unit(path).files:
            out.add(self.rel(f))
            tree = loader.asts.get(f)
            for item in tree.items if tree else ():
                if isinstance(item, ast.Import) and "\0" not in item.path:
                    out.add(self.rel(os.path.normpath(os.path.join(os.path.dirname(f), item.path))))
        return out - {None}

    def at(self, sha: str) -> Tree:
        return Tree(self, sha)


class Tree(Files):
    """The files of commit ``sha`` for :class:`dslc.front.load.Loader`: a path inside the
    repository reads the commit's blob (``git cat-file``, after ``ls-tree`` says it is one
    and its size), a path outside it this machine's file."""

    def __init__(self, repo: Repo, sha: str):
        self.repo, self.sha = repo, sha
        self._entries: dict[str, tuple[str, str, str, int] | None] = {}

    def _entry(self, rel: str) -> tuple[str, str, str, int] | None:
        """(mode, type, object id, size) of ``rel`` in the commit, None when it is not there."""
        if rel not in self._entries:
            out = git(self.repo.top, "ls-tree", "-z", "-l", "--full-tree", self.sha, "--", rel).stdout
            found = None
            for line in out.split(b"\0"):
                meta, _, name = line.partition(b"\t")
                if os.fsdecode(name) == rel:
                    mode, kind, oid, size = meta.decode().split()
                    found = (mode, kind, oid, int(size) if size.isdigit() else 0)
            self._entries[rel] = found
        return self._entries[rel]

    def _resolve(self, path: str) -> tuple[str | None, str, tuple | None]:
        """(repository path, path on this machine, entry) after the commit's symbolic links;
        repository path None: a path outside it, read from this machine. A link of the
        commit is followed only inside the repository: its target is the commit's text,
        and one out of it would let the commit choose a file of this machine to read."""
        rel = self.repo.rel(path)
        for hops in range(LINKS):
            if rel is None and hops:
                raise OSError(errno.EPERM, "a symbolic link out of the repository, not followed", path)
            if rel is None:
                return None, path, None
            entry = self._entry(rel)
            if entry is None:
                raise FileNotFoundError(errno.ENOENT, f"not in commit {self.sha[:12]}", path)
            if entry[0] != "120000":
                return rel, path, entry
            if entry[3] > 4096:
                raise OSError(errno.ENAMETOOLONG, "a symbolic link with a target too long", path)
            target = os.fsdecode(self._blob(entry[2], 4096))
            path = os.path.normpath(os.path.join(os.path.dirname(os.path.join(self.repo.top, rel)), target))
            rel = self.repo.rel(path)
        raise OSError(errno.ELOOP, "too many levels of symbolic links", path)

    def _blob(self, oid: str, limit: int) -> bytes:
        return git(self.repo.top, "cat-file", "blob", oid).stdout[: limit + 1]

    def identity(self, path: str) -> object:
        rel, disk, _ = self._resolve(path)
        return super().identity(disk) if rel is None else ("git", self.sha, rel)

    def read(self, path: str) -> Read:
        rel, disk, entry = self._resolve(path)
        if rel is None:
            got = super().read(disk)
            return Read(got.data, got.size, got.key, got.linked or disk != path)
        mode, kind, oid, size = entry
        if kind == "tree":
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if kind != "blob":
            e = NotAFile(errno.EINVAL, "not a regular file (a submodule)", path)
            e.kind = "a submodule"
            raise e
        data = self._blob(oid, MAX_BYTES) if size <= MAX_BYTES else b""
        return Read(data, size, ("git", self.sha, rel), self.repo.rel(path) != rel)
