#!/usr/bin/python3
"""Every program that our scripts and tests call must come from scripts/setup.

A fresh Debian 12 machine runs `scripts/setup` and then `scripts/test`; a program that a
script calls but that setup does not install works on a developer's machine (where someone
installed it by hand) and fails on the fresh one.  This test finds those calls first.

What is scanned: every shell script under scripts/, tests/ (also tests/vm/run-all and other
files with a shell #!), kmod/tests/*.sh, .ci/run; and in the Rust tests (*/tests/**/*.rs)
the literal programs of Command::new("X"), sh(&["X", ...]) and "netns", "exec", NS, "X".  Shell is parsed by shfmt (a real parser: quotes, heredocs,
comments and $(...) are understood), and a command is looked for behind the wrappers that
run one: timeout, stdbuf, env, sudo, exec, nice, nohup, setsid, xargs, command, `ip netns
exec NS`, `bash -c STRING`, `trap STRING`, and our own shell functions that run "$@": the
arguments they `shift` away before running "$@" are skipped (WRAPPERS below overrides that
count where counting shifts would be wrong).

Each external program must be, after `command -v` and `dpkg -S` on its path:
  - in a package that scripts/setup installs (its `packages=(...)` list) or one of their
    Depends/Pre-Depends, recursively (not Recommends: a machine may not install those);
  - in a package of Debian's base system (Essential: yes, or Priority required/important);
  - or one of the few programs setup provides otherwise (NON_APT below; each is checked
    against the text of scripts/setup; cargo fmt and cargo clippy count as the toolchain's);
  - or called only where the README rules the call out (UNNEEDED: sudo, when not root).
Programs needed indirectly are checked too (INDIRECT: virtme-ng needs a static busybox).

    tests/host/programs.py [ROOT]      (ROOT: the repository; default: this file's)
    tests/host/programs.py --self-test (proves that an unprovided program is caught)

Prints one line per program and ends with "programs: N provided, M not provided";
exits 1 when M > 0.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

PATH = ":".join([
    "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin",
    os.path.expanduser("~/.cargo/bin"),
])

# Shell functions that run their arguments as a command, where the number of leading
# arguments that are not part of the command is not the number of `shift`s before "$@".
WRAPPERS = {
}

# Programs that setup provides without apt: name -> (regex over scripts/setup, what).
NON_APT = {
    "cargo": (r"command -v cargo", "the Rust toolchain check"),
    "rustc": (r"command -v rustc", "the Rust toolchain check"),
    "vng": (r"pipx install virtme-ng", "virtme-ng through pipx"),
}
# Cargo subcommands that come with the toolchain; any other `cargo X` needs a
# `cargo install ... cargo-X` in setup.
CARGO_BUILTIN = {
    "build", "check", "clean", "doc", "fetch", "fix", "run", "test", "bench", "update",
    "install", "uninstall", "metadata", "tree", "package", "publish", "search", "vendor",
    "locate-project", "pkgid", "verify-project", "version", "help", "new", "init", "add",
    "remove", "generate-lockfile", "rustc", "rustdoc", "login", "logout", "owner", "yank",
    "fmt", "clippy", "config",
}
# Programs that are needed without being named in a call: (needed by, program, static?, why)
INDIRECT = [
    ("vng", "busybox", True, "virtme-ng's guest init needs a statically linked busybox"),
    ("vng", "qemu-system-x86_64", False, "virtme-ng boots the guest with qemu"),
]
# Programs a script calls only in a situation that the README rules out: name -> why.
UNNEEDED = {
    "sudo": "scripts/setup calls it only when not run as root; the README runs it as root",
}
# What this test itself runs.
SELF = ["shfmt", "dpkg", "dpkg-query", "apt-cache", "ldd"]

failures = []


def is_at(p):
    return p.get("Type") == "ParamExp" and p.get("Param", {}).get("Value") == "@"


def sh_words(call_args):
    """The words of a CallExpr: a string for a literal word, "$@" for "$@", else None."""
    out = []
    for w in call_args:
        parts = w.get("Parts", [])
        if len(parts) == 1 and (is_at(parts[0]) or (
                parts[0].get("Type") == "DblQuoted" and len(parts[0].get("Parts", [])) == 1
                and is_at(parts[0]["Parts"][0]))):
            out.append("$@")
            continue
        s = ""
        for p in parts:
            t = p.get("Type")
            if t in ("Lit", "SglQuoted"):
                s += p.get("Value", "")
            elif t == "DblQuoted" and all(q.get("Type") == "Lit" for q in p.get("Parts", [])):
                s += "".join(q.get("Value", "") for q in p.get("Parts", []))
            else:
                s = None
                break
        out.append(s)
    return out


def parse_shell(text, origin):
    r = subprocess.run(["shfmt", "--tojson"], input=text, capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{origin}: shfmt cannot parse it: {r.stderr.strip()}")
        return None
    return json.loads(r.stdout)


def skip_opts(words, i, with_arg=()):
    """Skips options starting at i (and the argument of those in with_arg)."""
    while i < len(words) and words[i] is not None and words[i].startswith("-") and words[i] != "-":
        if words[i] == "--":
            return i + 1
        i += 2 if words[i] in with_arg else 1
    return i


class Scanner:
    def __init__(self):
        self.calls = {}        # program -> set of "file:line"
        self.functions = set()
        self.runs_args = {}    # function name -> arguments shifted away before it runs "$@"
        self.shifts = {}       # function name -> shifts seen so far while walking it
        self.record = True     # the first pass only learns runs_args
        self.cargo_subcommands = {}

    def add(self, prog, where):
        if not self.record:
            return
        self.calls.setdefault(prog, set()).add(where)

    def scan_text(self, text, origin):
        tree = parse_shell(text, origin)
        if tree is not None:
            self.walk(tree, origin, None)

    def walk(self, node, origin, func):
        if isinstance(node, list):
            for n in node:
                self.walk(n, origin, func)
            return
        if not isinstance(node, dict):
            return
        t = node.get("Type")
        if t == "FuncDecl":
            name = node["Name"]["Value"]
            self.functions.add(name)
            self.walk(node.get("Body"), origin, name)
            return
        if t == "CallExpr" and node.get("Args"):
            line = node["Pos"]["Line"]
            self.call(sh_words(node["Args"]), f"{origin}:{line}", origin, func)
        for k, v in node.items():
            if isinstance(v, (dict, list)):
                self.walk(v, origin, func)

    def call(self, words, where, origin, func):
        if not words:
            return
        w = words[0]
        if w is None:
            return
        if w == "$@":
            if func is not None:
                self.runs_args.setdefault(func, self.shifts.get(func, 0))
            # "$@" may be empty (or a prefix such as env X=1): what follows may be the command.
            self.call(words[1:], where, origin, func)
            return
        if w == "shift" and func is not None:
            n = words[1] if len(words) > 1 else "1"
            self.shifts[func] = self.shifts.get(func, 0) + (int(n) if n and n.isdigit() else 1)
        self.add(w, where)
        rest = None
        if w == "timeout":
            i = skip_opts(words, 1, ("-k", "-s", "--kill-after", "--signal"))
            rest = words[i + 1:]
        elif w == "stdbuf":
            rest = words[skip_opts(words, 1, ("-i", "-o", "-e")):]
        elif w == "sudo":
            rest = words[skip_opts(words, 1, ("-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U")):]
        elif w == "env":
            i = skip_opts(words, 1, ("-u", "-C", "-S"))
            while i < len(words) and words[i] is not None and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
                i += 1
            rest = words[i:]
        elif w == "exec":
            rest = words[skip_opts(words, 1, ("-a",)):]
        elif w == "nice":
            rest = words[skip_opts(words, 1, ("-n",)):]
        elif w in ("nohup", "setsid", "builtin"):
            rest = words[skip_opts(words, 1):]
        elif w == "xargs":
            rest = words[skip_opts(words, 1, ("-n", "-I", "-P", "-L", "-d", "-s", "-E", "-a")):]
        elif w == "command":
            if len(words) > 1 and words[1] in ("-v", "-V"):
                return
            rest = words[skip_opts(words, 1):]
        elif w == "ip":
            # ip [-n NS | other options] netns exec NS CMD...
            if len(words) > 4 and words[1] == "netns" and words[2] == "exec":
                rest = words[4:]
        elif w in ("bash", "sh"):
            i = skip_opts(words, 1, ("-c", "-o", "+o"))
            if "-c" in [x for x in words[1:i] if x is not None] and i < len(words) + 1:
                idx = words.index("-c")
                if idx + 1 < len(words) and words[idx + 1] is not None:
                    self.scan_text(words[idx + 1], f"{where} ({w} -c)")
        elif w == "trap":
            if len(words) > 1 and words[1] is not None and words[1] != "-":
                self.scan_text(words[1], f"{where} (trap)")
        elif w == "cargo":
            sub = words[skip_opts(words, 1):][:1]
            if sub and sub[0] is not None and sub[0] not in CARGO_BUILTIN:
                self.cargo_subcommands.setdefault(sub[0], set()).add(where)
        elif w in WRAPPERS:
            rest = words[1 + WRAPPERS[w]:]
        elif w in self.runs_args:
            rest = words[1 + self.runs_args[w]:]
        if rest:
            self.call(rest, where, origin, func)


def shell_files(root):
    files = set()
    for pattern in ["scripts/*", "tests/**/*", "kmod/tests/*.sh", ".ci/run"]:
        for f in glob.glob(os.path.join(root, pattern), recursive=True):
            if not os.path.isfile(f):
                continue
            if f.endswith(".sh"):
                files.add(f)
                continue
            try:
                with open(f, "rb") as fh:
                    first = fh.readline(200)
            except OSError:
                continue
            if re.match(rb"^#!.*\b(ba)?sh\b", first):
                files.add(f)
    return sorted(files)


def rust_calls(root, scanner):
    for f in sorted(glob.glob(os.path.join(root, "*/tests/**/*.rs"), recursive=True)):
        with open(f, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                for rx in (r'Command::new\(\s*"([^"/]+)"\s*\)',   # Command::new("ip")
                           r'\bsh\(&\[\s*"([^"/]+)"',               # sh(&["ip", ...])
                           r'"netns",\s*"exec",\s*[^,]+,\s*"([^"/]+)"'):  # ip netns exec NS X
                    for m in re.finditer(rx, line):
                        scanner.add(m.group(1), f"{os.path.relpath(f, root)}:{n}")


def setup_packages(setup_text):
    m = re.search(r"^packages=\((.*?)^\)", setup_text, re.S | re.M)
    if not m:
        failures.append("scripts/setup: no packages=( ... ) list found")
        return []
    body = re.sub(r"#.*", "", m.group(1))
    return body.split()


def closure(packages):
    r = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--installed", "--no-recommends", "--no-suggests",
         "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + packages,
        capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
    names = set(packages)
    for line in r.stdout.splitlines():
        if line and not line[0].isspace() and not line.startswith("<"):
            names.add(line.strip().split(":")[0])
    return names


def base_system():
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Essential}\t${Priority}\n"],
                       capture_output=True, text=True)
    base = set()
    for line in r.stdout.splitlines():
        f = line.split("\t")
        if len(f) == 3 and (f[1] == "yes" or f[2] in ("required", "important")):
            base.add(f[0])
    return base


def path_variants(p):
    out = [p]
    real = os.path.realpath(p)
    for q in (p, real):
        for a, b in (("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/"), ("/bin/", "/usr/bin/"),
                     ("/sbin/", "/usr/sbin/")):
            if q.startswith(a):
                out.append(b + q[len(a):])
        out.append(q)
    seen = []
    for q in out:
        if q not in seen:
            seen.append(q)
    return seen


def owner(path):
    """The Debian package that ships path (or the program it resolves to)."""
    for q in path_variants(path):
        r = subprocess.run(["dpkg", "-S", q], capture_output=True, text=True,
                           env=dict(os.environ, LC_ALL="C"))
        for line in r.stdout.splitlines():
            if line.startswith("diversion "):
                continue
            pkgs, _, file = line.partition(": ")
            if file.strip() == q:
                return pkgs.split(",")[0].strip().split(":")[0]
    return None


def is_static(path):
    r = subprocess.run(["ldd", path], capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
    text = r.stdout + r.stderr
    return "not a dynamic executable" in text or "statically linked" in text


def check(root):
    with open(os.path.join(root, "scripts/setup"), encoding="utf-8") as fh:
        setup_text = fh.read()
    scanner = Scanner()
    files = shell_files(root)
    texts = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            texts.append((fh.read(), os.path.relpath(f, root)))
    # First pass: which functions run their arguments; second: every call.
    scanner.record = False
    for text, origin in texts:
        scanner.scan_text(text, origin)
    scanner.record = True
    scanner.shifts = {}
    for text, origin in texts:
        scanner.scan_text(text, origin)
    rust_calls(root, scanner)
    for p in SELF:
        scanner.add(p, "tests/host/programs.py")

    for fn, skip in sorted(scanner.runs_args.items()):
        print(f"note {fn}: a function that runs its arguments after the first "
              f"{WRAPPERS.get(fn, skip)} as a command")

    builtins = set(subprocess.run(["bash", "-c", "compgen -b; compgen -k"], capture_output=True,
                                  text=True).stdout.split())
    pkgs = setup_packages(setup_text)
    allowed = closure(pkgs)
    base = base_system()
    provided = 0
    not_provided = 0

    def verdict(prog, where, need_static=False):
        nonlocal provided, not_provided
        if prog in NON_APT:
            regex, what = NON_APT[prog]
            if re.search(regex, setup_text):
                print(f"ok   {prog:24} {what}")
                provided += 1
                return True
            print(f"FAIL {prog:24} called at {where}: scripts/setup no longer provides it ({what})")
            not_provided += 1
            return False
        if prog in UNNEEDED:
            print(f"ok   {prog:24} not needed: {UNNEEDED[prog]}")
            provided += 1
            return True
        if "/" in prog:
            candidates = [prog] if os.path.exists(prog) else []
        else:
            candidates = [os.path.join(d, prog) for d in PATH.split(":")
                          if os.path.isfile(os.path.join(d, prog)) and os.access(os.path.join(d, prog), os.X_OK)]
        if not candidates:
            print(f"FAIL {prog:24} called at {where}: not installed here, and scripts/setup installs "
                  f"no package that provides it")
            not_provided += 1
            return False
        # A copy installed by hand (e.g. in /usr/local/bin) may shadow the packaged one that a
        # fresh machine would run: judge the first copy that belongs to a package.
        path, pkg = candidates[0], None
        for c in candidates:
            pkg = owner(c)
            if pkg is not None:
                path = c
                break
        if pkg is None:
            print(f"FAIL {prog:24} called at {where}: {path} belongs to no Debian package "
                  f"(installed by hand?): scripts/setup does not provide it")
            not_provided += 1
            return False
        if pkg in pkgs:
            why = "setup installs it"
        elif pkg in allowed:
            why = "a dependency of setup's packages"
        elif pkg in base:
            why = "Debian base system"
        else:
            print(f"FAIL {prog:24} called at {where}: {path} is in package {pkg}, which scripts/setup "
                  f"does not install (add {pkg} to its packages list)")
            not_provided += 1
            return False
        if need_static and not is_static(path):
            print(f"FAIL {prog:24} {path} ({pkg}) is dynamically linked; needed statically linked "
                  f"at {where}")
            not_provided += 1
            return False
        print(f"ok   {prog:24} {path} ({pkg}: {why})")
        provided += 1
        return True

    for prog in sorted(scanner.calls):
        where = sorted(scanner.calls[prog])[0]
        if "/" in prog and not prog.startswith("/"):
            continue  # a path inside the repository
        if prog in builtins or prog in scanner.functions:
            continue
        if not re.match(r"^[A-Za-z0-9_./+-]+$", prog):
            continue  # not a command name (e.g. an arithmetic or test word)
        verdict(prog, where)
    for sub, wheres in sorted(scanner.cargo_subcommands.items()):
        where = sorted(wheres)[0]
        if re.search(rf"cargo install\b.*\bcargo-{re.escape(sub)}\b", setup_text):
            print(f"ok   cargo {sub:18} cargo install cargo-{sub} in scripts/setup")
            provided += 1
        else:
            print(f"FAIL cargo {sub:18} called at {where}: scripts/setup does not cargo install cargo-{sub}")
            not_provided += 1
    for needer, prog, static, why in INDIRECT:
        if needer in scanner.calls:
            verdict(prog, f"{why} ({needer})", need_static=static)

    for f in failures:
        print(f"FAIL {f}")
    not_provided += len(failures)
    print(f"scanned {len(files)} shell files")
    print(f"programs: {provided} provided, {not_provided} not provided")
    return not_provided == 0


def self_test():
    """A copy of scripts/setup with a script that calls unprovided programs in every shape
    the scanner follows: each must be reported, and the check must fail."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    shapes = {
        "strace": "strace -c true </dev/null",
        "urdma-no-such-a": 'x=$(timeout -k 5 10 urdma-no-such-a --flag)',
        "urdma-no-such-b": "ip netns exec urdmaA stdbuf -oL urdma-no-such-b",
        "urdma-no-such-c": "bash -c 'urdma-no-such-c | cat'",
        "urdma-no-such-d": "t urdma-no-such-d arg",
        "urdma-no-such-f": "w2 logfile urdma-no-such-f",
        "urdma-no-such-e": "if true; then env A=1 urdma-no-such-e; fi",
        "cargo nosuchsub": "cargo nosuchsub --flag",
    }
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "scripts"))
        shutil.copy(os.path.join(root, "scripts/setup"), os.path.join(tmp, "scripts/setup"))
        with open(os.path.join(tmp, "scripts/scratch"), "w") as fh:
            fh.write("#!/usr/bin/env bash\nt() { timeout 5 \"$@\"; }\n"
                     "w2() { local f=$1; shift; t \"$@\" >\"$f\"; }\n# strace in a comment is no call\n"
                     "echo 'strace in a string is no call'\n" + "\n".join(shapes.values()) + "\n")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), tmp], capture_output=True, text=True)
        print(r.stdout, end="")
        ok = r.returncode == 1
        for prog in shapes:
            hit = [line for line in r.stdout.splitlines() if line.startswith("FAIL " + prog + " ")]
            print(f"self-test: {prog}: {'reported' if hit else 'NOT REPORTED'}")
            ok = ok and bool(hit)
        if r.returncode != 1:
            print(f"self-test: the check exited {r.returncode}, not 1")
        print(f"self-test: {'ok' if ok else 'FAILED'}")
        return ok


def main():
    if shutil.which("shfmt", path=PATH) is None:
        print("FAIL shfmt is not installed (scripts/setup installs it)")
        return 1
    if sys.argv[1:] == ["--self-test"]:
        return 0 if self_test() else 1
    root = sys.argv[1] if len(sys.argv) > 1 else \
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return 0 if check(os.path.abspath(root)) else 1


if __name__ == "__main__":
    sys.exit(main())
