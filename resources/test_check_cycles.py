#!/usr/bin/env python3
"""Tests of check_cycles.py and check_layers.py on small crates written to a temporary
directory: each tree with a cycle (or an import up its layers) must fail and name the files,
each without must pass. Ends with a cargo-style
`test result:` line so that .ci/run counts these tests with the others."""

import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_cycles  # noqa: E402


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def run_check(files, allow=()):
    """(number of cycles not allowed, printed report) of the crate `files` (paths under src/)."""
    with tempfile.TemporaryDirectory() as root:
        write_tree(root, {os.path.join("src", k): v for k, v in files.items()})
        out = io.StringIO()
        bad = check_cycles.check([os.path.join(root, "src")], list(allow), root, out)
        return bad, out.getvalue()


# A module whose mod.rs defines the error its child returns, and calls that child.
PARENT_CHILD = {
    "lib.rs": "pub mod api;\n",
    "api/mod.rs": """
        pub mod server;
        /// The error.
        pub enum ApiError { Bad }
        pub fn serve() -> Result<(), ApiError> { server::run() }
    """,
    "api/server.rs": """
        use super::ApiError;
        pub fn run() -> Result<(), ApiError> { Err(ApiError::Bad) }
    """,
}

# The same with the error in a file of its own, re-exported by mod.rs.
PARENT_CHILD_FIXED = {
    "lib.rs": "pub mod api;\n",
    "api/mod.rs": """
        mod error;
        pub mod server;
        pub use error::ApiError;
        pub fn serve() -> Result<(), ApiError> { server::run() }
    """,
    "api/error.rs": "/// The error.\npub enum ApiError { Bad }\n",
    # Through the parent's re-export: a dependency on error.rs, not on mod.rs.
    "api/server.rs": """
        use crate::api::ApiError;
        pub fn run() -> Result<(), ApiError> { Err(ApiError::Bad) }
        #[cfg(test)]
        mod tests {
            use super::*;
            #[test]
            fn fails() { assert!(run().is_err()); }
        }
    """,
}


class CheckCycles(unittest.TestCase):
    def test_a_child_importing_from_the_parent_that_calls_it_is_a_cycle(self):
        bad, report = run_check(PARENT_CHILD)
        self.assertEqual(bad, 1, report)
        self.assertIn("cycle: src/api/mod.rs, src/api/server.rs", report)
        self.assertIn("src/api/server.rs:2 uses src/api/mod.rs: super::ApiError", report)
        self.assertIn("src/api/mod.rs:5 uses src/api/server.rs: server::run", report)

    def test_the_same_tree_with_the_shared_item_moved_out_passes(self):
        bad, report = run_check(PARENT_CHILD_FIXED)
        self.assertEqual((bad, report), (0, ""))

    def test_a_crate_path_to_an_item_of_the_parent_is_a_cycle(self):
        files = dict(PARENT_CHILD)
        files["api/server.rs"] = "pub fn run() -> Result<(), crate::api::ApiError> { todo() }\n"
        bad, report = run_check(files)
        self.assertEqual(bad, 1, report)
        self.assertIn("crate::api::ApiError", report)

    def test_a_path_in_an_attribute_is_a_use(self):
        files = dict(PARENT_CHILD_FIXED)
        files["api/error.rs"] = '#[derive(Debug)]\npub enum ApiError { #[error("{}", super::server::MAX)] Bad }\n'
        files["api/server.rs"] += "pub const MAX: u32 = 1;\n"
        bad, report = run_check(files)
        self.assertEqual(bad, 1, report)
        self.assertIn("src/api/error.rs:2 uses src/api/server.rs: super::server::MAX", report)

    def test_a_re_export_alone_is_no_dependency_of_the_file_that_writes_it(self):
        files = {
            "lib.rs": "pub mod lapic;\n",
            "lapic/mod.rs": "mod access;\npub use access::is_msr;\npub struct Lapic;\n",
            "lapic/access.rs": "use super::Lapic;\npub fn is_msr(_: &Lapic) -> bool { true }\n",
        }
        bad, report = run_check(files)
        self.assertEqual((bad, report), (0, ""))
        # ... but the code of that file naming what it re-exports is.
        files["lapic/mod.rs"] += "pub fn msr(l: &Lapic) -> bool { is_msr(l) }\n"
        bad, report = run_check(files)
        self.assertEqual(bad, 1, report)
        self.assertIn("src/lapic/mod.rs:4 uses src/lapic/access.rs: is_msr", report)

    def test_siblings_that_use_each_other_are_a_cycle(self):
        bad, report = run_check({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "pub fn f() { crate::b::g() }\n",
            "b.rs": "use super::a::{self};\npub fn g() {}\npub fn h() { a::f() }\n",
        })
        self.assertEqual(bad, 2, report)  # the files' cycle, and the same as modules'
        self.assertIn("cycle: src/a.rs, src/b.rs", report)
        self.assertIn("src/b.rs:3 uses src/a.rs: a::f", report)
        self.assertIn("module cycle in src: a, b", report)

    def test_one_way_use_comments_strings_and_other_crates_are_no_cycle(self):
        bad, report = run_check({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": """
                use std::sync::Arc;
                /// See [`crate::b::g`].
                pub fn f() -> &'static str { let _ = Arc::new(1); "crate::b::g()" }
            """,
            "b.rs": "pub fn g() -> char { crate::a::f(); '\\'' }\n",
        })
        self.assertEqual((bad, report), (0, ""))

    def test_a_test_module_in_its_own_file_may_use_its_parent(self):
        bad, report = run_check({
            "lib.rs": "mod lapic;\n",
            "lapic/mod.rs": "#[cfg(test)]\n#[path = \"lapic_tests.rs\"]\nmod tests;\npub struct Lapic;\n",
            "lapic/lapic_tests.rs": "use super::*;\nfn t() { let _ = Lapic; }\n",
        })
        self.assertEqual((bad, report), (0, ""))

    def test_a_glob_of_the_parent_that_the_parent_uses_is_a_cycle(self):
        bad, report = run_check({
            "lib.rs": "mod m;\n",
            "m/mod.rs": "mod c;\npub struct S;\npub fn f() { c::g() }\n",
            "m/c.rs": "use super::*;\npub fn g() { let _ = S; }\n",
        })
        self.assertEqual(bad, 1, report)
        self.assertIn("src/m/c.rs:1 uses src/m/mod.rs: super::*", report)

    def test_a_cycle_in_an_allowed_directory_is_reported_but_passes(self):
        bad, report = run_check(PARENT_CHILD, allow=["src/api"])
        self.assertEqual(bad, 0, report)
        self.assertIn("allowed cycle: src/api/mod.rs, src/api/server.rs", report)
        bad, _ = run_check(PARENT_CHILD, allow=["src/api/server"])
        self.assertEqual(bad, 1)

    def test_an_allow_list_entry_must_name_a_module_and_is_reported_once_clean(self):
        with self.assertRaises(check_cycles.InputError):
            run_check(PARENT_CHILD, allow=["src/apii"])
        bad, report = run_check(PARENT_CHILD_FIXED, allow=["src/api"])
        self.assertEqual(bad, 0, report)
        self.assertIn("allow-list entry src/api has no cycle left: delete it", report)

    def test_a_module_without_its_file_is_an_error(self):
        with self.assertRaises(check_cycles.InputError):
            run_check({"lib.rs": "mod missing;\n"})


# Modules a and b import each other, but b names a's item through a's `pub use` of c's: the
# file-level check follows that to c.rs and sees no cycle.
THROUGH_REEXPORT = {
    "lib.rs": "mod a;\nmod b;\nmod c;\n",
    "a.rs": "pub use crate::c::Item;\npub fn f() { crate::b::g() }\n",
    "b.rs": "use crate::a::Item;\npub fn g() { let _ = Item; }\n",
    "c.rs": "pub struct Item;\n",
}

# A crate with declared layers: top > bottom, and a leaf any layer may use.
LAYERED = {
    "lib.rs": "//! `layers: top > bottom; leaves: leaf`\nmod bottom;\nmod leaf;\nmod top;\n",
    "top/mod.rs": "mod run;\npub struct Top;\n",
    "top/run.rs": "use crate::bottom::Bottom;\nuse super::super::leaf::Leaf;\n",
    "bottom/mod.rs": """
        mod inner;
        pub struct Bottom;
        #[cfg(test)]
        mod tests {
            use crate::top::Top;
        }
    """,
    "bottom/inner.rs": "use crate::leaf::Leaf;\n",
    "leaf.rs": "pub struct Leaf;\n",
}


class CheckModules(unittest.TestCase):
    def test_modules_that_import_each_other_through_a_re_export_are_a_cycle(self):
        bad, report = run_check(THROUGH_REEXPORT)
        self.assertEqual(bad, 1, report)
        self.assertNotIn("\ncycle:", "\n" + report)  # no file-level cycle
        self.assertIn("module cycle in src: a, b", report)
        self.assertIn("  a -> b: src/a.rs:2 crate::b::g", report)
        self.assertIn("  b -> a: src/b.rs:1 crate::a::Item", report)
        # With the item imported from where it is defined, the modules form no cycle.
        files = dict(THROUGH_REEXPORT, **{"b.rs": "use crate::c::Item;\npub fn g() {}\n"})
        self.assertEqual(run_check(files), (0, ""))

    def test_a_re_export_is_an_edge_of_the_module_that_writes_it(self):
        files = dict(THROUGH_REEXPORT)
        files["c.rs"] = "pub use crate::a::f;\npub struct Item;\n"
        files["b.rs"] = "pub fn g() {}\n"
        bad, report = run_check(files)
        self.assertEqual(bad, 1, report)
        self.assertIn("module cycle in src: a, c", report)
        self.assertIn("  c -> a: src/c.rs:1 crate::a::f", report)

    def test_imports_down_the_layers_and_of_leaves_pass_and_test_modules_are_not_layered(self):
        self.assertEqual(run_check(LAYERED), (0, ""))

    def test_an_import_up_a_layer_fails(self):
        files = dict(LAYERED, **{"top/run.rs": "use super::super::leaf::Leaf;\n"})
        files["bottom/inner.rs"] = "use super::super::top::Top;\n"
        bad, report = run_check(files)
        self.assertEqual(bad, 1, report)
        self.assertIn("upward import in src: bottom imports top, a layer above it: "
                      "src/bottom/inner.rs:1 super::super::top::Top", report)
        # A re-export up a layer is one too.
        files["bottom/inner.rs"] = "pub use crate::top::Top;\n"
        bad, report = run_check(files)
        self.assertEqual(bad, 1, report)
        self.assertIn("bottom imports top, a layer above it: src/bottom/inner.rs:1 "
                      "crate::top::Top", report)

    def test_a_leaf_that_imports_a_layer_fails(self):
        files = dict(LAYERED, **{"leaf.rs": "pub struct Leaf(crate::bottom::Bottom);\n"})
        files["bottom/inner.rs"] = ""
        bad, report = run_check(files)
        self.assertEqual(bad, 1, report)
        self.assertIn("upward import in src: the leaf leaf imports the layer bottom: "
                      "src/leaf.rs:1 crate::bottom::Bottom", report)

    def test_every_module_must_be_placed_in_the_layers_line(self):
        files = dict(LAYERED, **{"lib.rs": LAYERED["lib.rs"] + "mod extra;\n", "extra.rs": ""})
        with self.assertRaisesRegex(check_cycles.InputError, "module extra is in no layer"):
            run_check(files)
        files = dict(LAYERED, **{"lib.rs": LAYERED["lib.rs"].replace("leaf`", "leaf gone`")})
        with self.assertRaisesRegex(check_cycles.InputError, "names gone, which is no module"):
            run_check(files)


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    failed = len(result.failures) + len(result.errors)
    passed = result.testsRun - failed - len(result.skipped)
    status = "ok" if result.wasSuccessful() else "FAILED"
    print(f"test result: {status}. {passed} passed; {failed} failed; "
          f"{len(result.skipped)} ignored (resources/test_check_cycles.py)")
    sys.exit(0 if result.wasSuccessful() else 1)
