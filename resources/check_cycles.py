#!/usr/bin/env python3
"""File-level import cycles in Rust crates: `make check-cycles` (run by `make test`).

A file depends on another when it names an item that the other file defines: through a `use`
declaration or a path in its code (`super::X`, `crate::a::b::f(..)`, `child::f(..)` after
`mod child;`, `m::f(..)` after `use ...::m`). The check builds that graph over the files of
each crate given and fails on every cycle in it (two or more files that reach one another):
a module's file and its children (`foo/mod.rs` uses `foo::bar`, whose file imports an item
defined in `foo/mod.rs`), siblings (a.rs uses b.rs, b.rs uses a.rs), and longer rounds.
Cycles wholly inside a directory listed in the allow-list file are reported but pass.

Then check_layers.py checks each crate module to module, from the same parse: no cycle between
its top-level modules, and in a crate whose root has a `layers:` line, no import up that order
(see there). The allow-list does not apply to it.

What it sees:
- the module tree, from the crate root (lib.rs, main.rs) through `mod x;` and `mod x { .. }`,
  with `#[path = "..."]`; a `mod x;` whose file is missing is an error (exit status 2);
- `use` trees (`{..}`, `self`, `as`, `*`, any `pub(..)`), at any depth, and paths of two or
  more segments in code and attributes (`#[error("..", http::MAX)]`) that start with `crate`,
  `super`, `self`, a module, or an imported name;
- a `pub use` (a re-export) is not a dependency of the file that writes it, unless that
  file's own code names what it re-exports;
- where a name is defined: items declared at a module's own level (fn, struct, enum, union,
  trait, type, const, static, macro_rules) are that module's file's; a name the module only
  imports (`use`, `pub use`, globs) is followed to the file that defines it, so a re-export
  is not a dependency on the file that re-exports;
- a glob import (`use super::*`) as a dependency on the globbed module's file, if that file
  defines items;
- test modules too (`#[cfg(test)]` code is code of its file).

What it does not see (it is not a Rust parser; nothing here expands macros or resolves types):
- names brought in other than by a path: method calls, trait methods, `impl` blocks of a type
  defined elsewhere, field accesses, single-segment names used without a `use`;
- items made by macros, macro invocations (`crate::m!`), `$crate` paths, `extern crate`,
  `include!`, cfg'd-out code (all of it counts); paths to other crates are ignored;
- a name it cannot find where a path says it is counts as that module's file's (the safe
  side: it may report a cycle that is not one, never hide one that it sees).

Usage: check_cycles.py [--allow FILE] [--root DIR] SRC_DIR...
Exit status: 0 no cycle (or only allowed ones), 1 a cycle, 2 bad input.
"""

import argparse
import os
import re
import sys

import check_layers

ITEM_KEYWORDS = {"fn", "struct", "enum", "union", "trait", "type", "const", "static"}
IDENT = re.compile(r"(?:r#)?[A-Za-z_][A-Za-z0-9_]*")


class InputError(Exception):
    """The tree cannot be read as the check needs (a declared module's file is missing)."""


def tokenize(text):
    """(kind, value, line) tokens: 'id', 'str', 'num', 'lifetime', '::', or punctuation.

    Comments are dropped; string and char literals become one 'str' token (value kept for
    `#[path = ".."]`)."""
    tokens = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    line += text[i] == "\n"
                    i += 1
        elif re.match(r'(?:b|c)?r#*"', text[i:i + 300]):
            m = re.match(r'(?:b|c)?r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j
            tokens.append(("str", text[i + m.end():j], line))
            line += text.count("\n", i, j)
            i = j + len(end)
        elif c == '"' or (c in "bc" and text.startswith('"', i + 1)):
            j = i + (1 if c == '"' else 2)
            start = j
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            tokens.append(("str", text[start:j], line))
            line += text.count("\n", i, j)
            i = j + 1
        elif c == "'" or (c == "b" and text.startswith("'", i + 1)):
            j = i + (1 if c == "'" else 2)
            if text.startswith("\\", j):
                k = j + 2
                while k < n and text[k] != "'":
                    k += 1
                tokens.append(("str", "", line))
                i = k + 1
            elif j + 1 < n and text[j + 1] == "'":
                tokens.append(("str", text[j], line))
                i = j + 2
            else:  # a lifetime or a label
                m = IDENT.match(text, j)
                tokens.append(("lifetime", m.group(0) if m else "", line))
                i = m.end() if m else j
        elif c.isdigit():
            m = re.compile(r"[0-9][0-9A-Za-z_]*").match(text, i)
            tokens.append(("num", m.group(0), line))
            i = m.end()
        elif c.isalpha() or c == "_":
            m = IDENT.match(text, i)
            word = m.group(0)
            tokens.append(("id", word[2:] if word.startswith("r#") else word, line))
            i = m.end()
        elif text.startswith("::", i):
            tokens.append(("::", "::", line))
            i += 2
        else:
            tokens.append((c, c, line))
            i += 1
    return tokens


class Module:
    """One module: a file's top level or an inline `mod x { .. }` in it."""

    def __init__(self, name, parent, file, directory):
        self.name = name
        self.parent = parent
        self.file = file
        # Where `mod x;` declared here looks for x's file.
        self.directory = directory
        self.children = {}
        self.items = set()
        self.imports = {}  # name -> (module it was declared in, path segments)
        self.globs = []  # path segments
        self.refs = []  # (line, path segments, glob) named here
        self.reexports = set()  # names imported by a `pub use`
        self.reexport_refs = []  # (line, path segments, glob) of each `pub use`
        self.names = []  # (line, identifier) outside paths and `use`
        # Test code: declared `#[cfg(test)] mod`, or inside such a module.
        self.test = parent is not None and parent.test

    def path(self):
        names = []
        m = self
        while m.parent is not None:
            names.append(m.name)
            m = m.parent
        return "::".join(["crate"] + names[::-1])

    def root(self):
        m = self
        while m.parent is not None:
            m = m.parent
        return m


def is_pub(tokens, i):
    """Whether the `use` at tokens[i] is a re-export (`pub`, `pub(crate)`, `pub(in ..)`)."""
    j = i - 1
    if j >= 0 and tokens[j][0] == ")":
        while j >= 0 and tokens[j][0] != "(":
            j -= 1
        j -= 1
    return j >= 0 and tokens[j][1] == "pub"


def is_cfg_test_mod(tokens, i):
    """Whether tokens[i] starts `#[cfg(test)]` on a module (other attributes and `pub` may
    follow it before `mod`)."""
    if [t[1] for t in tokens[i:i + 7]] != ["#", "[", "cfg", "(", "test", ")", "]"]:
        return False
    j = i + 7
    while j < len(tokens) and tokens[j][0] == "#":  # further attributes
        depth, j = 0, j + 1
        while j < len(tokens):
            depth += {"[": 1, "]": -1}.get(tokens[j][0], 0)
            j += 1
            if depth == 0:
                break
    if j < len(tokens) and tokens[j][1] == "pub":
        j += 1
        if j < len(tokens) and tokens[j][0] == "(":
            while j < len(tokens) and tokens[j][0] != ")":
                j += 1
            j += 1
    return j < len(tokens) and tokens[j][1] == "mod"


def parse_use_tree(tokens, i, prefix, out):
    """Parses a use tree at tokens[i]; appends (segments, alias, glob) to out; returns the
    index after it."""
    segs = list(prefix)
    while i < len(tokens):
        kind, value, _ = tokens[i]
        if kind == "{":
            i += 1
            while i < len(tokens) and tokens[i][0] != "}":
                i = parse_use_tree(tokens, i, segs, out)
                if i < len(tokens) and tokens[i][0] == ",":
                    i += 1
            return i + 1
        if kind == "*":
            out.append((segs, None, True))
            return i + 1
        if kind == "id":
            if value == "self" and segs and segs[-1] not in ("super", "self", "crate"):
                alias = segs[-1]
            else:
                segs.append(value)
                alias = value
            i += 1
            if i < len(tokens) and tokens[i][0] == "::":
                i += 1
                continue
            if i + 1 < len(tokens) and tokens[i][1] == "as":
                alias = tokens[i + 1][1]
                i += 2
            out.append((segs, alias, False))
            return i
        if kind == "::":  # a leading `::`
            i += 1
            continue
        return i
    return i


class Crate:
    """The module tree of one crate and the names it defines and imports."""

    def __init__(self, root_file):
        self.files = {}  # file -> its top-level Module
        directory = os.path.dirname(root_file)
        self.root = self.load(root_file, None, None, directory)

    def load(self, file, name, parent, directory, test=False):
        with open(file, encoding="utf-8") as f:
            tokens = tokenize(f.read())
        module = Module(name, parent, file, directory)
        module.test = module.test or test
        if parent is not None:
            parent.children[name] = module
        self.files[file] = module
        self.scan(tokens, module)
        return module

    def child_file(self, module, name, path_attr):
        """The file of `mod name;` declared in module (or None if the file is missing)."""
        if path_attr is not None:
            top_level = self.files.get(module.file) is module
            base = os.path.dirname(module.file) if top_level else module.directory
            return os.path.normpath(os.path.join(base, path_attr)), None
        for cand in (os.path.join(module.directory, name + ".rs"),
                     os.path.join(module.directory, name, "mod.rs")):
            if os.path.isfile(cand):
                sub = os.path.join(module.directory, name)
                return cand, sub
        raise InputError(f"{module.file}: `mod {name};` has no file {name}.rs or {name}/mod.rs "
                         f"in {module.directory}")

    def scan(self, tokens, top):
        stack = [(top, 0)]  # (module, brace depth its body is at)
        depth = 0
        path_attr = None
        test_mod = False
        i = 0
        while i < len(tokens):
            kind, value, line = tokens[i]
            module, base = stack[-1]
            at_module_level = depth == base
            if kind == "{":
                depth += 1
            elif kind == "}":
                depth -= 1
                if len(stack) > 1 and depth < base:
                    stack.pop()
            elif kind == "#" and i + 5 < len(tokens) and tokens[i + 1][0] == "[" \
                    and tokens[i + 2][1] == "path" and tokens[i + 3][0] == "=" \
                    and tokens[i + 4][0] == "str":
                path_attr = tokens[i + 4][1]  # #[path = "x.rs"]; other attributes: as code
            elif kind == "#" and is_cfg_test_mod(tokens, i):
                test_mod = True
            elif kind == "id" and value == "mod" and i + 2 < len(tokens) and tokens[i + 1][0] == "id":
                name = tokens[i + 1][1]
                if tokens[i + 2][0] == ";":
                    file, sub = self.child_file(module, name, path_attr)
                    if not os.path.isfile(file):
                        raise InputError(f"{module.file}:{line}: `mod {name};` has no file {file}")
                    self.load(file, name, module, sub or os.path.join(os.path.dirname(file), name),
                              test_mod)
                    path_attr, test_mod = None, False
                    i += 3
                    continue
                if tokens[i + 2][0] == "{":
                    child = Module(name, module, module.file, os.path.join(module.directory, name))
                    child.test = child.test or test_mod
                    module.children[name] = child
                    depth += 1
                    stack.append((child, depth))
                    path_attr, test_mod = None, False
                    i += 3
                    continue
            elif kind == "id" and value == "use" and (i == 0 or tokens[i - 1][0] != "::"):
                out = []
                j = parse_use_tree(tokens, i + 1, [], out)
                reexport = is_pub(tokens, i)
                for segs, alias, glob in out:
                    if glob:
                        module.globs.append(segs)
                    elif alias and alias != "_":
                        module.imports.setdefault(alias, (module, segs))
                        if reexport:
                            module.reexports.add(alias)
                    if not reexport:
                        module.refs.append((line, segs, glob))
                    else:
                        module.reexport_refs.append((line, segs, glob))
                while j < len(tokens) and tokens[j][0] != ";":
                    j += 1
                i = j + 1
                continue
            elif kind == "id" and at_module_level and value in ITEM_KEYWORDS:
                if i + 1 < len(tokens) and tokens[i + 1][0] == "id":
                    module.items.add(tokens[i + 1][1])
            elif kind == "id" and value == "macro_rules" and i + 2 < len(tokens) \
                    and tokens[i + 1][0] == "!":
                module.items.add(tokens[i + 2][1])
            elif kind == "id" and i + 1 < len(tokens) and tokens[i + 1][0] == "::" \
                    and (i == 0 or tokens[i - 1][0] != "::"):
                segs, j = [value], i + 1
                while j + 1 < len(tokens) and tokens[j][0] == "::" and tokens[j + 1][0] == "id":
                    segs.append(tokens[j + 1][1])
                    j += 2
                if j < len(tokens) and tokens[j][0] == "!":
                    segs = segs[:-1]  # a macro: only its module path counts
                if len(segs) > 1:
                    module.refs.append((line, segs, False))
                i = j
                continue
            elif kind == "id" and (i == 0 or tokens[i - 1][0] != "::"):
                module.names.append((line, value))
            i += 1

    def lookup(self, module, name, seen):
        """Where `name`, as seen from inside `module`, lives: ('module', Module),
        ('file', path), or None when it is not this crate's."""
        key = (id(module), name)
        if key in seen:
            return None
        seen = seen | {key}
        if name in module.children:
            return ("module", module.children[name])
        if name in module.items:
            return ("file", module.file)
        if name in module.imports:
            origin, segs = module.imports[name]
            return self.resolve(origin, segs, seen)
        for glob in module.globs:
            target = self.resolve(module, glob, seen)
            if target and target[0] == "module":
                found = self.lookup(target[1], name, seen)
                if found:
                    return found
        return None

    def resolve(self, module, segs, seen=frozenset()):
        """What the path `segs`, written in `module`, names (see lookup)."""
        if not segs:
            return None
        first, rest = segs[0], list(segs[1:])
        if first == "crate":
            current = module.root()
        elif first == "self":
            current = module
        elif first == "super":
            current = module.parent or module
            while rest and rest[0] == "super":
                current = current.parent or current
                rest.pop(0)
        else:
            found = self.lookup(module, first, seen)
            if found is None:
                return None
            if found[0] == "file":
                return found
            current = found[1]
        for k, name in enumerate(rest):
            found = self.lookup(current, name, seen)
            if found is None:
                # Not found where the path says: count it as that module's file's.
                return ("file", current.file)
            if found[0] == "file":
                return found
            current = found[1]
        return ("module", current)

    def edges(self):
        """{file: {file it depends on: [(line, path written), ...]}}."""
        graph = {f: {} for f in self.files}
        for module in self.modules():
            # A re-export is a dependency only where the file's own code uses the name.
            used = [(line, [name], False) for line, name in module.names
                    if name in module.reexports]
            for line, segs, glob in module.refs + used:
                target = self.resolve(module, segs)
                if target is None:
                    continue
                if target[0] == "module":
                    if not glob:
                        continue  # a module named, not an item of its file
                    globbed = target[1]
                    if not self.files_defines(globbed):
                        continue
                    dest = globbed.file
                else:
                    dest = target[1]
                if dest != module.file and dest in graph:
                    text = "::".join(segs) + ("::*" if glob else "")
                    graph[module.file].setdefault(dest, []).append((line, text))
        return graph

    def files_defines(self, module):
        return bool(module.items)

    def modules(self):
        todo = [self.root]
        while todo:
            m = todo.pop()
            yield m
            todo.extend(m.children.values())


def strongly_connected(graph):
    """Tarjan's algorithm (iterative): the components with more than one file."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def read_allow(path):
    if path is None or not os.path.exists(path):
        return []
    dirs = []
    with open(path, encoding="utf-8") as f:
        for raw in f:
            entry = raw.split("#", 1)[0].strip()
            if entry:
                dirs.append(os.path.normpath(entry))
    return dirs


def allowed(component, allow, root):
    """Whether every file of the cycle is in one allowed module: under the directory `d`, or
    its file `d.rs`."""
    rel = [os.path.relpath(f, root) for f in component]
    return any(all(r.startswith(d + os.sep) or r == d + ".rs" for r in rel) for d in allow)


def crate_roots(src):
    roots = [os.path.join(src, f) for f in ("lib.rs", "main.rs")
             if os.path.isfile(os.path.join(src, f))]
    if not roots:
        raise InputError(f"{src}: no lib.rs or main.rs")
    return roots


def check(srcs, allow, root, out=sys.stdout):
    """Prints every cycle (file- and module-level) and upward import; returns the number of
    them not allowed."""
    for d in allow:
        path = os.path.join(root, d)
        if not os.path.isdir(path) and not os.path.isfile(path + ".rs"):
            raise InputError(f"allow-list entry {d}: no such module directory or file")
    used = set()
    bad = 0
    for src in srcs:
        for crate_root in crate_roots(src):
            crate = Crate(crate_root)
            bad += check_files(crate, allow, root, used, out)
            try:
                bad += check_layers.check_modules(crate, crate_root, root, out,
                                                  strongly_connected)
            except check_layers.LayerError as e:
                raise InputError(str(e)) from e
    for d in allow:
        if d not in used:
            print(f"allow-list entry {d} has no cycle left: delete it", file=out)
    return bad


def rel_to(root):
    return lambda f: os.path.relpath(f, root)


def check_files(crate, allow, root, used, out):
    """The file-level cycles of a crate (see the module doc); returns those not allowed."""
    graph = crate.edges()
    rel = rel_to(root)
    bad = 0
    for comp in strongly_connected(graph):
        ok = allowed(comp, allow, root)
        used.update(d for d in allow if allowed(comp, [d], root))
        bad += not ok
        label = "allowed cycle" if ok else "cycle"
        print(f"{label}: {', '.join(rel(f) for f in comp)}", file=out)
        if ok:
            continue
        for a in comp:
            for b in sorted(graph[a]):
                if b in comp:
                    line, text = graph[a][b][0]
                    more = len(graph[a][b]) - 1
                    tail = f" (+{more} more)" if more else ""
                    print(f"  {rel(a)}:{line} uses {rel(b)}: {text}{tail}", file=out)
    return bad


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--allow", help="allow-list: module directories (one a line, # comments) "
                   "whose inner cycles pass")
    p.add_argument("--root", default=".", help="paths are printed and allowed relative to it")
    p.add_argument("srcs", nargs="+", help="a crate's source directory (holding lib.rs/main.rs)")
    args = p.parse_args(argv)
    try:
        bad = check(args.srcs, read_allow(args.allow), args.root)
    except (InputError, OSError) as e:
        print(f"check_cycles: {e}", file=sys.stderr)
        return 2
    if bad:
        print(f"check_cycles: {bad} import cycle(s) or upward import(s): move what both sides "
              "need to a file of its own, or an item to the lowest layer that uses it (see "
              "resources/check_cycles.py, resources/check_layers.py)", file=sys.stderr)
        return 1
    print(f"check_cycles: no file- or module-level import cycle, no upward import in "
          f"{' '.join(args.srcs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
