"""Module-level imports of a crate: its top-level modules' graph, the cycles in it, and the
edges that point up the crate's layer order (the second half of `make check-cycles`).

The file-level check (check_cycles.py) follows a name to the file that defines it, so a module
that imports another module's item through a third module's `pub use` shows no edge there.
This check sees what the code writes instead: an edge A -> B for every path written in a file
of top-level module A that names top-level module B (`use crate::b::..`, `crate::b::f(..)` in
code or attributes, `super::..` climbing out of A into B, a `pub use crate::b::X` in A: a
re-export is an import of the module that re-exports it). What the named item is, or where it
is defined, does not matter: `use crate::snapshot::Console` is an edge to snapshot even where
snapshot only re-exports `vm`'s Console (and that re-export is snapshot's own edge to vm).

The crate root's own paths (lib.rs, main.rs) are no module's; test modules (`#[cfg(test)]
mod`, and every module inside one) are not part of the layering, as their code is not part of
the crate a user builds; paths to other crates, doc comments and strings are ignored. It fails on:
- any cycle between top-level modules (two or more that reach one another), in every crate;
- in a crate whose root declares its layers (a doc-comment line
  `//! layers: api > vm > ... > host; leaves: config size ...`, top to bottom), an edge from a
  layer to a layer at or above it, or from a leaf to any layer. A layer may import any layer
  below it and every leaf; a leaf only other leaves (without a cycle). Every top-level module
  must be named once: a module left out, or a name that is no module, is bad input (exit
  status 2).
"""

import os
import re

LAYERS_LINE = re.compile(r"^\s*//!\s*`?layers:\s*([^;`]*);\s*leaves:\s*([^`]*)`?\s*$")


class LayerError(Exception):
    """The layers line of a crate root cannot be read (a name twice, or no such module)."""


def read_layers(root_file, modules):
    """(rank by module, leaves) from the crate root's layers line, or None without one. The
    top layer has rank 0."""
    with open(root_file, encoding="utf-8") as f:
        lines = [LAYERS_LINE.match(line) for line in f]
    found = [m for m in lines if m]
    if not found:
        return None
    if len(found) > 1:
        raise LayerError(f"{root_file}: more than one `layers:` line")
    layers = [name.strip() for name in found[0].group(1).split(">")]
    leaves = found[0].group(2).split()
    named = layers + leaves
    for name in named:
        if named.count(name) > 1:
            raise LayerError(f"{root_file}: layers line names {name} twice")
        if name not in modules:
            raise LayerError(f"{root_file}: layers line names {name}, which is no module of "
                             "the crate root: fix the line")
    for name in sorted(modules):
        if name not in named:
            raise LayerError(f"{root_file}: module {name} is in no layer of the layers line: "
                             "place it")
    return {name: rank for rank, name in enumerate(layers)}, set(leaves)


def top_module(module):
    """The name of the top-level module that `module` is in (None for the crate root)."""
    if module.parent is None:
        return None
    while module.parent.parent is not None:
        module = module.parent
    return module.name


def named_top_module(module, segs):
    """The top-level module that the path `segs`, written in `module`, names, or None."""
    root = module.root()
    if not segs:
        return None
    if segs[0] == "crate":
        current, rest = root, list(segs[1:])
    elif segs[0] in ("self", "super"):
        current, rest = module, list(segs)
        while rest and rest[0] in ("self", "super"):
            if rest.pop(0) == "super":
                if current.parent is None:
                    return None
                current = current.parent
    elif module.parent is None:
        current, rest = root, list(segs)
    else:
        return None  # a child, an imported name (its `use` is the edge) or another crate
    if current is not root:
        return top_module(current)
    return rest[0] if rest and rest[0] in root.children else None


def module_edges(crate):
    """{module: {module it imports: [(file, line, path written), ...]}} of a Crate."""
    graph = {name: {} for name in crate.root.children}
    for module in crate.modules():
        source = top_module(module)
        if source is None or module.test:
            continue
        for line, segs, glob in module.refs + module.reexport_refs:
            dest = named_top_module(module, segs)
            if dest is not None and dest != source:
                text = "::".join(segs) + ("::*" if glob else "")
                graph[source].setdefault(dest, []).append((module.file, line, text))
    return graph


def upward_edges(graph, layers):
    """(source, dest, why) for every edge the layer order forbids."""
    rank, leaves = layers
    out = []
    for source in sorted(graph):
        for dest in sorted(graph[source]):
            if dest in leaves:
                continue
            elif source in leaves:
                why = f"the leaf {source} imports the layer {dest}"
            elif rank[dest] <= rank[source]:
                why = f"{source} imports {dest}, a layer above it"
            else:
                continue
            out.append((source, dest, why))
    return out


def check_modules(crate, crate_root, root, out, strongly_connected):
    """Prints the module-level cycles and upward imports of a crate (a check_cycles.Crate read
    from crate_root), paths relative to root; returns their number."""
    layers = read_layers(crate_root, crate.root.children)
    graph = module_edges(crate)

    def rel(f):
        return os.path.relpath(f, root)

    crate_dir = rel(os.path.dirname(crate_root))

    def where(a, b):
        file, line, text = graph[a][b][0]
        more = len(graph[a][b]) - 1
        tail = f" (+{more} more)" if more else ""
        return f"{rel(file)}:{line} {text}{tail}"

    bad = 0
    for comp in strongly_connected(graph):
        bad += 1
        print(f"module cycle in {crate_dir}: {', '.join(comp)}", file=out)
        for a in comp:
            for b in sorted(graph[a]):
                if b in comp:
                    print(f"  {a} -> {b}: {where(a, b)}", file=out)
    for a, b, why in upward_edges(graph, layers) if layers else []:
        bad += 1
        print(f"upward import in {crate_dir}: {why}: {where(a, b)}", file=out)
    return bad
