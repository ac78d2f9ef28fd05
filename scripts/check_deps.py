#!/usr/bin/env python3
"""CI lint: the module dependency rule of kvtrim, and no policy-name strings below the registry.

Part 1, the include rule.  Every *.h, *.cc, *.cu and *.cuh file under the top-level source
folders (SOURCE_FOLDERS, and any other top-level folder that is not hidden, build*,
.venv or gpu_bundle; build*, .venv and gpu_bundle folders are skipped at any depth) belongs
to one module, given by the most specific entry of
MODULE_RULES that matches its path.  Each quoted include (#include "x/y.h") whose first path
component is one of our folders is resolved to a module with the same table and must be one
of the modules the including file's module may include.  Angle includes, and quoted ones of
third-party code (absl/, grpcpp/, gtest/, hwy/, nlohmann/, prometheus/, ...), are ignored;
so are includes relative to the file's own folder (their first component is no module
folder).  Generated protobuf headers are included as "kvtrim/v1/..." or "grpc/health/v1/...":
such an include is the module "proto" when it names a file under proto/ or ends in ".pb.h"
(any other "kvtrim/..." include is reported as missing; other "grpc/..." ones are the gRPC
library and ignored).

  - Applications (libkvtrim/, tools/, fuzz/, tests/, any */bench/ folder, the main.cc of
    each program, and test code anywhere) may include anything.
  - Test code (tests/..., *_test.cc, *_test.cu, *test_util*.h, *_test_data.h,
    *_test_layer.h) may be included only by applications ("library includes test code").
  - A scanned file that matches no entry is itself a violation ("unknown module: add it to
    the rule table"), as is an include of a path that does not exist in the tree ("includes
    a missing file"), except for generated headers: any missing *.pb.h, and the paths in
    GENERATED.

Part 2, no string compare of a policy name below the registry.  The policy names (scorers,
allocators and presets) are read from kernels/builtin_policies.cc (`s.name = "snapkv";`,
`a.name = "uniform";`, `AddPreset({"pyramidkv", ...})`, `PolicyPreset{"...", ...}`); fewer
than MIN_POLICY_NAMES found is an error (exit 2).  In every library (non-test,
non-application) file of the modules kernels* and service, except the registry itself
(REGISTRY_FILES), a line is reported when a quoted policy name is
  - an operand of == or != (either side) AND the other operand is an identifier chain
    (a, a.b, a->b, a::b, optionally followed by "()") whose text contains "name", "policy",
    "scorer", "allocator" or "preset" (case-insensitive) or that ends in ".name".  This
    heuristic keeps out parameter values that happen to equal a policy name (e.g. "uniform"
    or "random" as a parameter value: `p.Text("mode") == "random"` is not reported), at
    the price of missing compares against an anonymous expression;
  - an argument of .compare(, StartsWith( or EqualsIgnoreCase( (reported whatever the other
    operand is: these calls are rare enough to read);
  - a case label.
Likewise, a line that reads a parameter's text (`params.Text("gqa")`, a member call of
Text) is reported, unless it only passes the text on as a value (`ParamValue::Text(...)` on
the same line): below the registry an enum parameter is read as its typed enum
(`params.Enum<LaProxGqa>("gqa")`, kernels/scorer_params.h), never parsed or compared.
Part 3, a table scorer lives in its files.  A table scorer (ScorerKind::kTable) is a file
kernels/cpu/scorers/<name>.cc, a file kernels/gpu/scorers/<name>.cu and its registry entry
(docs/architecture.md, "Adding a scorer").  For every such <name> (test files aside):
  - both files must exist ("has a CPU file but no GPU file", or the reverse);
  - <name> must be a policy name of the registry ("registers no scorer of the registry");
  - its quoted name may appear in library files of kernels* and service only in those two
    files and the registry (REGISTRY_FILES): anywhere else, the scorer is special-cased
    outside its files ("names table scorer ... outside its files").

Comments are blanked before every check (string literals are kept), so a commented-out
include or a policy name in a comment is never reported.

Output: one line per violation, `path:line: <module> may not include "<header>" (<rule>)`
(or `path:line: <module> compares policy name "<name>" as a string (<rule>)`), then a
summary; exit 1.  When clean: one summary line (files scanned, includes checked), exit 0.
Exit 2: the lint cannot run (kernels/builtin_policies.cc missing, or too few names in it).

Usage:
  scripts/check_deps.py [--root DIR]     lint the tree (default root: the repo root)
  scripts/check_deps.py --list-rules     print the module table and exit 0
  scripts/check_deps.py --self-test      lint a small temporary tree and check the findings
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# --- The rule table ----------------------------------------------------------------------

ANY = frozenset({"*"})  # "may include anything": applications
KERNELS_BASE = frozenset({"base", "formats", "version", "kernels", "kernels.decide"})
EVERY_KERNELS = KERNELS_BASE | {"kernels.cpu", "kernels.gpu", "kernels.lukv"}


@dataclass(frozen=True)
class Rule:
    """One entry of MODULE_RULES: the module a path belongs to and what it may include."""

    module: str  # module name, as used in the `allowed` sets and in the messages
    allowed: frozenset  # modules this one may include (ANY: anything)
    root_only: bool = False  # a folder key matching only files directly in the folder
    test_code: bool = False  # test code: only applications may include it


# Keys: a folder prefix ending in "/" (matches every file below it, or only the files
# directly in it when root_only), an exact file path, or a glob with "*" (fnmatch, where "*"
# also matches "/").  The most specific match wins: exact file, then glob, then the longest
# folder prefix.  Keep the table whole: a source file matching no key is a violation.
MODULE_RULES: dict[str, Rule] = {
    # The dtype vocabulary and its conversions, the status macros: the bottom of the graph.
    "base/": Rule("base", frozenset({"base"})),
    # Readers of .npy / safetensors / other file formats.
    "formats/": Rule("formats", frozenset({"base", "formats"})),
    # The public contract (kvtrim/v1 helpers beside the generated protobuf code).
    "proto/": Rule("proto", frozenset({"proto"})),
    # Release version and git commit of the build.
    "version/": Rule("version", frozenset({"version"})),
    # Policy-independent decisions: budgets, protection, selection.
    "kernels/decide/": Rule("kernels.decide", KERNELS_BASE),
    # The CPU backend.
    "kernels/cpu/": Rule("kernels.cpu", KERNELS_BASE | {"kernels.cpu"}),
    # The CUDA backend.
    "kernels/gpu/": Rule("kernels.gpu", KERNELS_BASE | {"kernels.gpu"}),
    # LU-KV profiles (built on the CPU scorers).
    "kernels/lukv/": Rule("kernels.lukv", KERNELS_BASE | {"kernels.cpu", "kernels.lukv"}),
    # Root files of kernels/: tensors, registry, engine.  Not its sub-folders.
    "kernels/": Rule("kernels", KERNELS_BASE, root_only=True),
    # The kvtrimd library: contract + every kernel module.
    "service/": Rule("service", EVERY_KERNELS | {"proto", "service"}),
    # The client library: talks to kvtrimd only through the contract.
    "client/": Rule("client", frozenset({"base", "formats", "version", "proto", "client"})),
    # Programs at the top of the graph: may include anything.
    "libkvtrim/": Rule("libkvtrim", ANY),  # the C API shared library (in-process kvtrimd)
    "tools/": Rule("tools", ANY),  # developer tools
    "fuzz/": Rule("fuzz", ANY),  # fuzz targets
    "tests/": Rule("tests", ANY, test_code=True),  # integration, oracle and GPU tests
    "*/bench/*": Rule("bench", ANY),  # benchmarks, in any */bench/ folder
    "service/main.cc": Rule("service.main", ANY),  # kvtrimd
    "client/cli/main.cc": Rule("client.cli.main", ANY),  # the kvtrim CLI
    "client/loadgen/main.cc": Rule("client.loadgen.main", ANY),  # kvtrim_loadgen
    # Test code anywhere (unit tests and their helpers).
    "*_test.cc": Rule("test", ANY, test_code=True),  # unit tests
    "*_test.cu": Rule("test", ANY, test_code=True),  # CUDA unit tests
    "*test_util*.h": Rule("test", ANY, test_code=True),  # test helpers (*_test_util.h too)
    "*_test_data.h": Rule("test", ANY, test_code=True),  # test fixtures
    "*_test_layer.h": Rule("test", ANY, test_code=True),  # test layers
}

# Top-level folders of our modules (those that do not exist are skipped).  Every other
# top-level folder that is not hidden or skipped is scanned too: C++ sources in one are in no
# module and reported, so that a new top-level folder must be added to MODULE_RULES.
SOURCE_FOLDERS = ("base", "formats", "proto", "version", "kernels", "service", "client",
                  "libkvtrim", "tools", "fuzz", "tests")
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")
# Folders never scanned: build trees, virtual environments, the GPU wheel bundle.
SKIPPED_DIR_GLOBS = ("build*", ".venv", "gpu_bundle", ".git")
# First include components of the generated protobuf headers (proto/ is on the include path).
PROTO_INCLUDE_ROOTS = ("kvtrim", "grpc")
# Generated headers (written into a build tree) included by a module path.  version/'s
# generated kvtrim_git_commit.h is included by its bare name, so it is no module path and
# needs no entry; the generated *.pb.h are recognised by their suffix.
GENERATED: frozenset[str] = frozenset()

# Part 2: the registry and where the names are read.
POLICY_SOURCE = "kernels/builtin_policies.cc"
REGISTRY_FILES = frozenset({"kernels/builtin_policies.cc", "kernels/registry.cc"})
MIN_POLICY_NAMES = 5
GUARDED_MODULE_PREFIXES = ("kernels", "service")  # kernels, kernels.*, service
POLICY_OPERAND_WORDS = ("name", "policy", "scorer", "allocator", "preset")
POLICY_RULE = "string compare of a policy name below the registry"
# The folders of the table scorers' files, CPU and GPU, and their extensions (Part 3).
TABLE_SCORER_FOLDERS = (("kernels/cpu/scorers/", ".cc"), ("kernels/gpu/scorers/", ".cu"))
TABLE_RULE = "a table scorer is its CPU file, its GPU file and its registry entry"
PARAM_TEXT_RULE = "enum parameters are read as typed enums below the registry"
# A member call of Text (a parameter's text), and the pass-through that may contain one.
PARAM_TEXT_READ = re.compile(r"[\w)\]]\s*(?:\.|->)\s*Text\s*\(")
PARAM_TEXT_PASSED_ON = re.compile(r"\bParamValue\s*::\s*Text\s*\(")

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


@dataclass(frozen=True)
class Violation:
    """One finding, printed as `path:line: message`."""

    path: str
    line: int
    message: str

    # Formats the violation as one output line.
    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


# --- Module lookup -----------------------------------------------------------------------


# Returns how specific `key` is when it matches `path` (higher wins), or None if no match.
def match_specificity(key: str, rule: Rule, path: str) -> int | None:
    if "*" in key:
        return 1_000_000 if fnmatch.fnmatchcase(path, key) else None
    if not key.endswith("/"):
        return 2_000_000 if path == key else None
    if not path.startswith(key):
        return None
    if rule.root_only and "/" in path[len(key):]:
        return None
    return len(key)


# Returns the rule of the module that a repo-relative path belongs to, or None if unknown
# (also for any path outside SOURCE_FOLDERS, so that a test file in a new folder is caught).
def rule_for(path: str) -> Rule | None:
    if path.split("/", 1)[0] not in SOURCE_FOLDERS:
        return None
    best: tuple[int, Rule] | None = None
    for key, rule in MODULE_RULES.items():
        score = match_specificity(key, rule, path)
        if score is not None and (best is None or score > best[0]):
            best = (score, rule)
    return best[1] if best else None


# Returns whether a rule describes an application (a program that may include anything).
def is_application(rule: Rule) -> bool:
    return rule.allowed == ANY


# Describes what a module may include, for the violation message.
def allowed_text(rule: Rule) -> str:
    if not rule.allowed:
        return f"{rule.module} may include nothing of ours"
    return f"{rule.module} may include only {', '.join(sorted(rule.allowed))}"


# --- Source reading ----------------------------------------------------------------------


# Blanks C/C++ comments, keeping string/char literals, line breaks and so line numbers.
def strip_comments(text: str) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:end]))
            i = end
        elif c == '"' and re.search(r"(?:^|[^\w])(?:u8|u|U|L)?R$", text[max(0, i - 3):i]):
            raw = re.match(r'"([^()\\\s]{0,16})\(', text[i:])
            if not raw:
                out.append(c)
                i += 1
                continue
            close = ")" + raw.group(1) + '"'
            end = text.find(close, i + raw.end())
            end = n if end < 0 else end + len(close)
            out.append(text[i:end])
            i = end
        elif c == "'" and i > 0 and text[i - 1].isdigit():
            out.append(c)  # a digit separator (1'000), not a character literal
            i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            end = min(j + 1, n)
            out.append(text[i:end])
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


# Reads a source file as text with its comments blanked.
def read_source(path: Path) -> str:
    return strip_comments(path.read_text(encoding="utf-8", errors="replace"))


# Returns whether a folder name is one that is never scanned.
def is_skipped_dir(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for glob in SKIPPED_DIR_GLOBS)


# Returns the top-level folders to scan: the module folders, and any other top-level folder
# that is not hidden or skipped (its sources then are in no module: a new folder is caught).
def scanned_top_folders(root: Path) -> list[str]:
    others = sorted(entry.name for entry in root.iterdir()
                    if entry.is_dir() and entry.name not in SOURCE_FOLDERS
                    and not entry.name.startswith(".") and not is_skipped_dir(entry.name))
    return [top for top in SOURCE_FOLDERS if (root / top).is_dir()] + others


# Returns the repo-relative paths of every source file to scan, sorted.
def source_files(root: Path) -> list[str]:
    found: list[str] = []
    for top in scanned_top_folders(root):
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = [d for d in dirnames if not is_skipped_dir(d)]
            for name in filenames:
                if name.endswith(SOURCE_SUFFIXES):
                    found.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(found)


# --- Part 1: includes --------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a quoted include resolves to."""

    rule: Rule | None  # the included file's module (None: unknown module)
    missing: bool  # the file does not exist in the tree (and is not a generated header)


# Resolves a quoted include to its module; None when it is not one of our headers.
def resolve_include(root: Path, header: str) -> Target | None:
    first = header.split("/", 1)[0]
    if first in PROTO_INCLUDE_ROOTS:
        if (root / "proto" / header).is_file() or header.endswith(".pb.h"):
            return Target(MODULE_RULES["proto/"], missing=False)
        if first == "grpc":
            return None  # the gRPC library's own headers
        return Target(MODULE_RULES["proto/"], missing=True)
    if first not in SOURCE_FOLDERS:
        return None
    exists = (root / header).is_file()
    generated = header.endswith(".pb.h") or header in GENERATED
    return Target(rule_for(header), missing=not exists and not generated)


# Checks one include of a file of module `rule`; returns the violation or None.
def check_include(rule: Rule, path: str, line: int, header: str,
                  target: Target) -> Violation | None:
    # Builds the violation of this include with the rule it breaks.
    def violation(why: str) -> Violation:
        return Violation(path, line, f'{rule.module} may not include "{header}" ({why})')

    if target.missing:
        return violation("includes a missing file")
    if target.rule is None:
        return violation("unknown module: add it to the rule table")
    if target.rule.test_code and not is_application(rule):
        return violation("library includes test code")
    if is_application(rule) or target.rule.module in rule.allowed:
        return None
    return violation(allowed_text(rule))


# --- Part 2: policy names ----------------------------------------------------------------


class SetupError(Exception):
    """The lint cannot run on this tree (exit 2): e.g. the policy names cannot be read."""


# Reads the policy names (scorers, allocators, presets) registered in builtin_policies.cc.
def read_policy_names(root: Path) -> set[str]:
    source = root / POLICY_SOURCE
    if not source.is_file():
        raise SetupError(f"{POLICY_SOURCE} not found under {root}")
    text = read_source(source)
    names = set(re.findall(r'\b\w+\s*(?:\.|->)\s*name\s*=\s*"([^"]+)"', text))
    names |= set(re.findall(r'\bAddPreset\s*\(\s*(?:PolicyPreset\s*)?\{\s*"([^"]+)"', text))
    names |= set(re.findall(r'\bPolicyPreset\s*(?:\w+\s*)?=?\s*[{(]\s*"([^"]+)"', text))
    if len(names) < MIN_POLICY_NAMES:
        raise SetupError(f"found only {len(names)} policy names in "
                         f"{POLICY_SOURCE} ({sorted(names)}); has its syntax changed? "
                         f"Update read_policy_names().")
    return names


# Returns whether a file's policy-name compares are checked (library code below the registry).
def is_guarded(rule: Rule, path: str) -> bool:
    return (not is_application(rule) and path not in REGISTRY_FILES
            and rule.module.split(".")[0] in GUARDED_MODULE_PREFIXES)


# Returns whether an operand of ==/!= looks like a policy name (see the module docstring).
def names_a_policy(operand: str) -> bool:
    lowered = operand.lower()
    return (any(word in lowered for word in POLICY_OPERAND_WORDS)
            or re.search(r"(?:\.|->)name(?:\(\))?$", operand) is not None)


# An operand of ==/!=: an identifier chain (a, a.b, a->b, a::b), optionally called with "()".
OPERAND = r"[A-Za-z_]\w*(?:\s*(?:\.|->|::)\s*[A-Za-z_]\w*)*(?:\s*\(\s*\))?"
# The text before a literal that is an argument of an open compare call (nested "(...)" ok).
COMPARE_CALL_OPEN = (r"(?:\.\s*compare|\bStartsWith|\bEqualsIgnoreCase)\s*\("
                     r"(?:[^()]|\([^()]*\))*$")


# Returns the policy names that one (comment-free) line compares as strings.
def policy_compares(line: str, names: set[str]) -> list[str]:
    found: list[str] = []
    for literal in re.finditer(r'"((?:[^"\\]|\\.)*)"', line):
        name = literal.group(1)
        if name not in names:
            continue
        before, after = line[:literal.start()], line[literal.end():]
        left = re.search(rf"({OPERAND})\s*[=!]=\s*$", before)
        right = re.match(rf"\s*[=!]=\s*({OPERAND})", after)
        compared = (left is not None and names_a_policy(left.group(1))) or (
            right is not None and names_a_policy(right.group(1)))
        call = re.search(COMPARE_CALL_OPEN, before)
        case_label = re.search(r"\bcase\s*$", before) and re.match(r"\s*:", after)
        if compared or call or case_label:
            found.append(name)
    return found


# --- The scan ----------------------------------------------------------------------------


@dataclass
class Report:
    """What a scan found."""

    violations: list[Violation]
    files_scanned: int = 0
    includes_checked: int = 0
    policy_names: int = 0


# Returns {name: [its files]} of the table scorers' files among `paths` (tests aside).
def table_scorer_files(paths: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in paths:
        for folder, extension in TABLE_SCORER_FOLDERS:
            rest = path[len(folder):]
            if (path.startswith(folder) and "/" not in rest and rest.endswith(extension)
                    and not rest.endswith("_test" + extension)):
                found.setdefault(rest[:-len(extension)], []).append(path)
    return found


# Returns the file-level violations of Part 3 (a missing twin, an unregistered name).
def table_scorer_violations(files: dict[str, list[str]], names: set[str]) -> list[Violation]:
    violations = []
    for name, paths in sorted(files.items()):
        for folder, extension in TABLE_SCORER_FOLDERS:
            twin = folder + name + extension
            if twin not in paths:
                violations.append(Violation(
                    paths[0], 1, f'table scorer "{name}" has no {twin} ({TABLE_RULE})'))
        if name not in names:
            violations.append(Violation(
                paths[0], 1, f'table scorer "{name}" registers no scorer of the registry '
                f"({TABLE_RULE})"))
    return violations


# Lints the tree under `root`: returns every violation and the counts.
def scan(root: Path) -> Report:
    names = read_policy_names(root)
    report = Report(violations=[], policy_names=len(names))
    paths = source_files(root)
    table_files = table_scorer_files(paths)
    report.violations.extend(table_scorer_violations(table_files, names))
    for path in paths:
        report.files_scanned += 1
        rule = rule_for(path)
        if rule is None:
            report.violations.append(Violation(
                path, 1, "file is in no module (unknown module: add it to the rule table)"))
            continue
        guarded = is_guarded(rule, path)
        for number, line in enumerate(read_source(root / path).splitlines(), start=1):
            include = INCLUDE_RE.match(line)
            if include:
                target = resolve_include(root, include.group(1))
                if target is not None:
                    report.includes_checked += 1
                    found = check_include(rule, path, number, include.group(1), target)
                    if found:
                        report.violations.append(found)
                continue
            if guarded:
                for name in policy_compares(line, names):
                    report.violations.append(Violation(
                        path, number,
                        f'{rule.module} compares policy name "{name}" as a string '
                        f"({POLICY_RULE})"))
                if PARAM_TEXT_READ.search(line) and not PARAM_TEXT_PASSED_ON.search(line):
                    report.violations.append(Violation(
                        path, number, f"{rule.module} reads a parameter's text "
                        f"({PARAM_TEXT_RULE})"))
                for name in re.findall(r'"([a-z][a-z0-9_]*)"', line):
                    if name in table_files and path not in table_files[name]:
                        report.violations.append(Violation(
                            path, number, f'{rule.module} names table scorer "{name}" '
                            f"outside its files ({TABLE_RULE})"))
    return report


# Prints the module table (for --list-rules).
def print_rules() -> None:
    width = max(len(key) for key in MODULE_RULES)
    for key, rule in MODULE_RULES.items():
        if is_application(rule):
            allowed = "anything (application)"
        else:
            allowed = ", ".join(sorted(rule.allowed)) or "nothing of ours"
        notes = (" [root files only]" if rule.root_only else "") + (
            " [test code]" if rule.test_code else "")
        print(f"{key:<{width}}  {rule.module:<20} may include: {allowed}{notes}")


# --- Self-test ---------------------------------------------------------------------------


# Builds a small tree, lints it and asserts the exact findings; raises AssertionError if not.
def self_test() -> None:
    files = {
        "kernels/builtin_policies.cc": (
            's.name = "snapkv";\ns.name = "h2o";\na.name = "uniform";\n'
            'a.name = "pyramid";\nregistry->AddPreset({"pyramidkv", "d", "snapkv", '
            '"pyramid"});\n'),
        "kernels/registry.cc": 'bool IsSnap(const Spec& s) { return s.name == "snapkv"; }\n',
        "kernels/registry.h": '#include "base/status_macros.h"\n',
        "base/status_macros.h": "#include <string>\n",
        "kernels/cpu/select.h": '#include "kernels/registry.h"\n',
        "client/cli.cc": ('#include "client/cli.h"\n#include "kernels/cpu/select.h"\n'
                          '#include "absl/strings/str_cat.h"\n'
                          '#include "kvtrim/v1/kvtrim.pb.h"\n'),
        "client/cli.h": "// header\n",
        "client/cli_test.cc": '#include "kernels/cpu/select.h"\n#include "tests/util.h"\n',
        "service/helper_test_util.h": "// test helper\n",
        "service/core.cc": ('#include "service/helper_test_util.h"\n'
                            '#include "kernels/gone.h"\n'
                            '// #include "client/cli.h" is commented out\n'
                            'if (allocator.name == "uniform") {}\n'
                            'if (p.Text("mode") == "uniform") {}\n'
                            'const bool l1 = "l1" != params.Text("norm");\n'
                            'out.push_back(ParamValue::Text(p.Text("gqa")));\n'
                            'if ("h2o" != spec->scorer) {}\n'
                            "// policy_name == \"snapkv\" in a comment\n"),
        "tests/util.h": '#include "client/cli.h"\n',
        "newtop/x.h": "// a new top-level folder missing from the table\n",
        "kernels/newdir/y.h": "// a kernels sub-folder missing from the table\n",
        "build/kernels/z.h": "// not scanned\n",
        "kernels/build-gpu/w.h": '#include "client/cli.h"\n',
        "kernels/cpu/scorers/h2o.cc": 'void R(T& t) { t.Register("h2o", {}); }\n',
        "kernels/cpu/scorers/h2o_test.cc": 'auto* s = Find("h2o");\n',
        "kernels/gpu/scorers/h2o.cu": 'void R(T& t) { t.Register("h2o", {}); }\n',
        "kernels/cpu/scorers/lonely.cc": "// no twin, no registry entry\n",
        "kernels/gpu/runtime/plan.cc": 'auto* s = Find("h2o");  // "h2o" special-cased\n',
    }
    expected = [
        'kernels/cpu/scorers/lonely.cc:1: table scorer "lonely" has no '
        f"kernels/gpu/scorers/lonely.cu ({TABLE_RULE})",
        'kernels/cpu/scorers/lonely.cc:1: table scorer "lonely" registers no scorer of the '
        f"registry ({TABLE_RULE})",
        'client/cli.cc:2: client may not include "kernels/cpu/select.h" '
        "(client may include only base, client, formats, proto, version)",
        'kernels/gpu/runtime/plan.cc:1: kernels.gpu names table scorer "h2o" outside its '
        f"files ({TABLE_RULE})",
        "kernels/newdir/y.h:1: file is in no module (unknown module: add it to the rule table)",
        "newtop/x.h:1: file is in no module (unknown module: add it to the rule table)",
        'service/core.cc:1: service may not include "service/helper_test_util.h" '
        "(library includes test code)",
        'service/core.cc:2: service may not include "kernels/gone.h" (includes a missing file)',
        'service/core.cc:4: service compares policy name "uniform" as a string '
        f"({POLICY_RULE})",
        f"service/core.cc:5: service reads a parameter's text ({PARAM_TEXT_RULE})",
        f"service/core.cc:6: service reads a parameter's text ({PARAM_TEXT_RULE})",
        'service/core.cc:8: service compares policy name "h2o" as a string '
        f"({POLICY_RULE})",
        f'service/core.cc:8: service names table scorer "h2o" outside its files ({TABLE_RULE})',
    ]
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        for relative, text in files.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(text, encoding="utf-8")
        report = scan(root)
        found = [str(v) for v in report.violations]
        assert found == expected, "self-test: got\n  " + "\n  ".join(found)
        assert report.files_scanned == 18, report.files_scanned
        assert report.policy_names == 5, report.policy_names
    assert rule_for("kernels/bench/x.cc").module == "bench"
    assert rule_for("kernels/cpu/fast/a.h").module == "kernels.cpu"
    assert rule_for("kernels/lukv/lukv_test_util.h").test_code
    assert rule_for("client/loadgen/main.cc").module == "client.loadgen.main"
    assert rule_for("kernels/engine.h").module == "kernels"
    assert rule_for("newtop/x.h") is None
    assert rule_for("newtop/x_test.cc") is None
    assert policy_compares('if (x.compare("snapkv") == 0)', {"snapkv"}) == ["snapkv"]
    assert policy_compares('case "snapkv":', {"snapkv"}) == ["snapkv"]
    assert policy_compares('StartsWith(mode, "snapkv")', {"snapkv"}) == ["snapkv"]
    assert policy_compares('f("snapkv")', {"snapkv"}) == []
    assert strip_comments('a = R"(// x)"; // y') == 'a = R"(// x)";     '
    assert strip_comments("n = 1'000; /* c */ '\\'';") == "n = 1'000;         '\\'';"
    print("check_deps: self-test passed")


# --- Main --------------------------------------------------------------------------------


# Parses the command line, runs the lint and returns the exit status.
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Fail when a #include crosses kvtrim's module dependency rule, or when "
                    "code below the policy registry compares policy names as strings.")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="repository root (default: the parent of this script's folder)")
    parser.add_argument("--list-rules", action="store_true",
                        help="print the module table and exit")
    parser.add_argument("--self-test", action="store_true",
                        help="lint a small temporary tree and check the findings")
    args = parser.parse_args(argv)
    if args.list_rules:
        print_rules()
        return 0
    if args.self_test:
        self_test()
        return 0
    try:
        report = scan(args.root.resolve())
    except SetupError as error:
        print(f"check_deps: error: {error}", file=sys.stderr)
        return 2
    for violation in report.violations:
        print(violation)
    summary = (f"{report.files_scanned} files scanned, {report.includes_checked} includes "
               f"checked, {report.policy_names} policy names guarded")
    if report.violations:
        print(f"check_deps: FAILED: {len(report.violations)} violation(s); {summary}")
        return 1
    print(f"check_deps: OK: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
