#!/usr/bin/python3
"""Every file, function and type that docs/architecture.md names must exist where it says.

The page walks through the code naming files and functions; code moves, and a walk that
names what is no longer there misleads whoever reads it next to the code.  The page's
notation, inside backticks, one name per span:

  `dir/file.rs`                 a file (or `dir/`) from the repository's root: it exists
  `dir/file.rs::name`           a Rust fn, struct, enum, trait, type, const, static, mod or
                                macro_rules! defined in that file, not as a method
  `dir/file.rs::Type::name`     a method of `impl Type` (or `impl Trait for Type`), a
                                method of `trait Type`, a variant of `enum Type` or a field
                                of `struct Type`, defined in that file
  `dir/file.c::name`            (or .h) a C function, struct, union, enum, #define or
                                initialised variable defined in that file

Any other span with `::` in it is an error: a name without its file would escape the check.
The Rust sources are read as rustfmt leaves them (a block closes at its opening line's
indentation), the C sources as the kernel's style leaves them (definitions at column 0).
The page must also stay under 2,500 words (as `wc -w` counts them): it is a map.

    tests/host/architecture-walk.py [DOC]    (default: docs/architecture.md)
    tests/host/architecture-walk.py --self-test   (a page with wrong names is refused)

Prints one line per name and ends with "architecture-walk: N passed, M failed"; exits 1
when M > 0.
"""

import os
import re
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUITE = "architecture-walk"
MAX_WORDS = 2500

SPAN = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]*)+$")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
QUALIFIED = re.compile(rf"^([A-Za-z0-9_./-]+\.(rs|c|h))::({IDENT})(::({IDENT}))?$")

RUST_ITEM = (
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:(?:const|async|unsafe|extern\s+\"C\")\s+)*"
    r"(?:fn|struct|enum|trait|type|const|static|mod|union)\s+{}\b"
)
RUST_MACRO = r"^\s*macro_rules!\s+{}\b"
BLOCK = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+)?(impl|trait|enum|struct)\b(.*)$")


def strip_generics(s):
    """`s` without its <...> parts."""
    out, depth = [], 0
    for c in s:
        if c == "<":
            depth += 1
        elif c == ">" and depth:
            depth -= 1
        elif not depth:
            out.append(c)
    return "".join(out)


def rust_blocks(lines):
    """(kind, name, first, last) of every impl, trait, enum and struct block."""
    blocks = []
    for i, line in enumerate(lines):
        m = BLOCK.match(line)
        if not m:
            continue
        indent, kind = m.group(1), m.group(2)
        # The header runs to the line that opens the block.
        j, header = i, m.group(3)
        while not lines[j].rstrip().endswith("{"):
            if lines[j].rstrip().endswith(";") or j + 1 == len(lines):
                break
            j += 1
            header += " " + lines[j].strip()
        if not lines[j].rstrip().endswith("{"):
            continue
        header = strip_generics(header.rsplit("{", 1)[0]).split(" where ")[0].strip()
        if kind == "impl":
            header = header.split(" for ")[-1].strip()
            name = header.split("::")[-1].strip()
        else:
            name = header.split()[0] if header.split() else ""
        name = re.match(r"[A-Za-z0-9_]*", name.lstrip("&*").replace("mut ", "")).group(0)
        end = j + 1
        while end < len(lines) and lines[end].rstrip() != indent + "}":
            end += 1
        blocks.append((kind, name, j + 1, end))
    return blocks


def rust_defines(text, name, member):
    lines = text.split("\n")
    blocks = rust_blocks(lines)
    if member is None:
        inside = set()
        for kind, _, first, last in blocks:
            if kind in ("impl", "trait"):
                inside.update(range(first, last))
        item = re.compile(RUST_ITEM.format(re.escape(name)))
        macro = re.compile(RUST_MACRO.format(re.escape(name)))
        return any(
            (item.match(l) or macro.match(l)) and i not in inside for i, l in enumerate(lines)
        )
    fn = re.compile(RUST_ITEM.format(re.escape(member)))
    # a variant (`Name,` `Name(..)` `Name {`) or a field (`name: T`)
    variant = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?" + re.escape(member) + r"\b\s*([,({:]|$)")
    for kind, block, first, last in blocks:
        if block != name:
            continue
        depth = len(lines[first - 1]) - len(lines[first - 1].lstrip()) + 4
        for l in lines[first:last]:
            if len(l) - len(l.lstrip()) != depth:
                continue
            if kind in ("impl", "trait") and fn.match(l):
                return True
            if kind in ("enum", "struct") and variant.match(l):
                return True
    return False


def c_defines(text, name):
    n = re.escape(name)
    patterns = [
        # a function: its definition starts at column 0 and its body follows the parameters
        r"^(?![#/\s])[^\n;{}]*\b" + n + r"\s*\([^;{]*\)\s*\{",
        r"^(?:struct|union|enum)\s+" + n + r"\s*\{",
        r"^#define\s+" + n + r"\b",
        r"^(?![#/\s])[^\n;(]*\b" + n + r"\s*(?:\[[^\]]*\])?\s*=",
    ]
    return any(re.search(p, text, re.M) for p in patterns)


def names(doc_text):
    """The checkable spans of the page, in order, each once."""
    seen = []
    for m in SPAN.finditer(doc_text):
        s = m.group(1).strip()
        if ("::" in s or PATH.match(s)) and s not in seen:
            seen.append(s)
    return seen


def problem(span):
    """What is wrong with `span`, or None."""
    if "::" not in span:
        return None if os.path.exists(os.path.join(REPO, span)) else "no such file"
    m = QUALIFIED.match(span)
    if not m:
        return "a name without its file (write it as path/file.rs::name)"
    path, ext, name, member = m.group(1), m.group(2), m.group(3), m.group(5)
    full = os.path.join(REPO, path)
    if not os.path.isfile(full):
        return "no such file: " + path
    with open(full, encoding="utf-8") as f:
        text = f.read()
    if ext == "rs":
        if rust_defines(text, name, member):
            return None
        what = f"{name}::{member}" if member else name
        return f"{path} does not define {what}"
    if member is not None:
        return "a C name has no member part"
    return None if c_defines(text, name) else f"{path} does not define {name}"


def run(doc):
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    passed = failed = 0
    for span in names(text):
        p = problem(span)
        if p is None:
            print(f"{SUITE}: ok   {span}")
            passed += 1
        else:
            print(f"{SUITE}: FAIL {span}: {p}")
            failed += 1
    words = len(text.split())
    if words < MAX_WORDS:
        print(f"{SUITE}: ok   {words} words, under {MAX_WORDS}")
        passed += 1
    else:
        print(f"{SUITE}: FAIL {words} words, not under {MAX_WORDS}")
        failed += 1
    print(f"{SUITE}: {passed} passed, {failed} failed")
    return failed


def self_test():
    """Each kind of wrong name is refused, and the right ones beside them are not."""
    right = [
        "liburdma/src/engine/work.rs",
        "liburdma/src/engine/work.rs::Engine::post_send",
        "liburdma/src/data_verbs.rs::post_send",
        "liburdma/src/engine.rs::Flow::transmit",
        "liburdma/src/dpdk.rs::DpdkFlow::transmit",
        "urdmad/src/cm.rs::Action::HandOver",
        "kmod/urdma_iwcm.c::urdma_connect",
        "kmod/urdma_main.c::urdma_dev_ops",
        "kmod/urdma-abi.h::urdma_cm_msg",
    ]
    wrong = [
        "liburdma/src/nowhere.rs",
        "liburdma/src/engine.rs::post_send",  # a method, not a free function
        "liburdma/src/engine/work.rs::Engine::no_such_fn",
        "liburdma/src/dpdk.rs::Flow::transmit",  # the trait is in engine.rs
        "urdmad/src/cm.rs::Action::NoSuchVariant",
        "kmod/urdma_cm.c::urdma_no_such_function",
        "Engine::post_send",  # no file
    ]
    with tempfile.TemporaryDirectory() as d:
        doc = os.path.join(d, "page.md")
        with open(doc, "w", encoding="utf-8") as f:
            f.write(" ".join(f"`{s}`" for s in right + wrong) + "\n")
        print(f"{SUITE}: the self-test's page:")
        sys.stdout.flush()
        got = run(doc)
    refused = [s for s in right + wrong if problem(s) is not None]
    ok = refused == wrong and got == len(wrong)
    if ok:
        print(f"self-test: ok: {len(wrong)} wrong names refused, {len(right)} right ones kept")
    else:
        print(f"self-test: FAIL: refused {refused}, expected {wrong}")
    return 0 if ok else 1


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: tests/host/architecture-walk.py [DOC] | --self-test", file=sys.stderr)
        return 2
    doc = args[0] if args else os.path.join(REPO, "docs", "architecture.md")
    if not os.path.isfile(doc):
        print(f"{SUITE}: no such page: {doc}", file=sys.stderr)
        return 2
    return 1 if run(doc) else 0


if __name__ == "__main__":
    sys.exit(main())
